// Package devstack brings up berth's local stack for `berth dev` (`make run`): a real
// kube-apiserver and etcd with Tekton's CRDs (and kube-controller-manager's garbage collector
// and namespace controller), real SSH hosts in their own network namespaces,
// and the Tekton stand-in that runs TaskRuns. Everything it starts, Down stops; what a killed
// run leaves behind, the next Up clears.
package devstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/dev/testground/caasstandin"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/ec2fake"
	"github.com/berth-ci/berth/internal/dev/testground/realtekton"
	"github.com/berth-ci/berth/internal/dev/testground/spacestandin"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/tektonstandin"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
	"github.com/berth-ci/berth/internal/hostconfig"
)

// Namespace is where berth's controller, its config and the host admin key live.
const Namespace = hostconfig.DefaultNamespace

// AdminKeySecret holds the hosts' admin key (key id_rsa), as an operator would create it.
const AdminKeySecret = "host-admin-key"

// Options shape the stack.
type Options struct {
	// StateDir receives the kubeconfig, the hosts' admin key and known_hosts.
	StateDir string
	// Hosts is how many SSH hosts to start; 0 starts none.
	Hosts int
	// HostStep runs `berth host ...` with args in this process; the stand-in executes the
	// provision, clean and update TaskRuns through it. berth-dev and the stack tests pass
	// the production berth's root command (cli.NewRootCommand).
	HostStep func(ctx context.Context, args []string) error
	// RunScripts selects the user TaskRuns whose step scripts the stand-in runs.
	RunScripts func(*pipelinev1.TaskRun) bool
	// StepOutput, if set, receives the output of the step scripts the stand-in runs.
	StepOutput io.Writer
	// VMCloud starts the local VM cloud (needs Hosts > 0: its VMs take the hosts' admin key).
	VMCloud bool
	// VMCloudLog, if set, hears about the VM cloud's launches, boots and terminations.
	VMCloudLog io.Writer
	// WithoutGarbageCollector runs no kube-controller-manager: for tests that show berth
	// cleans up after itself on a cluster where owner references are not followed.
	WithoutGarbageCollector bool
	// ClusterServices serves the real space and cluster-template CRDs (../shared/real/crds),
	// the eaas Namespace claim's CRD derived from the real XRD there, and starts the stand-ins
	// of their services, for ephemeral clusters.
	ClusterServices bool
	// BerthBinary, if set, is what steps of berth's image (BerthImage) run as berth, as in the
	// image: the production berth (berth-dev passes bin/berth), not berth-dev. The kubectl
	// and yq of `make testbin` serve steps of KubectlImage, OpenShiftCLIImage and
	// TaskRunnerImage.
	BerthBinary string
	// LogDir, if set, keeps the logs of etcd, kube-apiserver and kube-controller-manager
	// (<program>.log), whose last lines then go with their failure.
	LogDir string
	// Progress, if set, hears of each component once it is up.
	Progress func(Step)
	// ControlPlane are further options of the control plane (a test's audit log, say).
	ControlPlane []controlplane.Option
	// RealTekton runs Tekton's own controller and webhook, with kube-scheduler and kwok
	// playing the kubelet (realtekton), in place of the stand-in: no step runs, so HostStep,
	// RunScripts and StepOutput go unused, and berth must work hosts itself (its ssh
	// provisioner). Tekton binds fixed ports: the stack must run in realtekton's network
	// namespace (realtekton.IsolateNetwork).
	RealTekton bool
}

// Step is one component of the stack come up.
type Step struct {
	Component string
	Took      time.Duration
	// Detail says what is up, in a few words.
	Detail string
}

// Stack is a running local stack.
type Stack struct {
	ControlPlane *controlplane.ControlPlane
	Fleet        *sshhosts.Fleet        // nil without hosts
	VMCloud      *vmcloud.Cloud         // nil unless Options.VMCloud
	EC2          *ec2fake.Server        // the EC2 API stand-in over VMCloud; nil unless Options.VMCloud
	StandIn      *tektonstandin.StandIn // nil with Options.RealTekton
	Tekton       *realtekton.Tekton     // nil unless Options.RealTekton
	Spaces       *spacestandin.StandIn  // nil unless Options.ClusterServices
	CaaS         *caasstandin.StandIn   // nil unless Options.ClusterServices

	KubeConfigPath string
	AdminKeyPath   string
	KnownHostsPath string

	// Webhook is where the controller serves berth's admission webhook, which the control
	// plane calls there for every TaskRun created (config/webhook, registered by Up).
	Webhook WebhookServing

	// Supervisor watches every component above and the controller; the first to stop while
	// the stack runs is its failure (see Supervisor.Guard).
	Supervisor *Supervisor

	stopStandIn    context.CancelFunc
	standInDone    chan struct{}
	standInErr     error // once standInDone is closed
	stopController func() error
	files          []string
	dirs           []string
}

