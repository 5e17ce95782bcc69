package bench

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

var (
	cp           *controlplane.ControlPlane
	auditLogPath string
)

// TestMain starts the package's control plane with the bench's audit log of the controller's
// user.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "berth-bench-test-")
	if err != nil {
		panic(err)
	}
	auditLogPath = filepath.Join(dir, "audit.log")
	code := controlplane.RunTestsWith(m, &cp, []controlplane.Option{controlplane.WithAuditLog(auditLogPath, controllerUser)})
	os.RemoveAll(dir)
	os.Exit(code)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 20*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("never: %s", what)
	}
}

// The simulation plays Tekton and the hosts exactly as far as the contract says, for any
// controller: resolve, provision → secret, clean/update → done, user task → done after its run.
func TestSimulatedTektonKeepsTheContract(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ns := range []string{userNamespace, controllerNamespace} {
		if err := cp.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.NewWithWatch(cp.Config, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	secretAt, errorAt, doneAt := map[string]time.Time{}, map[string]time.Time{}, map[string]time.Time{}
	internalOf := map[string]string{}
	sim := &Tekton{Client: c, Namespace: userNamespace, ControllerNamespace: controllerNamespace, Duration: Uniform(300*time.Millisecond, 300*time.Millisecond),
		OnSecret:   func(task string, at time.Time) { mu.Lock(); secretAt[task] = at; mu.Unlock() },
		OnError:    func(task string, at time.Time) { mu.Lock(); errorAt[task] = at; mu.Unlock() },
		OnDone:     func(task string, at time.Time) { mu.Lock(); doneAt[task] = at; mu.Unlock() },
		OnInternal: func(name, task string) { mu.Lock(); internalOf[name] = task; mu.Unlock() }}
	go func() { _ = sim.Run(ctx, cp.Config) }()
	time.Sleep(200 * time.Millisecond) // the watches start

	user := userTask("build")
	if err := c.Create(ctx, user); err != nil {
		t.Fatal(err)
	}
	get := func(o client.Object) error { return c.Get(ctx, client.ObjectKeyFromObject(o), o) }
	eventually(t, "the user TaskRun is resolved", func() bool {
		return get(user) == nil && user.Status.TaskSpec != nil && user.Status.TaskSpec.Volumes[0].Secret.SecretName == "multi-platform-ssh-build"
	})
	if user.IsDone() {
		t.Fatal("a user task must not end before it has its secret")
	}

	internal := func(name, taskType string, params ...string) *pipelinev1.TaskRun {
		tr := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: controllerNamespace,
			Labels: map[string]string{contract.TaskTypeLabel: taskType, contract.UserTaskNameLabel: "build"}},
			Spec: pipelinev1.TaskRunSpec{TaskRef: &pipelinev1.TaskRef{Name: "any-task-name"}}}
		for i := 0; i < len(params); i += 2 {
			tr.Spec.Params = append(tr.Spec.Params, pipelinev1.Param{Name: params[i], Value: *pipelinev1.NewStructuredValues(params[i+1])})
		}
		if err := c.Create(ctx, tr); err != nil {
			t.Fatal(err)
		}
		return tr
	}
	prov := internal("provision-1", contract.TaskTypeProvision, "SECRET_NAME", "multi-platform-ssh-build",
		"TASKRUN_NAME", "build", "NAMESPACE", userNamespace, "HOST", "192.0.2.7", "USER", "root")
	eventually(t, "the provision TaskRun succeeds", func() bool { return get(prov) == nil && prov.IsSuccessful() })
	var secret corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: userNamespace, Name: "multi-platform-ssh-build"}, &secret); err != nil {
		t.Fatal(err)
	}
	if string(secret.Data["host"]) != "root@192.0.2.7" || secret.Labels[contract.SecretLabel] != "true" ||
		len(secret.OwnerReferences) != 1 || secret.OwnerReferences[0].UID != user.UID {
		t.Fatalf("secret %v labels %v owners %v", secret.Data, secret.Labels, secret.OwnerReferences)
	}

	eventually(t, "the user task ends a run's length after its secret", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !doneAt["build"].IsZero()
	})
	if err := get(user); err != nil || !user.IsSuccessful() {
		t.Fatalf("user task %+v", user.Status.Conditions)
	}
	if ran := doneAt["build"].Sub(secretAt["build"]); ran < 300*time.Millisecond {
		t.Fatalf("the user task ran %s, less than its 300ms", ran)
	}

	for _, tt := range []string{contract.TaskTypeClean, contract.TaskTypeUpdate} {
		tr := internal(tt+"-1", tt)
		eventually(t, tt+" succeeds", func() bool { return get(tr) == nil && tr.IsSuccessful() })
	}
	mu.Lock()
	if want := map[string]string{"provision-1": "build", "clean-1": "build", "update-1": "build"}; !maps.Equal(internalOf, want) {
		t.Errorf("internal TaskRuns told: %v, want %v", internalOf, want)
	}
	mu.Unlock()

	// A secret with an error instead of a host fails its task at once, as its step would.
	broken := userTask("broken")
	if err := c.Create(ctx, broken); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the broken TaskRun is resolved", func() bool { return get(broken) == nil && broken.Status.TaskSpec != nil })
	errSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "multi-platform-ssh-broken", Namespace: userNamespace,
		Labels: map[string]string{contract.SecretLabel: "true"}}, Data: map[string][]byte{"error": []byte("no host for you")}}
	if err := c.Create(ctx, errSecret); err != nil {
		t.Fatal(err)
	}
	// The simulation tells OnDone after its status update lands, so the test may see the
	// TaskRun done first: it waits for both.
	eventually(t, "the task with an error secret fails", func() bool {
		mu.Lock()
		told := !doneAt["broken"].IsZero()
		mu.Unlock()
		return told && get(broken) == nil && broken.IsDone() && !broken.IsSuccessful()
	})
	mu.Lock()
	if errorAt["broken"].IsZero() || !secretAt["broken"].IsZero() || doneAt["broken"].IsZero() {
		t.Errorf("error secret at %v, host secret at %v, done at %v; want an error secret and done, no host", errorAt["broken"], secretAt["broken"], doneAt["broken"])
	}
	mu.Unlock()
	if sim.Writes() < 5 {
		t.Fatalf("the simulation counted %d writes; it made at least 5", sim.Writes())
	}
}

