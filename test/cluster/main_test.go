// Package cluster shows an integration pipeline's ephemeral cluster end to end, as a tenant
// sees it: the berth-provision-space and berth-ephemeral-cluster Tasks run (by the Tekton
// stand-in, each step a real berth binary in a sandbox, acting as the tenant's ServiceAccount)
// against stand-ins of the space service (serving both its APIs, the eaas Namespace claim and
// the SpaceRequest) and the cluster-template service, whose clusters are real second
// kube-apiservers. Faults are chosen by the template a test names. What the tests assert is
// what a person reads: the TaskRuns' outcome and messages, the steps' output, and what is left
// running afterwards.
package cluster

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/caasstandin"
	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/dev/testground/repo"
)

var stack *devstack.Stack

// berthBinary is the berth the steps run, for a test that runs it itself.
var berthBinary string

// steps holds every line the stack's steps printed, each behind "[namespace/taskrun step] ".
var steps = &stepLog{}

// Templates the tests ask for, each choosing what the CaaS stand-in does with its clusters.
const (
	readyTemplate        = "e2e-ready"
	installFailsTemplate = "e2e-install-fails"
	neverReadyTemplate   = "e2e-never-ready"
	byocTemplate         = "e2e-byoc"
	costlyTemplate       = "e2e-costly" // ready, at a cost of costlyCost
	costlyCost           = 5
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

// parallelTests is how many of the tests run side by side unless -parallel says otherwise. They
// spend their time waiting on the services and the Tasks' polls, not on the CPU, so the default
// of -parallel (the number of CPUs) would leave most of them queueing on a small machine.
const parallelTests = 16

func run(m *testing.M) int {
	flag.Parse()
	if !flagGiven("test.parallel") {
		if err := flag.Set("test.parallel", strconv.Itoa(parallelTests)); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
	}
	if os.Geteuid() != 0 {
		// Each step runs in a sandbox of its own mount and PID namespaces.
		return missing.Main("the Tasks' steps need root")
	}
	dir, err := os.MkdirTemp("", "berth-cluster-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	berth, err := buildBerth(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	berthBinary = berth
	// The stand-ins' controllers log to controller-runtime's logger; the tests read what the
	// Tasks print instead.
	ctrl.SetLogger(logr.Discard())
	ctx := context.Background()
	stack, err = devstack.Up(ctx, devstack.Options{
		StateDir:        filepath.Join(dir, "stack"),
		ClusterServices: true,
		BerthBinary:     berth,
		RunScripts:      func(*pipelinev1.TaskRun) bool { return true },
		StepOutput:      steps,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: bringing up the stack:", err)
		return 1
	}
	defer func() {
		if err := stack.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "tearing the stack down:", err)
		}
	}()
	for _, t := range []struct {
		name, definition string
		cost             int64
	}{
		{readyTemplate, caasstandin.DefinitionReady, 0},
		{installFailsTemplate, caasstandin.DefinitionInstallFails, 0},
		{neverReadyTemplate, caasstandin.DefinitionNeverReady, 0},
		{byocTemplate, caasstandin.DefinitionCredentials, 0},
		{costlyTemplate, caasstandin.DefinitionReady, costlyCost},
	} {
		if err := stack.AddClusterTemplate(ctx, t.name, t.definition, t.cost); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
	}
	return m.Run()
}

func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// buildBerth builds the berth binary that steps of berth's image run.
func buildBerth(dir string) (string, error) {
	bin := filepath.Join(dir, "berth")
	return bin, repo.Build("./cmd/berth", bin)
}

// stepLog collects the lines of every step. The stand-in runs TaskRuns side by side and writes
// each line whole, so lines of different runs never mix.
type stepLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *stepLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// of is what a TaskRun's step printed (every step's, with step ""), each line as it was
// logged, behind its prefix.
func (l *stepLog) of(tr *pipelinev1.TaskRun, step string) string {
	prefix := fmt.Sprintf("[%s/%s ", tr.Namespace, tr.Name)
	if step != "" {
		prefix += step + "] "
	}
	return l.startingWith(prefix)
}

// ofNamespace is every line the TaskRuns of a namespace printed.
func (l *stepLog) ofNamespace(namespace string) string {
	return l.startingWith("[" + namespace + "/")
}

// startingWith is every line logged that starts with prefix.
func (l *stepLog) startingWith(prefix string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out strings.Builder
	for line := range strings.Lines(l.buf.String()) {
		if strings.HasPrefix(line, prefix) {
			out.WriteString(line)
		}
	}
	return out.String()
}

// account is the ServiceAccount each tenant runs the cluster Tasks as.
const account = "integration-runner"

// tenant makes a namespace of the test's own with the cluster Tasks installed and account
// allowed to run them, as a tenant would set it up.
func tenant(t *testing.T, name string) string {
	t.Helper()
	if err := stack.InstallClusterTasks(context.Background(), name, account); err != nil {
		t.Fatal(err)
	}
	return name
}

// request is what a test asks of the cluster Tasks: a run named name in namespace ns.
func request(ns, name, template string) devstack.ClusterRequest {
	return devstack.ClusterRequest{Name: name, Namespace: ns, ServiceAccount: account, Template: template}
}

// pipelineLimit bounds a whole run of the Tasks: a booted cluster takes seconds, and a failure
// the Tasks should see at once must end long before the timeout they are given (failureTimeout).
const pipelineLimit = 2 * time.Minute

// failureTimeout is the timeout param of runs that must fail fast: ending within pipelineLimit
// shows they did not wait for it.
const failureTimeout = "10m"

// runPipeline runs req as RunClusterPipeline does and gives the space back when the test ends.
func runPipeline(t *testing.T, req devstack.ClusterRequest) *devstack.ClusterRun {
	t.Helper()
	return withSpace(t, stack.RunClusterPipeline, req)
}

// provisionSpace runs berth-provision-space alone and gives the space back when the test ends.
func provisionSpace(t *testing.T, req devstack.ClusterRequest) *devstack.ClusterRun {
	t.Helper()
	return withSpace(t, stack.ProvisionSpace, req)
}

// withSpace runs req with run, gives the space back when the test ends, and fails the test
// unless the space was made.
func withSpace(t *testing.T, run func(context.Context, devstack.ClusterRequest, time.Duration) (*devstack.ClusterRun, error), req devstack.ClusterRequest) *devstack.ClusterRun {
	t.Helper()
	got, err := run(context.Background(), req, pipelineLimit)
	if got != nil && got.Space != nil {
		release(t, got)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !got.Space.IsSuccessful() {
		t.Fatalf("berth-provision-space failed: %s\n%s", message(got.Space), steps.of(got.Space, ""))
	}
	return got
}

// release deletes the run's space (and any cluster in it) once the test is over, and checks
// that it went.
func release(t *testing.T, run *devstack.ClusterRun) {
	t.Cleanup(func() {
		if err := stack.ReleaseCluster(context.Background(), run, time.Minute); err != nil {
			t.Errorf("releasing the space of %s: %v", run.Space.Name, err)
		}
	})
}

// mustSucceed fails the test unless the TaskRun succeeded, showing what its steps printed.
func mustSucceed(t *testing.T, tr *pipelinev1.TaskRun, what string) {
	t.Helper()
	if tr == nil {
		t.Fatalf("%s never ran", what)
	}
	if !tr.IsSuccessful() {
		t.Fatalf("%s %s failed: %s\nits steps printed:\n%s", what, tr.Name, message(tr), steps.of(tr, ""))
	}
}

// mustFail fails the test unless the TaskRun failed.
func mustFail(t *testing.T, tr *pipelinev1.TaskRun, what string) {
	t.Helper()
	if tr == nil {
		t.Fatalf("%s never ran", what)
	}
	if tr.IsSuccessful() {
		t.Fatalf("%s %s succeeded; its steps printed:\n%s", what, tr.Name, steps.of(tr, ""))
	}
}

// message is the TaskRun's Succeeded condition's message: what `tkn taskrun describe` shows.
func message(tr *pipelinev1.TaskRun) string {
	return tr.Status.GetCondition("Succeeded").GetMessage()
}

// mustSay fails the test unless text (shown as what) holds every one of wants.
func mustSay(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s does not say %q:\n%s", what, w, text)
		}
	}
}

// eventually polls cond until it holds, up to a deadline; the last error it returned is in the
// failure.
func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil {
		t.Fatalf("never: %s (last error: %v)", what, last)
	}
}
