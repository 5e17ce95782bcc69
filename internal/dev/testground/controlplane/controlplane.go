// Package controlplane runs a real kube-apiserver and etcd, built by `make testbin`, with
// Tekton's CRDs installed from the Tekton module berth is built against, and beside them
// kube-controller-manager's garbage collector, namespace controller and ClusterRole aggregator,
// so that owner references, namespace deletion and the built-in admin, edit and view roles work
// as on a real cluster. Tests share one per package
// (see RunTests); `berth dev` runs one for the local stack.
package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/berth-ci/berth/internal/dev/testground/repo"
	"github.com/berth-ci/berth/internal/kubescheme"
)

// KubernetesVersion is the version `make testbin` builds; hack/tools/go.mod pins the same one
// (a test keeps the two equal).
const KubernetesVersion = "1.35.8"

const (
	modulePath = "github.com/berth-ci/berth"
	tektonPath = "github.com/tektoncd/pipeline"
)

// ControlPlane is a running kube-apiserver + etcd with Tekton's CRDs and berth's own (unless
// started WithoutDefaultCRDs) and any added WithCRDs, and (unless started
// WithoutGarbageCollector) kube-controller-manager.
type ControlPlane struct {
	// Config reaches the apiserver as a cluster admin.
	Config *rest.Config
	// Client is a direct (uncached) client with berth's scheme.
	Client client.Client
	// KubeConfig is a kubeconfig file's content for Config.
	KubeConfig []byte

	env    *envtest.Environment
	kcm    *controllerManager // nil without a garbage collector
	ledger string
	logged []Process // etcd and kube-apiserver, WithLogDir
}

// Option shapes a control plane.
type Option func(*options)

type options struct {
	withoutGarbageCollector bool
	withoutDefaultCRDs      bool
	tektonCRDDir            string
	crdDirs                 []string
	crds                    []*apiextensionsv1.CustomResourceDefinition
	logDir                  string
	auditLog                string
	auditRules              []auditv1.PolicyRule
	compaction              time.Duration
	advertiseAddress        string
	serviceAccounts         bool
}

// WithoutGarbageCollector starts no kube-controller-manager, as on a bare apiserver: owner
// references are never followed, a deleted namespace stays Terminating and the aggregated
// ClusterRoles (admin, edit, view) grant nothing. For the tests that
// show berth cleans up after itself instead of counting on a garbage collector.
func WithoutGarbageCollector() Option {
	return func(o *options) { o.withoutGarbageCollector = true }
}

// WithCRDs installs the CustomResourceDefinitions in each directory too (the YAML files in it,
// not below it), as the services berth talks to would have them installed.
func WithCRDs(dirs ...string) Option {
	return func(o *options) { o.crdDirs = append(o.crdDirs, dirs...) }
}

// WithCRDObjects installs CustomResourceDefinitions made in memory too, such as one derived
// from a Crossplane XRD. Installed before kube-controller-manager starts, their objects' owner
// references are followed from the start: its garbage collector notices a CRD created later
// only at its next discovery, up to 30 seconds on.
func WithCRDObjects(crds ...*apiextensionsv1.CustomResourceDefinition) Option {
	return func(o *options) { o.crds = append(o.crds, crds...) }
}

// WithoutDefaultCRDs installs neither Tekton's CRDs nor berth's: a bare cluster, like the
// throwaway clusters an integration test gets, and quicker to start.
func WithoutDefaultCRDs() Option {
	return func(o *options) { o.withoutDefaultCRDs = true }
}

// WithTektonCRDs installs the Tekton CRDs in dir instead of those of the Tekton module berth is
// built against, for a control plane that runs a Tekton of another version (see realtekton).
func WithTektonCRDs(dir string) Option {
	return func(o *options) { o.tektonCRDDir = dir }
}

// WithAdvertiseAddress has kube-apiserver advertise addr to its clients (the kubernetes Service's
// endpoint). Without it, kube-apiserver picks the address of the interface of the default
// route, and refuses to start where there is none: in a network namespace with only loopback.
func WithAdvertiseAddress(addr string) Option {
	return func(o *options) { o.advertiseAddress = addr }
}

// WithServiceAccounts has kube-controller-manager also run its serviceaccount controller, which
// gives every namespace its default ServiceAccount, as on a real cluster: Tekton's controller
// reads the ServiceAccount a TaskRun runs as, and fails the TaskRun if there is none. Without
// it no namespace has one, and the apiserver's objects are only those the tests write.
func WithServiceAccounts() Option {
	return func(o *options) { o.serviceAccounts = true }
}