func TestHostCheckerCountsOvercommitAndHandOvers(t *testing.T) {
	h := newHostChecker(1)
	h.observe("a", "h1", 1)
	h.observe("b", "h1", 1) // over capacity
	h.observe("b", "", 0)   // leaves with nobody waiting: no hand-over to measure
	h.observe("a", "", 1)   // frees the slot while one waits
	h.observe("c", "h1", 0) // takes it
	h.observe("c", "", 0)
	h.observe("c", "h1", 0) // the same task again: assigned once
	got, violations := h.result()
	if violations != 1 || got.N != 1 {
		t.Fatalf("violations=%d hand-overs=%d, want 1 and 1", violations, got.N)
	}
	if on := h.assignments()["h1"]; !slices.Equal(on, []string{"a", "b", "c"}) {
		t.Fatalf("tasks assigned to h1: %v, want a, b, c", on)
	}
}

func TestScenarioScale(t *testing.T) {
	s, err := ScenarioNamed("idle-cluster", 0.1)
	if err != nil || s.Tasks != 10 || s.Unrelated != 2000 || s.Hosts != 1 {
		t.Fatalf("%+v %v", s, err)
	}
	d, err := ScenarioNamed("dynamic", 0.25)
	if err != nil || d.Tasks != 50 || d.MaxInstances != 5 || d.Hosts != 0 || d.Concurrency != 1 || d.Pooled {
		t.Fatalf("dynamic at 0.25: %+v %v", d, err)
	}
	p, err := ScenarioNamed("dynamic-pool", 0.1)
	if err != nil || p.Tasks != 200 || p.MaxInstances != 2 || !p.Pooled || p.Concurrency != 4 || p.slots() != 8 {
		t.Fatalf("dynamic-pool at 0.1 (max-instances at least 2): %+v %v", p, err)
	}
	if _, err := ScenarioNamed("nope", 1); err == nil {
		t.Fatal("an unknown scenario must be refused")
	}
}
