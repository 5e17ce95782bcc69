//go:build linux

// Package realtekton runs the real Tekton Pipelines controller and webhook against a test
// control plane, with kube-scheduler placing Tekton's pods and kwok playing the kubelet of
// fake nodes, for tests whose question is what Tekton itself does (resolution, retries,
// PipelineRuns, its own writes). All of it is built by `make testbin` from the pinned module in
// hack/tools/tekton, whose config/ (CRDs, config maps, webhook registrations) is read at run
// time: nothing of Tekton's is copied here.
//
// No pod runs: kwok moves each through Pending, Running and Succeeded (or Failed on demand, see
// FailStepAnnotation), and a gate of this package keeps a pod Pending until every Secret it
// mounts exists, as a kubelet would (see MountedSecrets).
//
// Tekton binds fixed ports (its webhook 443, probes, profiling, metrics), so it runs only in a
// network namespace of the test binary's own: use RunTests from TestMain.
package realtekton

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

const (
	tektonPath = "github.com/tektoncd/pipeline"
	// Namespace is where Tekton's configuration lives, as in its release.
	Namespace = "tekton-pipelines"
	// webhookService is the Service Tekton's webhook registrations name.
	webhookService = "tekton-pipelines-webhook"
	// images name what Tekton puts in its pods; none is pulled, so none need exist.
	imagePrefix = "testground.invalid/tekton/"
	startWait   = 2 * time.Minute
	stopWait    = 10 * time.Second
)

// binaries are what Start runs, from controlplane.BinaryDir.
var binaries = []string{"tekton-controller", "tekton-webhook", "kube-scheduler", "kwok"}

// Tekton is a running Tekton controller and webhook, kube-scheduler, kwok and the secret gate.
type Tekton struct {
	client client.Client
	module string // the module's directory
	dir    string
	procs  []*controlplane.Program
	ledger string
	gate   *gate
	stop   context.CancelFunc // the gate's
}

// ModuleDir is the directory of the Tekton module hack/tools/tekton pins (the version `make
// testbin` builds), in the module cache.
func ModuleDir() (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", tektonPath)
	cmd.Dir = filepath.Join(root, "hack", "tools", "tekton")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locating the Tekton module of hack/tools/tekton: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// ControlPlaneOptions are what a control plane needs to serve real Tekton: its CRDs of the
// version that runs (berth's own Tekton module is older), an advertised address in a network
// namespace that has only loopback, and the default ServiceAccount in every namespace, which
// Tekton reads for each TaskRun.
func ControlPlaneOptions() ([]controlplane.Option, error) {
	dir, err := ModuleDir()
	if err != nil {
		return nil, err
	}
	return []controlplane.Option{
		controlplane.WithTektonCRDs(filepath.Join(dir, "config", "300-crds")),
		controlplane.WithAdvertiseAddress("127.0.0.1"),
		controlplane.WithServiceAccounts(),
	}, nil
}

// StartOption is an option of Start.
type StartOption func(*startOptions)

type startOptions struct{ user string }

// AsUser runs Tekton's controller and webhook as a cluster admin of that name, so that the
// apiserver's audit log tells their writes from everyone else's (the bench counts them apart).
func AsUser(name string) StartOption { return func(o *startOptions) { o.user = name } }

// Start configures Tekton in cp (started with ControlPlaneOptions) and starts it, with
// kube-scheduler, kwok and one kwok node (NodeName), and returns once Tekton's webhook defaults
// and validates what is created. Call Stop before stopping cp. It runs only in the network
// namespace of IsolateNetwork.
func Start(ctx context.Context, cp *controlplane.ControlPlane, opts ...StartOption) (_ *Tekton, err error) {
	var o startOptions
	for _, opt := range opts {
		opt(&o)
	}
	if os.Getenv(netnsEnv) != "1" {
		return nil, errors.New("real Tekton binds fixed ports and so runs only in the network namespace IsolateNetwork makes (see RunTests)")
	}
	bins, err := controlplane.BinaryDir()
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, b := range binaries {
		if st, err := os.Stat(filepath.Join(bins, b)); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s missing in %s: run `make testbin` (builds them from the Go module proxy; binaries already there are kept)", strings.Join(missing, ", "), bins)
	}
	module, err := ModuleDir()
	if err != nil {
		return nil, err
	}
	if err := configure(ctx, cp.Client, filepath.Join(module, "config")); err != nil {
		return nil, fmt.Errorf("configuring Tekton from %s: %w", module, err)
	}
	dir, err := controlplane.ProcessDir("tekton")
	if err != nil {
		return nil, err
	}
	t := &Tekton{client: cp.Client, dir: dir, module: module}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.Stop())
		}
	}()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.KubeConfig, 0o600); err != nil {
		return nil, err
	}
	tektonKubeconfig := kubeconfig
	if o.user != "" {
		own, err := cp.KubeConfigAs(o.user, "system:masters")
		if err != nil {
			return nil, err
		}
		tektonKubeconfig = filepath.Join(dir, "tekton.kubeconfig")
		if err := os.WriteFile(tektonKubeconfig, own, 0o600); err != nil {
			return nil, err
		}
	}
	kwokConfig := filepath.Join(dir, "kwok.yaml")
	if err := os.WriteFile(kwokConfig, []byte(kwokConfiguration), 0o600); err != nil {
		return nil, err
	}
	gateCtx, stopGate := context.WithCancel(context.Background())
	t.stop = stopGate
	if t.gate, err = startGate(gateCtx, cp.Config); err != nil {
		return nil, err
	}
	for _, p := range []struct {
		name string
		args []string
		env  []string
	}{
		{"tekton-webhook", []string{"-kubeconfig=" + tektonKubeconfig}, tektonEnv("webhook", 8081, 8009, 9091,
			"WEBHOOK_PORT=443",
			"WEBHOOK_SERVICE_NAME="+webhookService,
			"WEBHOOK_SECRET_NAME=webhook-certs",
			"WEBHOOK_ADMISSION_CONTROLLER_NAME=webhook.pipeline.tekton.dev",
			"CONFIG_LEADERELECTION_NAME=config-leader-election-webhook",
		)},
		{"tekton-controller", append([]string{"-kubeconfig=" + tektonKubeconfig}, imageFlags()...), tektonEnv("controller", 8080, 8008, 9090,
			"CONFIG_DEFAULTS_NAME=config-defaults",
			"CONFIG_LEADERELECTION_NAME=config-leader-election-controller",
			"CONFIG_SPIRE=config-spire",
		)},
		// No serving endpoint: nothing probes it.
		{"kube-scheduler", []string{"--kubeconfig=" + kubeconfig, "--leader-elect=false", "--secure-port=0"}, nil},
		// HOME is its directory, so that no ~/.kwok/kwok.yaml of the machine's joins its config.
		{"kwok", []string{"--kubeconfig=" + kubeconfig, "--config=" + kwokConfig}, []string{"HOME=" + dir}},
	} {
		proc, err := controlplane.StartProgram(filepath.Join(bins, p.name), filepath.Join(dir, p.name+".log"), p.args, p.env)
		if err != nil {
			return nil, err
		}
		t.procs = append(t.procs, proc)
	}
	// Recorded once all have started, so that a test binary killed from now on leaves none
	// running past the next control plane's start.
	if t.ledger, err = controlplane.RecordProcesses(bins, dir); err != nil {
		return nil, fmt.Errorf("recording Tekton's processes: %w", err)
	}
	if err := addNode(ctx, cp.Client, NodeName, "linux", "amd64"); err != nil {
		return nil, err
	}
	if err := t.waitForWebhook(ctx, cp.Client); err != nil {
		return nil, err
	}
	return t, nil
}