// WithCompaction has kube-apiserver compact etcd's history every interval instead of every
// five minutes: a test that revises a gigabyte of large objects keeps only minutes of them.
func WithCompaction(interval time.Duration) Option {
	return func(o *options) { o.compaction = interval }
}

// Scheme is berth's scheme; see kubescheme.
func Scheme() *runtime.Scheme { return kubescheme.New() }

// Start brings up a control plane and waits until it serves the default namespace. It does not
// wait for the garbage collector to sync (see startControllerManager).
func Start(opts ...Option) (*ControlPlane, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	bins, err := BinaryDir()
	if err != nil {
		return nil, err
	}
	ReapOrphans(bins)
	crds := o.crdDirs
	if !o.withoutDefaultCRDs {
		if crds, err = defaultCRDDirs(o.tektonCRDDir, crds); err != nil {
			return nil, err
		}
	}
	scheme := Scheme()
	env := &envtest.Environment{
		BinaryAssetsDirectory:    bins,
		CRDDirectoryPaths:        crds,
		CRDs:                     o.crds,
		ErrorIfCRDPathMissing:    true,
		Scheme:                   scheme,
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  30 * time.Second,
		// envtest waits 10 s by default for the CRDs to be served; Tekton's, installed beside
		// four other control planes starting at once, took 16 s under CI's load.
		CRDInstallOptions: envtest.CRDInstallOptions{MaxTime: time.Minute},
	}
	// etcd syncs every write to disk by default, which makes a busy test slow on a VM disk
	// and buys nothing for a control plane that lives as long as one test package.
	env.ControlPlane.Etcd = &envtest.Etcd{}
	env.ControlPlane.Etcd.Configure().Set("unsafe-no-fsync", "true")
	// etcd's default space quota is 2 GiB, and a full backend refuses every write until an
	// operator disarms the alarm. The memory test (test/security/memory) writes about a
	// gigabyte of tenant objects of up to 1.5 MiB, each revised a few times before the
	// apiserver compacts: 8 GiB, the largest quota etcd's documentation suggests, keeps the
	// control plane writable through it.
	env.ControlPlane.Etcd.Configure().Set("quota-backend-bytes", strconv.Itoa(8<<30))
	var outputs []*loggedOutput
	if o.logDir != "" {
		if err := os.MkdirAll(o.logDir, 0o755); err != nil {
			return nil, err
		}
		for _, name := range []string{"etcd", "kube-apiserver"} {
			out, err := logOutput(o.logDir, name)
			if err != nil {
				return nil, err
			}
			defer out.closeParentEnd()
			outputs = append(outputs, out)
		}
		env.ControlPlane.Etcd.Out, env.ControlPlane.Etcd.Err = outputs[0].w, outputs[0].w
		env.ControlPlane.APIServer = &envtest.APIServer{Out: outputs[1].w, Err: outputs[1].w}
	}
	if env.ControlPlane.APIServer == nil {
		env.ControlPlane.APIServer = &envtest.APIServer{}
	}
	if o.compaction > 0 {
		env.ControlPlane.APIServer.Configure().Set("etcd-compaction-interval", o.compaction.String())
	}
	if o.advertiseAddress != "" {
		env.ControlPlane.APIServer.Configure().Set("advertise-address", o.advertiseAddress)
	}
	if o.auditLog != "" {
		if env.ControlPlane.APIServer == nil {
			env.ControlPlane.APIServer = &envtest.APIServer{}
		}
		if err := configureAudit(env.ControlPlane.APIServer, o.auditLog, o.auditRules); err != nil {
			return nil, fmt.Errorf("configuring the audit log: %w", err)
		}
	}
	cfg, err := env.Start()
	for _, out := range outputs {
		out.closeParentEnd()
	}
	if err != nil {
		err = fmt.Errorf("starting kube-apiserver and etcd from %s: %w", bins, err)
		for _, out := range outputs {
			err = fmt.Errorf("%w\nend of %s:\n%s", err, out.process.LogPath, out.process.LogTail(10))
		}
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("building a client for the test control plane: %w", err)
	}
	cp := &ControlPlane{Config: cfg, Client: c, KubeConfig: env.KubeConfig, env: env}
	for _, out := range outputs {
		cp.logged = append(cp.logged, out.process)
	}
	if !o.withoutGarbageCollector {
		var extra []string
		if o.serviceAccounts {
			extra = append(extra, "serviceaccount")
		}
		if cp.kcm, err = startControllerManager(bins, env.KubeConfig, o.logDir, extra); err != nil {
			_ = env.Stop()
			return nil, err
		}
	}
	// Recorded after every process has started, so that a killed owner leaves none unreaped.
	if cp.ledger, err = recordChildren(bins, cp.dirs()); err != nil {
		_ = cp.Stop()
		return nil, fmt.Errorf("recording the control plane's processes: %w", err)
	}
	return cp, nil
}

