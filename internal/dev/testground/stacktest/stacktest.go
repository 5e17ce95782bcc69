// Package stacktest runs a test package against the whole test ground: a real control plane
// with berth's CRDs, RBAC and Tasks, real sshd hosts, the Tekton stand-in running berth's own
// host steps, and berth's controller under its shipped ServiceAccount. The controller tests and
// the attack suite share it.
package stacktest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cli"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/controller/taskrun"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/dev/testground/repo"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
)

// RunScriptKey is the label of a test TaskRun whose step script the stand-in runs.
const RunScriptKey = "berth.test/run-script"

// Patience bounds every wait for the controller.
const Patience = 90 * time.Second

// Main brings the stack up with hosts SSH hosts and a controller started with options, runs
// the tests, and tears it all down; it returns the exit code. Without root or the host tools
// it skips the package, except in CI, where it fails. BERTH_TEST_LOG=<file> keeps the
// controller's log.
func Main(m *testing.M, stack **devstack.Stack, hosts int, options controller.Options) int {
	return MainWith(m, stack, hosts, options, nil)
}

// MainWith is Main with a say in the stack's options (say, to start the local VM cloud).
func MainWith(m *testing.M, stack **devstack.Stack, hosts int, options controller.Options, shape func(*devstack.Options)) int {
	if err := sshhosts.Prerequisites(); err != nil {
		return missing.Main(fmt.Sprint("the stack needs ", err))
	}
	dir, err := os.MkdirTemp("", "berth-stack-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// The controller's log, one JSON object a line: kept where BERTH_TEST_LOG says, and read by
	// tests of what berth logs (LogLines).
	logPath = filepath.Join(dir, "controller.log")
	if path := os.Getenv("BERTH_TEST_LOG"); path != "" {
		logPath = path
	}
	f, err := os.Create(logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer f.Close()
	ctrl.SetLogger(zap.New(zap.WriteTo(f)))
	devOpts := devstack.Options{
		StateDir: dir,
		Hosts:    hosts,
		HostStep: func(ctx context.Context, args []string) error {
			cmd := cli.NewRootCommand()
			cmd.SetArgs(append(args, "--dial-timeout=3s"))
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			return cmd.ExecuteContext(ctx)
		},
		RunScripts: func(tr *pipelinev1.TaskRun) bool { return tr.Labels[RunScriptKey] == "true" },
	}
	if shape != nil {
		shape(&devOpts)
	}
	s, err := devstack.Up(context.Background(), devOpts)
	*stack = s
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: bringing up the stack:", err)
		if s != nil {
			_ = s.Down()
		}
		return 1
	}
	defer func() {
		if err := s.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "tearing the stack down:", err)
		}
	}()
	if err := s.StartController(options); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: starting the controller:", err)
		return 1
	}
	return m.Run()
}

// logPath is the controller's log of the running package's stack.
var logPath string

// LogLines returns the lines of the controller's log (each a JSON object) for which keep is
// true.
func LogLines(t *testing.T, keep func(line map[string]any) bool) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, raw := range bytes.Split(data, []byte("\n")) {
		var line map[string]any
		if json.Unmarshal(raw, &line) == nil && keep(line) {
			out = append(out, line)
		}
	}
	return out
}

// Options are the controller's defaults for tests: no listeners, no periodic host checks, no
// wait timeout, failed internal TaskRuns deleted at once.
func Options() controller.Options {
	o := controller.DefaultOptions()
	o.MetricsAddress, o.HealthProbeAddress = "0", "0"
	o.HostCheckInterval, o.FailedTaskRetention, o.WaitTimeout = 0, 0, 0
	return o
}

// Eventually waits up to Patience for cond; the last error it returned is in the failure.
func Eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	EventuallyWithin(t, Patience, 50*time.Millisecond, what, cond)
}

// EventuallyWithin is Eventually with a patience and a polling interval of the caller's, for
// waits on work that takes the apiserver minutes.
func EventuallyWithin(t *testing.T, patience, interval time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), interval, patience, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil {
		dumpGoroutines(what)
		t.Fatalf("never: %s (last error: %v)", what, last)
	}
}

// dumpGoroutines writes every goroutine's stack beside the controller's log, when it is kept
// (BERTH_TEST_LOG): what the controller was stuck on when a wait ran out.
func dumpGoroutines(what string) {
	path := os.Getenv("BERTH_TEST_LOG")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path+".goroutines", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "=== never: %s at %s\n", what, time.Now().Format(time.RFC3339))
	pprof.Lookup("goroutine").WriteTo(f, 2)
}

