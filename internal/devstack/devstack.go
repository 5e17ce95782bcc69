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
	"os"
	"path/filepath"
	"strings"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/controller/hostconfig"
	"github.com/berth-ci/berth/internal/testground/caasstandin"
	"github.com/berth-ci/berth/internal/testground/controlplane"
	"github.com/berth-ci/berth/internal/testground/ec2fake"
	"github.com/berth-ci/berth/internal/testground/spacestandin"
	"github.com/berth-ci/berth/internal/testground/sshhosts"
	"github.com/berth-ci/berth/internal/testground/tektonstandin"
	"github.com/berth-ci/berth/internal/testground/vmcloud"
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
	// ClusterServices serves the real space and cluster-template CRDs (../shared/real/crds)
	// and starts the stand-ins of their services, for ephemeral clusters.
	ClusterServices bool
	// BerthBinary, if set, is what steps of berth's image (BerthImage) run as berth, as in the
	// image: the production berth (berth-dev passes bin/berth), not berth-dev. The kubectl
	// of `make testbin` serves steps of KubectlImage.
	BerthBinary string
}

// Stack is a running local stack.
type Stack struct {
	ControlPlane *controlplane.ControlPlane
	Fleet        *sshhosts.Fleet // nil without hosts
	VMCloud      *vmcloud.Cloud  // nil unless Options.VMCloud
	EC2          *ec2fake.Server // the EC2 API stand-in over VMCloud; nil unless Options.VMCloud
	StandIn      *tektonstandin.StandIn
	Spaces       *spacestandin.StandIn // nil unless Options.ClusterServices
	CaaS         *caasstandin.StandIn  // nil unless Options.ClusterServices

	KubeConfigPath string
	AdminKeyPath   string
	KnownHostsPath string

	stopStandIn    context.CancelFunc
	standInDone    chan error
	stopController func() error
	files          []string
	dirs           []string
}

// Up starts the stack. On error, whatever it had started is stopped again.
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
	s = &Stack{}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Down())
			s = nil
		}
	}()

	var cpOpts []controlplane.Option
	if opts.WithoutGarbageCollector {
		cpOpts = append(cpOpts, controlplane.WithoutGarbageCollector())
	}
	if opts.ClusterServices {
		crds, err := clusterCRDs()
		if err != nil {
			return s, err
		}
		cpOpts = append(cpOpts, controlplane.WithCRDs(crds))
	}
	if s.ControlPlane, err = controlplane.Start(cpOpts...); err != nil {
		return s, err
	}
	s.KubeConfigPath = filepath.Join(stateDir, "kubeconfig")
	if err = s.writeFile(s.KubeConfigPath, s.ControlPlane.KubeConfig); err != nil {
		return s, err
	}
	if err = s.ControlPlane.EnsureNamespace(ctx, Namespace); err != nil {
		return s, err
	}
	if err = install(ctx, s.ControlPlane.Client); err != nil {
		return s, fmt.Errorf("installing berth's manifests: %w", err)
	}

	if opts.Hosts > 0 {
		if s.Fleet, err = sshhosts.Start(ctx, opts.Hosts); err != nil {
			return s, err
		}
		if err = s.publishHostAccess(ctx, stateDir); err != nil {
			return s, err
		}
		if opts.VMCloud {
			if err = s.startVMCloud(ctx, opts.VMCloudLog); err != nil {
				return s, err
			}
		}
	}

	if opts.ClusterServices {
		if err = s.startClusterServices(ctx); err != nil {
			return s, err
		}
	}

	images, err := s.stepImages(stateDir, opts.BerthBinary)
	if err != nil {
		return s, err
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
			return s, err
		}
		step := s.StandIn.StepCommand(func(ctx context.Context, args []string) error {
			return opts.HostStep(ctx, append(args, "--kubeconfig", hostStepKubeconfig, "--known-hosts-namespace", Namespace))
		})
		s.StandIn.Register([]string{"berth", "host"}, step) // the step of every Task in config/tasks
	}
	standInCtx, cancel := context.WithCancel(context.Background())
	s.stopStandIn, s.standInDone = cancel, make(chan error, 1)
	go func() { s.standInDone <- s.StandIn.Start(standInCtx, s.ControlPlane.Config) }()
	return s, nil
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

// StartController runs berth's controller as ServiceAccount berth-controller, held to the
// RBAC of config/rbac.
func (s *Stack) StartController(o controller.Options) error {
	if s.stopController != nil {
		return errors.New("the controller is already running")
	}
	o.Namespace = Namespace
	o.Restartable = true
	mgr, err := controller.New(s.ControlPlane.ConfigFor(Namespace, ControllerServiceAccount), o)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	s.stopController = func() error {
		cancel()
		return <-done
	}
	return nil
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
	errs = append(errs, s.StopController())
	if s.stopStandIn != nil {
		s.stopStandIn()
		if err := <-s.standInDone; err != nil && !errors.Is(err, context.Canceled) {
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
	if s.ControlPlane != nil {
		errs = append(errs, s.ControlPlane.Stop())
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

// Describe tells a person how to reach the stack.
func (s *Stack) Describe(w io.Writer) {
	fmt.Fprintf(w, "berth dev stack is up.\n\n")
	fmt.Fprintf(w, "  control plane  kube-apiserver v%s + etcd at %s, Tekton CRDs installed\n", controlplane.KubernetesVersion, s.ControlPlane.Config.Host)
	if s.ControlPlane.CollectsGarbage() {
		fmt.Fprintf(w, "                 kube-controller-manager: garbage collector and namespace controller\n")
	}
	fmt.Fprintf(w, "                 export KUBECONFIG=%s\n", s.KubeConfigPath)
	fmt.Fprintf(w, "                 kubectl get crd\n")
	if s.Fleet != nil {
		fmt.Fprintf(w, "  ssh hosts      admin key in secret %s/%s and %s\n", Namespace, AdminKeySecret, s.AdminKeyPath)
		for _, h := range s.Fleet.Hosts {
			fmt.Fprintf(w, "                 %-14s ssh -i %s -o UserKnownHostsFile=%s root@%s\n", h.Name, s.AdminKeyPath, s.KnownHostsPath, h.Address)
		}
	} else {
		fmt.Fprintf(w, "  ssh hosts      none (--hosts 0)\n")
	}
	if s.VMCloud != nil {
		fmt.Fprintf(w, "  vm cloud       local VM cloud at %s: each VM is a new SSH host booted on demand\n", s.VMCloud.URL())
		fmt.Fprintf(w, "                 EC2 API stand-in at %s over the same VMs (berth reaches it through the AWS SDK)\n", s.EC2.URL())
	}
	scripts := "user TaskRuns' step scripts run as local processes"
	if os.Geteuid() != 0 {
		scripts = "step scripts are not run (needs root); end TaskRuns yourself"
	}
	fmt.Fprintf(w, "  tekton         stand-in resolving TaskRuns and creating their pods; %s\n", scripts)
}