// tektonEnv is the environment of Tekton's controller or webhook, as its release's Deployments
// set it, with ports of its own for its probes, profiling and metrics so that the two can share
// a network namespace.
func tektonEnv(component string, probes, profiling, metrics int, extra ...string) []string {
	return append([]string{
		"SYSTEM_NAMESPACE=" + Namespace,
		"KUBERNETES_MIN_VERSION=v1.28.0",
		"CONFIG_LOGGING_NAME=config-logging",
		"CONFIG_OBSERVABILITY_NAME=config-observability",
		"CONFIG_FEATURE_FLAGS_NAME=feature-flags",
		"METRICS_DOMAIN=tekton.dev/pipeline",
		fmt.Sprintf("PROBES_PORT=%d", probes),
		fmt.Sprintf("PROFILING_PORT=%d", profiling),
		fmt.Sprintf("METRICS_PROMETHEUS_PORT=%d", metrics),
		"OTEL_SERVICE_NAME=tekton-" + component,
	}, extra...)
}

// imageFlags name the images of Tekton's helpers: it only writes them into pods, which kwok
// never pulls.
func imageFlags() []string {
	var flags []string
	for _, name := range []string{"entrypoint", "nop", "sidecarlogresults", "workingdirinit", "shell"} {
		flags = append(flags, "-"+name+"-image="+imagePrefix+name)
	}
	return append(flags, "-shell-image-win="+imagePrefix+"shell-win")
}