// Names of the stack's components in progress lines and failures (ssh hosts are "sshd of
// <host>").
const (
	ControlPlaneComponent    = "control plane"
	ManifestsComponent       = "berth's manifests"
	HostsComponent           = "ssh hosts"
	VMCloudComponent         = "vm cloud"
	EC2Component             = "EC2 stand-in"
	ClusterServicesComponent = "cluster services"
	SpaceStandInComponent    = "space stand-in"
	CaaSStandInComponent     = "CaaS stand-in"
	TektonComponent          = "tekton stand-in"
	RealTektonComponent      = "tekton"
	ControllerComponent      = "berth controller"
)

// Up starts the stack and returns once every component is ready. On error, whatever it had
// started is stopped again; a component that failed is named by a *ComponentError.
func Up(ctx context.Context, opts Options) (s *Stack, err error) {
	stateDir, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, err
	}
	if opts.Hosts > 0 {
		// Checked before the control plane starts so a missing sshd costs no time.
		if err := sshhosts.Prerequisites(); err != nil {
			return nil, fmt.Errorf("SSH hosts: %w (or run with --hosts 0)", err)
		}
	}
	s = &Stack{Supervisor: NewSupervisor()}
	ctx, cancel := s.Supervisor.Guard(ctx)
	defer cancel()
	defer func() {
		if err == nil {
			return
		}
		// A component that stopped is why the step under way failed, not the other way round.
		var failed *ComponentError
		if f := s.Supervisor.Err(); f != nil && !errors.As(err, &failed) {
			err = errors.Join(f, fmt.Errorf("meanwhile: %w", err))
		}
		err = errors.Join(err, s.Down())
		s = nil
	}()
	// step runs one component's start, names it in a failure and tells Progress when it is up.
	step := func(component string, start func() (detail string, err error)) error {
		began := time.Now()
		detail, err := start()
		if err != nil {
			var failed *ComponentError
			if errors.As(err, &failed) {
				return err
			}
			return &ComponentError{Component: component, Err: err}
		}
		if opts.Progress != nil {
			opts.Progress(Step{Component: component, Took: time.Since(began), Detail: detail})
		}
		return nil
	}

	if err = step(ControlPlaneComponent, func() (string, error) { return s.startControlPlane(opts, stateDir) }); err != nil {
		return s, err
	}
	if err = step(ManifestsComponent, func() (string, error) {
		if err := s.ControlPlane.EnsureNamespace(ctx, Namespace); err != nil {
			return "", err
		}
		if err := install(ctx, s.ControlPlane.Client); err != nil {
			return "", err
		}
		webhook, err := s.installWebhook()
		return "RBAC of config/rbac and Tasks of config/tasks in namespace " + Namespace + ", " + webhook, err
	}); err != nil {
		return s, err
	}

	if opts.Hosts > 0 {
		if err = step(HostsComponent, func() (string, error) { return s.startHosts(ctx, opts.Hosts, stateDir) }); err != nil {
			return s, err
		}
		if opts.VMCloud {
			if err = step(VMCloudComponent, func() (string, error) {
				if err := s.startVMCloud(ctx, opts.VMCloudLog); err != nil {
					return "", err
				}
				return "VMs booted on demand at " + s.VMCloud.URL() + ", EC2 API stand-in at " + s.EC2.URL(), nil
			}); err != nil {
				return s, err
			}
		}
	}

	if opts.ClusterServices {
		if err = step(ClusterServicesComponent, func() (string, error) {
			return "space and cluster-template stand-ins", s.startClusterServices(ctx)
		}); err != nil {
			return s, err
		}
	}

	if opts.RealTekton {
		err = step(RealTektonComponent, func() (string, error) { return s.startRealTekton(ctx) })
		return s, err
	}
	err = step(TektonComponent, func() (string, error) { return s.startTekton(ctx, opts, stateDir) })
	return s, err
}