// dirs are the temporary directories of this control plane's processes, by which its ledger tells
// them from those of other control planes the same process runs.
func (cp *ControlPlane) dirs() []string {
	dirs := []string{cp.env.ControlPlane.APIServer.CertDir, cp.env.ControlPlane.Etcd.DataDir}
	if cp.kcm != nil {
		dirs = append(dirs, cp.kcm.dir)
	}
	return dirs
}

// defaultCRDDirs puts Tekton's CRDs (those in tekton, else those of berth's Tekton module) and
// berth's own before extra.
func defaultCRDDirs(tekton string, extra []string) ([]string, error) {
	var err error
	if tekton == "" {
		if tekton, err = TektonCRDDir(); err != nil {
			return nil, err
		}
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	return append([]string{tekton, filepath.Join(root, "config", "crd", "bases")}, extra...), nil
}

// CollectsGarbage tells whether kube-controller-manager runs beside the apiserver.
func (cp *ControlPlane) CollectsGarbage() bool { return cp.kcm != nil }

// Stop stops kube-controller-manager (a client of the apiserver, so first), then
// kube-apiserver, then etcd, and removes their data.
func (cp *ControlPlane) Stop() error {
	var errs []error
	if cp.kcm != nil {
		errs = append(errs, cp.kcm.stop())
	}
	cp.killOrphanedAPIServer()
	if err := cp.env.Stop(); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if cp.ledger != "" {
		errs = append(errs, os.Remove(cp.ledger))
	}
	return errors.Join(errs...)
}

// ConfigFor returns a rest.Config that acts as the given ServiceAccount by impersonation, so a
// test can hold a component to exactly the RBAC it ships with.
func (cp *ControlPlane) ConfigFor(namespace, serviceAccount string) *rest.Config {
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + serviceAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	return cfg
}

// EnsureNamespace creates a namespace if it does not exist.
func (cp *ControlPlane) EnsureNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{}
	ns.Name = name
	err := cp.Client.Create(ctx, ns)
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// BinaryDir finds kube-apiserver, etcd and kube-controller-manager: KUBEBUILDER_ASSETS if set,
// else the repository's bin/k8s/<KubernetesVersion>, where `make testbin` puts them. The other
// programs it builds there are not required: kubectl and yq serve only some steps of the dev
// stack, which go without them (see devstack's step images), and kube-scheduler, Tekton and kwok
// only the tests on real Tekton (realtekton checks for those itself), so an older bin/k8s still
// runs everything else.
func BinaryDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "bin", "k8s", KubernetesVersion)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	var missing []string
	for _, bin := range []string{"kube-apiserver", "etcd", controllerManagerBinary} {
		if st, err := os.Stat(filepath.Join(dir, bin)); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, bin)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("%s missing in %s: run `make testbin` (builds kube-apiserver, etcd, kube-controller-manager, kube-scheduler and kubectl v%s, yq, Tekton, kwok, Prometheus and promtool from the Go module proxy, ~32 minutes cold; binaries already there are kept)",
			strings.Join(missing, ", "), dir, KubernetesVersion)
	}
	return dir, nil
}

// TektonCRDDir is config/300-crds of the Tekton module in berth's go.mod, so the CRDs the
// tests install are always those of the API types berth compiles against.
func TektonCRDDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", tektonPath)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locating the Tekton module (go list -m %s): %w: %s", tektonPath, err, strings.TrimSpace(stderr.String()))
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "config", "300-crds")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("the Tekton module has no CRDs where expected: %w", err)
	}
	return dir, nil
}

// RepoRoot walks up from the working directory to berth's go.mod.
func RepoRoot() (string, error) { return repo.Root() }