// AdminPublicKeys are the public halves of every private key kept in a namespace's Secrets:
// what must never appear in a tenant's secret.
func AdminPublicKeys(t *testing.T, c client.Reader, namespace string) [][]byte {
	t.Helper()
	var list corev1.SecretList
	if err := c.List(context.Background(), &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	var keys [][]byte
	for _, s := range list.Items {
		for _, v := range s.Data {
			if signer, err := ssh.ParsePrivateKey(v); err == nil {
				keys = append(keys, signer.PublicKey().Marshal())
			}
		}
	}
	if len(keys) == 0 {
		t.Fatalf("no private key in namespace %s: a check for admin keys would prove nothing", namespace)
	}
	return keys
}

// SecretOf waits for the task's secret and returns it.
func SecretOf(t *testing.T, c client.Reader, tr *pipelinev1.TaskRun) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	Eventually(t, "the secret of "+tr.Name+" exists", func() (bool, error) {
		err := c.Get(context.Background(), client.ObjectKey{Namespace: tr.Namespace, Name: contract.SecretPrefix + tr.Name}, &s)
		return err == nil, client.IgnoreNotFound(err)
	})
	return &s
}

// Get reads a TaskRun as it is now.
func Get(t *testing.T, c client.Reader, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	var now pipelinev1.TaskRun
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(tr), &now); err != nil {
		t.Fatal(err)
	}
	return &now
}

// Record reads berth's Allocation of a TaskRun (named by its UID, in berth's namespace).
func Record(t *testing.T, c client.Reader, tr *pipelinev1.TaskRun) *berthv1.Allocation {
	t.Helper()
	var rec berthv1.Allocation
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: string(tr.UID)}, &rec); err != nil {
		t.Fatalf("the record of %s: %v", tr.Name, err)
	}
	return &rec
}

// PhaseIs waits until the task's record is in phase and returns it.
func PhaseIs(t *testing.T, c client.Reader, tr *pipelinev1.TaskRun, phase berthv1.Phase) *berthv1.Allocation {
	t.Helper()
	var rec berthv1.Allocation
	Eventually(t, tr.Name+" is "+string(phase), func() (bool, error) {
		err := c.Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: string(tr.UID)}, &rec)
		return err == nil && rec.Status.Phase == phase, client.IgnoreNotFound(err)
	})
	return &rec
}

// ForgetHost runs `berth host forget` as an operator would: for a host berth can never clean
// (a Windows or macOS platform pointed at a Linux test host), so its records can end.
func ForgetHost(t *testing.T, s *devstack.Stack, host string) {
	t.Helper()
	cmd := cli.NewRootCommand()
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"host", "forget", host, "--yes", "--namespace", devstack.Namespace, "--kubeconfig", s.KubeConfigPath})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("berth host forget %s: %v", host, err)
	}
}

// FinishAllOnFailure ends every TaskRun of a failed test's namespace, so that the hosts it
// held serve the tests after it instead of failing them too. Register it with t.Cleanup.
func FinishAllOnFailure(t *testing.T, s *devstack.Stack, ns string) {
	if !t.Failed() {
		return
	}
	var list pipelinev1.TaskRunList
	if err := s.ControlPlane.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return
	}
	for i := range list.Items {
		tr := &list.Items[i]
		switch {
		case tr.IsDone():
		case s.StandIn != nil:
			_ = s.StandIn.Finish(context.Background(), client.ObjectKeyFromObject(tr), nil)
		default: // real Tekton ends it when asked to cancel it
			patch := client.MergeFrom(tr.DeepCopy())
			tr.Spec.Status = pipelinev1.TaskRunSpecStatusCancelled
			_ = s.ControlPlane.Client.Patch(context.Background(), tr, patch)
		}
	}
}

// ApplyConfig writes data as the host config and waits until the controller has judged that
// very version: put it in force, or (where reasons include ConfigRejected) rejected it
// keeping the last good one. Without reasons it waits for ConfigApplied.
func ApplyConfig(t *testing.T, s *devstack.Stack, data map[string]string, reasons ...string) {
	t.Helper()
	rv, err := s.ApplyHostConfig(context.Background(), data)
	if err != nil {
		t.Fatal(err)
	}
	ConfigJudged(t, s.ControlPlane.Client, devstack.Namespace, rv, reasons...)
}

// ConfigJudged waits until the controller of namespace has judged the host config written as
// resourceVersion rv: an Event of one of reasons (ConfigApplied without any) names that version.
func ConfigJudged(t *testing.T, c client.Reader, namespace, rv string, reasons ...string) {
	t.Helper()
	if len(reasons) == 0 {
		reasons = []string{"ConfigApplied"}
	}
	Eventually(t, "config "+rv+" is judged ("+strings.Join(reasons, " or ")+")", func() (bool, error) {
		var events eventsv1.EventList
		if err := c.List(context.Background(), &events, client.InNamespace(namespace)); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if slices.Contains(reasons, e.Reason) && strings.Contains(e.Note, "resourceVersion "+rv+":") {
				return true, nil
			}
		}
		return false, nil
	})
}