// startControlPlane starts kube-apiserver, etcd and (unless opts say not) kube-controller-
// manager, has the supervisor watch them, and writes the kubeconfig.
func (s *Stack) startControlPlane(opts Options, stateDir string) (string, error) {
	var cpOpts []controlplane.Option
	if opts.WithoutGarbageCollector {
		cpOpts = append(cpOpts, controlplane.WithoutGarbageCollector())
	}
	if opts.ClusterServices {
		crds, err := clusterCRDs()
		if err != nil {
			return "", err
		}
		claims, err := spacestandin.ClaimCRD()
		if err != nil {
			return "", err
		}
		cpOpts = append(cpOpts, controlplane.WithCRDs(crds), controlplane.WithCRDObjects(claims))
	}
	if opts.LogDir != "" {
		cpOpts = append(cpOpts, controlplane.WithLogDir(opts.LogDir))
	}
	if opts.RealTekton {
		tekton, err := realtekton.ControlPlaneOptions()
		if err != nil {
			return "", err
		}
		cpOpts = append(cpOpts, tekton...)
	}
	cpOpts = append(cpOpts, opts.ControlPlane...)
	var err error
	if s.ControlPlane, err = controlplane.Start(cpOpts...); err != nil {
		return "", err
	}
	for _, p := range s.ControlPlane.Processes() {
		s.Supervisor.Watch(Component{Name: p.Name, Done: p.Done(), Exit: p.Err, Log: p.LogPath})
	}
	s.KubeConfigPath = filepath.Join(stateDir, "kubeconfig")
	if err := s.writeFile(s.KubeConfigPath, s.ControlPlane.KubeConfig); err != nil {
		return "", err
	}
	detail := fmt.Sprintf("kube-apiserver v%s + etcd at %s", controlplane.KubernetesVersion, s.ControlPlane.Config.Host)
	if s.ControlPlane.CollectsGarbage() {
		detail += ", kube-controller-manager"
	}
	return detail, nil
}

// startHosts starts the SSH hosts, has the supervisor watch each sshd, and publishes how to
// reach them.
func (s *Stack) startHosts(ctx context.Context, n int, stateDir string) (string, error) {
	var err error
	if s.Fleet, err = sshhosts.Start(ctx, n); err != nil {
		return "", err
	}
	var names []string
	for _, h := range s.Fleet.Hosts {
		s.Supervisor.Watch(Component{Name: "sshd of " + h.Name, Done: h.Exited(),
			Exit: func() error { return errors.New("sshd exited") }, Log: h.LogPath})
		names = append(names, h.Name+" ("+h.Address+")")
	}
	return strings.Join(names, ", "), s.publishHostAccess(ctx, stateDir)
}

// startTekton starts the Tekton stand-in and returns once it watches TaskRuns.
func (s *Stack) startTekton(ctx context.Context, opts Options, stateDir string) (string, error) {
	images, err := s.stepImages(stateDir, opts.BerthBinary)
	if err != nil {
		return "", err
	}
	s.StandIn = tektonstandin.New(tektonstandin.Options{
		Scheme:     controlplane.Scheme(),
		RunScripts: opts.RunScripts,
		WorkDir:    filepath.Join(stateDir, "tekton"),
		StepOutput: opts.StepOutput,
		Images:     images,
	})
	if opts.HostStep != nil {
		hostStepKubeconfig := filepath.Join(stateDir, "host-tasks.kubeconfig")
		if err = s.serviceAccountKubeconfig(hostStepKubeconfig, HostTaskServiceAccount); err != nil {
			return "", err
		}
		step := s.StandIn.StepCommand(func(ctx context.Context, args []string) error {
			return opts.HostStep(ctx, append(args, "--kubeconfig", hostStepKubeconfig, "--known-hosts-namespace", Namespace))
		})
		s.StandIn.Register([]string{"berth", "host"}, step) // the step of every Task in config/tasks
	}
	standInCtx, cancel := context.WithCancel(context.Background())
	s.stopStandIn, s.standInDone = cancel, make(chan struct{})
	go func() {
		s.standInErr = s.StandIn.Start(standInCtx, s.ControlPlane.Config)
		close(s.standInDone)
	}()
	exit := func() error {
		if s.standInErr == nil {
			return errors.New("stopped")
		}
		return s.standInErr
	}
	s.Supervisor.Watch(Component{Name: TektonComponent, Done: s.standInDone, Exit: exit})
	select {
	case <-s.StandIn.Ready():
	case <-s.standInDone:
		return "", exit()
	case <-ctx.Done():
		return "", context.Cause(ctx)
	}
	scripts := "user TaskRuns' step scripts run as local processes"
	if os.Geteuid() != 0 {
		scripts = "step scripts are not run (needs root); end TaskRuns yourself"
	}
	return "resolving TaskRuns and creating their pods; " + scripts, nil
}