// configure creates Tekton's namespace, config maps, webhook certificate Secret and webhook
// registrations from its release's config directory, and the webhook's Service. The
// registrations come with no rules: the webhook fills in rules and CA bundle when it starts.
func configure(ctx context.Context, c client.Client, config string) error {
	files := []string{filepath.Join(config, "100-namespace", "100-namespace.yaml")}
	cms, err := filepath.Glob(filepath.Join(config, "config-*.yaml"))
	if err != nil {
		return err
	}
	files = append(append(files, cms...), filepath.Join(config, "500-webhooks.yaml"))
	for _, f := range files {
		objs, err := controlplane.ReadObjects(f)
		if err != nil {
			return err
		}
		for _, obj := range objs {
			if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating %s %s from %s: %w", obj.GetKind(), obj.GetName(), f, err)
			}
		}
	}
	// The apiserver calls the webhook through this Service. Nothing runs in a pod here, so it
	// names the webhook's own address: the webhook listens on 443 in this network namespace.
	svc := &corev1.Service{}
	svc.Namespace, svc.Name = Namespace, webhookService
	svc.Spec = corev1.ServiceSpec{
		Type:         corev1.ServiceTypeExternalName,
		ExternalName: "localhost",
		Ports:        []corev1.ServicePort{{Name: "https-webhook", Port: 443, TargetPort: intstr.FromInt32(443)}},
	}
	if err := c.Create(ctx, svc); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the webhook's Service: %w", err)
	}
	return nil
}

// waitForWebhook waits until Tekton's webhook defaults a TaskRun and refuses an invalid one
// (both dry runs), which is once it has registered its rules and CA bundle and serves them.
// Until then, what tests create would pass unchecked.
func (t *Tekton) waitForWebhook(ctx context.Context, c client.Client) error {
	taskRun := func(steps ...any) *unstructured.Unstructured {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "tekton.dev/v1",
			"kind":       "TaskRun",
			"metadata":   map[string]any{"generateName": "webhook-probe-", "namespace": "default"},
			"spec":       map[string]any{"taskSpec": map[string]any{"steps": steps}},
		}}
		return obj
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, startWait, true, func(ctx context.Context) (bool, error) {
		if err := t.exited(); err != nil {
			return false, err
		}
		valid := taskRun(map[string]any{"name": "probe", "image": imagePrefix + "probe", "script": "true"})
		if err := c.Create(ctx, valid, client.DryRunAll); err != nil {
			last = err
			return false, nil
		}
		if _, defaulted, _ := unstructured.NestedString(valid.Object, "spec", "timeout"); !defaulted {
			last = errors.New("a TaskRun created came back without the default timeout")
			return false, nil
		}
		if err := c.Create(ctx, taskRun(), client.DryRunAll); err == nil {
			last = errors.New("a TaskRun without steps was accepted")
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for Tekton's webhook to default and validate TaskRuns (last: %v): %w\n%s", last, err, t.LogTail("tekton-webhook", 20))
	}
	return nil
}

// EnsureNamespace creates a namespace if it does not exist and waits until it has its default
// ServiceAccount: Tekton fails a TaskRun at once if the ServiceAccount it runs as is missing.
func (t *Tekton) EnsureNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{}
	ns.Name = name
	if err := t.client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	sa := &corev1.ServiceAccount{}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, startWait, true, func(ctx context.Context) (bool, error) {
		err := t.client.Get(ctx, client.ObjectKey{Namespace: name, Name: "default"}, sa)
		return err == nil, client.IgnoreNotFound(err)
	})
	if err != nil {
		return fmt.Errorf("waiting for the default ServiceAccount of namespace %s: %w", name, err)
	}
	return nil
}

// exited reports a process that has exited, with the end of its log.
func (t *Tekton) exited() error {
	for _, p := range t.procs {
		if err := p.Exited(); err != nil {
			return err
		}
	}
	return nil
}

// Version is the version of Tekton that runs, as the module cache names its directory.
func (t *Tekton) Version() string {
	if _, v, ok := strings.Cut(filepath.Base(t.module), "@"); ok {
		return v
	}
	return "(unknown version)"
}

// Processes are Start's programs, for an owner that watches them (the dev stack's supervisor).
func (t *Tekton) Processes() []controlplane.Process {
	procs := make([]controlplane.Process, 0, len(t.procs))
	for _, p := range t.procs {
		procs = append(procs, p.Process())
	}
	return procs
}

// LogTail is up to the last n lines of the log of one of Start's programs (tekton-controller,
// tekton-webhook, kube-scheduler, kwok), for a test that fails to say what Tekton did.
func (t *Tekton) LogTail(name string, n int) string {
	for _, p := range t.procs {
		if p.Name == name {
			return p.LogTail(n)
		}
	}
	return "(no process " + name + ")"
}

// Stop stops Tekton's controller and webhook, kube-scheduler, kwok and the gate, and removes their
// directory. It reports any that exited before it was asked to: until then, Tekton was not
// whole.
func (t *Tekton) Stop() error {
	var errs []error
	for i := len(t.procs) - 1; i >= 0; i-- {
		wait := stopWait
		if t.procs[i].Name == "tekton-webhook" {
			// Knative's webhook server keeps serving 45 s after SIGTERM, for load balancers to
			// notice; there are none, and it keeps nothing that a kill loses.
			wait = 0
		}
		errs = append(errs, t.procs[i].Stop(wait))
	}
	if t.stop != nil {
		t.stop()
	}
	errs = append(errs, controlplane.ForgetProcesses(t.ledger), os.RemoveAll(t.dir))
	return errors.Join(errs...)
}