// Namespace makes a namespace named after the test, and ends its TaskRuns if the test fails
// (see FinishAllOnFailure).
func Namespace(t *testing.T, s *devstack.Stack) string {
	t.Helper()
	// Subtests' names have slashes and spaces: a namespace name has neither.
	ns := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(strings.TrimPrefix(t.Name(), "Test")))
	ns = strings.Trim(ns[:min(len(ns), 50)], "-")
	if err := s.ControlPlane.EnsureNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { FinishAllOnFailure(t, s, ns) })
	return ns
}

// SecretsOfLiveTasks lists berth's secrets in namespace ns whose TaskRun is still there and has
// not ended. An ended task's secret may stay (its build user is removed, and it goes with its
// TaskRun); a settled namespace has none of the others.
func SecretsOfLiveTasks(ctx context.Context, c client.Reader, ns string) ([]string, error) {
	var secrets corev1.SecretList
	if err := c.List(ctx, &secrets, client.InNamespace(ns), client.HasLabels{contract.SecretLabel}); err != nil {
		return nil, err
	}
	var live []string
	for _, s := range secrets.Items {
		var tr pipelinev1.TaskRun
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: strings.TrimPrefix(s.Name, contract.SecretPrefix)}, &tr)
		if client.IgnoreNotFound(err) != nil {
			return nil, err
		}
		if err == nil && !tr.IsDone() {
			live = append(live, s.Name)
		}
	}
	return live, nil
}

// HandedOver tells whether the record's task has its build user: berth's sealed secret for
// the record's current user is there (see taskrun.HandedOver; berth writes no phase for it).
func HandedOver(ctx context.Context, c client.Reader, rec *berthv1.Allocation) (bool, error) {
	ref := rec.Spec.TaskRun
	var s corev1.Secret
	err := c.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: contract.SecretPrefix + ref.Name}, &s)
	if err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return taskrun.HandedOver(&s, rec), nil
}

// Ready waits until the task's build user is handed over (see HandedOver) and returns its
// record.
func Ready(t *testing.T, c client.Reader, tr *pipelinev1.TaskRun) *berthv1.Allocation {
	t.Helper()
	var rec berthv1.Allocation
	Eventually(t, tr.Name+" has its build user", func() (bool, error) {
		err := c.Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: string(tr.UID)}, &rec)
		if err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return HandedOver(context.Background(), c, &rec)
	})
	return &rec
}

// IsWaiting tells whether the task waits for a slot: its TaskRun carries berth's waiting label
// and no record of berth's holds a slot for it. (A task that never had a slot waits without a
// record; one that must try another host has a Waiting record.)
func IsWaiting(ctx context.Context, c client.Reader, tr *pipelinev1.TaskRun) (bool, error) {
	var now pipelinev1.TaskRun
	if err := c.Get(ctx, client.ObjectKeyFromObject(tr), &now); err != nil {
		return false, err
	}
	if now.Labels[contract.WaitingForPlatformLabel] == "" {
		return false, nil
	}
	var rec berthv1.Allocation
	switch err := c.Get(ctx, client.ObjectKey{Namespace: devstack.Namespace, Name: string(now.UID)}, &rec); {
	case err == nil:
		return rec.Status.Phase == berthv1.PhaseWaiting, nil
	case client.IgnoreNotFound(err) == nil:
		return true, nil
	default:
		return false, err
	}
}

// Waiting waits until the task waits for a slot (see IsWaiting).
func Waiting(t *testing.T, c client.Reader, tr *pipelinev1.TaskRun) {
	t.Helper()
	Eventually(t, tr.Name+" waits for a slot", func() (bool, error) {
		return IsWaiting(context.Background(), c, tr)
	})
}

// StateOf tells whether the task has its build user (see HandedOver) or waits for a slot (see
// IsWaiting); neither while it is between the two, or answered otherwise.
func StateOf(ctx context.Context, c client.Reader, tr *pipelinev1.TaskRun) (handedOver, waiting bool, err error) {
	var rec berthv1.Allocation
	err = c.Get(ctx, client.ObjectKey{Namespace: devstack.Namespace, Name: string(tr.UID)}, &rec)
	switch {
	case err == nil:
		if handedOver, err = HandedOver(ctx, c, &rec); err != nil || handedOver {
			return handedOver, false, err
		}
		if rec.Status.Phase != berthv1.PhaseWaiting {
			return false, false, nil
		}
	case client.IgnoreNotFound(err) != nil:
		return false, false, err
	}
	waiting, err = IsWaiting(ctx, c, tr)
	return false, waiting, err
}

// BuildBerth builds berth's binary from this tree into the test's temporary directory.
func BuildBerth(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "berth")
	if err := repo.Build("./cmd/berth", bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// ShippedController is the controller's Deployment as config/manager ships it, decoded strictly
// (a field the Deployment type lacks is an error), for tests that run or size berth as it runs.
func ShippedController(t *testing.T) appsv1.Deployment {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "config", "manager", "deployment.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := yaml.UnmarshalStrict(data, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return d
}