// startRealTekton starts Tekton's controller and webhook, kube-scheduler and kwok, and has the
// supervisor watch each.
func (s *Stack) startRealTekton(ctx context.Context) (string, error) {
	var err error
	if s.Tekton, err = realtekton.Start(ctx, s.ControlPlane); err != nil {
		return "", err
	}
	var names []string
	for _, p := range s.Tekton.Processes() {
		s.Supervisor.Watch(Component{Name: p.Name, Done: p.Done(), Exit: p.Err, Log: p.LogPath})
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ") + " (Tekton " + s.Tekton.Version() + "); kwok plays node " + realtekton.NodeName + ", no step runs", nil
}

// publishHostAccess writes the admin key and known_hosts for a person at a shell, and puts the
// admin key in the cluster the way an operator would for berth.
func (s *Stack) publishHostAccess(ctx context.Context, stateDir string) error {
	s.AdminKeyPath = filepath.Join(stateDir, "host-admin-key")
	if err := s.writeFile(s.AdminKeyPath, s.Fleet.AdminKeyPEM); err != nil {
		return err
	}
	var known strings.Builder
	for _, h := range s.Fleet.Hosts {
		fmt.Fprintf(&known, "%s %s", h.Address, ssh.MarshalAuthorizedKey(h.HostKey))
	}
	s.KnownHostsPath = filepath.Join(stateDir, "known_hosts")
	if err := s.writeFile(s.KnownHostsPath, []byte(known.String())); err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: AdminKeySecret, Namespace: Namespace},
		Data:       map[string][]byte{"id_rsa": s.Fleet.AdminKeyPEM},
	}
	if err := s.ControlPlane.Client.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating secret %s/%s: %w", Namespace, AdminKeySecret, err)
	}
	return nil
}

func (s *Stack) writeFile(path string, data []byte) error {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return err
	}
	s.files = append(s.files, path)
	return nil
}

// ControllerReadyTimeout bounds StartController's wait for the controller to be ready.
const ControllerReadyTimeout = 2 * time.Minute

// StartController runs berth's controller as ServiceAccount berth-controller, held to the
// RBAC of config/rbac, and returns once it is ready: it leads (when it elects a leader), its
// caches have synced, its webhook (if it serves one: o.WebhookPort not 0) answers where the
// stack registered it, and its health endpoint (if it serves one) answers. The supervisor
// watches it until StopController. A controller that fails to start or exits before it is
// ready is a *ComponentError.
func (s *Stack) StartController(o controller.Options) error {
	if s.stopController != nil {
		return errors.New("the controller is already running")
	}
	o.Namespace = Namespace
	o.Restartable = true
	if o.WebhookPort != 0 {
		o.WebhookHost, o.WebhookPort, o.WebhookCertDir = s.Webhook.Host, s.Webhook.Port, s.Webhook.CertDir
	}
	mgr, err := controller.New(s.ControlPlane.ConfigFor(Namespace, ControllerServiceAccount), o)
	if err != nil {
		return &ComponentError{Component: ControllerComponent, Err: err}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var exitErr error
	go func() {
		exitErr = mgr.Start(ctx)
		close(done)
	}()
	exit := func() error {
		if exitErr == nil {
			return errors.New("exited")
		}
		return exitErr
	}
	forget := s.Supervisor.Watch(Component{Name: ControllerComponent, Done: done, Exit: exit})
	s.stopController = func() error {
		forget()
		cancel()
		<-done
		return exitErr
	}
	if err := controllerReady(mgr, o.WebhookPort != 0, o.HealthProbeAddress, done, exit); err != nil {
		forget()
		_ = s.StopController() // it has failed already; err says how
		return &ComponentError{Component: ControllerComponent, Err: err}
	}
	return nil
}

// controllerReady waits until mgr leads, its caches have synced, its webhook server (if
// webhook) answers and its health endpoint at healthAddr ("0": none) answers, or it has exited
// (done closed; exit then says why).
func controllerReady(mgr ctrl.Manager, webhook bool, healthAddr string, done <-chan struct{}, exit func() error) error {
	ctx, cancel := context.WithTimeout(context.Background(), ControllerReadyTimeout)
	defer cancel()
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	waiting := "the leader lease"
	notReady := func() error {
		select {
		case <-done:
			return exit()
		default:
			return fmt.Errorf("not ready within %s: still waiting for %s", ControllerReadyTimeout, waiting)
		}
	}
	select {
	case <-mgr.Elected():
	case <-ctx.Done():
		return notReady()
	}
	waiting = "its caches to sync"
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return notReady()
	}
	if webhook {
		// A TaskRun created before the webhook answers would be admitted unpinned.
		waiting = "its webhook server to answer"
		served := mgr.GetWebhookServer().StartedChecker()
		for served(nil) != nil {
			select {
			case <-ctx.Done():
				return notReady()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	url := healthURL(healthAddr)
	if url == "" {
		return nil
	}
	waiting = url + " to answer"
	client := &http.Client{Timeout: time.Second}
	for {
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			waiting = fmt.Sprintf("%s to answer 200 (it answers %s)", url, resp.Status)
		}
		select {
		case <-ctx.Done():
			return notReady()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// healthURL is the readyz endpoint of a health probe bind address, "" when there is none to
// ask (disabled, or a port the kernel picks).
func healthURL(addr string) string {
	if addr == "" || addr == "0" {
		return ""
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "0" {
		return ""
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz"
}

// ControllerKubeconfig writes (once) and returns a kubeconfig that acts as berth's controller
// ServiceAccount, for a controller run as a separate process under the shipped RBAC.
func (s *Stack) ControllerKubeconfig() (string, error) {
	path := filepath.Join(filepath.Dir(s.KubeConfigPath), "controller.kubeconfig")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	return path, s.serviceAccountKubeconfig(path, ControllerServiceAccount)
}

// StopController stops the controller, as a crash or a rollout would.
func (s *Stack) StopController() error {
	if s.stopController == nil {
		return nil
	}
	err := s.stopController()
	s.stopController = nil
	return err
}

// Down stops everything Up started, in reverse order, and removes the files it wrote.
func (s *Stack) Down() error {
	var errs []error
	// With etcd or kube-apiserver dead, every client of the apiserver would wait on it in turn
	// (the controller releasing its lease, the stand-ins their webhooks): it goes first, so
	// that they fail at once.
	controlPlaneFirst := false
	if s.Supervisor != nil {
		s.Supervisor.Stop()
		if f := s.Supervisor.Err(); f != nil && (f.Component == "etcd" || f.Component == "kube-apiserver") {
			controlPlaneFirst = true
			errs = append(errs, s.stopControlPlane())
		}
	}
	errs = append(errs, s.StopController())
	if s.Tekton != nil {
		errs = append(errs, s.Tekton.Stop())
	}
	if s.stopStandIn != nil {
		s.stopStandIn()
		<-s.standInDone
		if err := s.standInErr; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("tekton stand-in: %w", err))
		}
	}
	errs = append(errs, s.stopClusterServices())
	if s.EC2 != nil {
		errs = append(errs, s.EC2.Close())
	}
	if s.VMCloud != nil {
		errs = append(errs, s.VMCloud.Close())
	}
	if s.Fleet != nil {
		errs = append(errs, s.Fleet.Close())
	}
	if !controlPlaneFirst {
		errs = append(errs, s.stopControlPlane())
	}
	for _, f := range s.files {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	for _, d := range s.dirs {
		errs = append(errs, os.RemoveAll(d))
	}
	return errors.Join(errs...)
}

func (s *Stack) stopControlPlane() error {
	if s.ControlPlane == nil {
		return nil
	}
	return s.ControlPlane.Stop()
}

// Describe tells a person how to reach the stack.
func (s *Stack) Describe(w io.Writer) {
	fmt.Fprintf(w, "berth dev stack is up.\n\n")
	fmt.Fprintf(w, "  kubectl        export KUBECONFIG=%s\n", s.KubeConfigPath)
	fmt.Fprintf(w, "                 kubectl get taskruns -A\n")
	if s.Fleet != nil {
		fmt.Fprintf(w, "  ssh hosts      admin key in secret %s/%s and %s\n", Namespace, AdminKeySecret, s.AdminKeyPath)
		for _, h := range s.Fleet.Hosts {
			fmt.Fprintf(w, "                 %-14s ssh -i %s -o UserKnownHostsFile=%s root@%s\n", h.Name, s.AdminKeyPath, s.KnownHostsPath, h.Address)
		}
	} else {
		fmt.Fprintf(w, "  ssh hosts      none (--hosts 0)\n")
	}
	if s.VMCloud != nil {
		fmt.Fprintf(w, "  vm cloud       %s: each VM is a new SSH host booted on demand\n", s.VMCloud.URL())
		fmt.Fprintf(w, "                 EC2 API stand-in at %s over the same VMs (berth reaches it through the AWS SDK)\n", s.EC2.URL())
	}
}
