// Package bench measures a controller that keeps the multi-platform contract, whichever it
// is: it runs the controller as a child process against a real control plane, plays Tekton
// and the hosts with a simulation that knows only the contract, and reports allocation
// latency, throughput, API writes per allocation, and the controller's CPU and memory.
package bench

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
)

// Tekton simulates Tekton and the host steps, by the contract alone: it resolves user
// TaskRuns (status.taskSpec with the multi-platform-ssh-<name> volume), completes a provision
// TaskRun by creating the secret its SECRET_NAME param names in NAMESPACE with
// host=USER@HOST, completes clean and update TaskRuns, and completes a user TaskRun a while
// after its secret appears with a host, or at once as failed when the secret carries an error
// (as the task's step would, reading it). It creates no pods and runs nothing, so the API
// writes it causes are few and counted (Writes).
type Tekton struct {
	Client client.Client
	// Namespace holds the user TaskRuns, ControllerNamespace the internal ones (provision,
	// clean, update). TaskRuns of other namespaces are no concern of the simulation's.
	Namespace, ControllerNamespace string
	// Duration draws how long a user task runs once it has its secret.
	Duration func() time.Duration
	// OnSecret is told when a user task's secret appears (for latency measurements).
	OnSecret func(task string, at time.Time)
	// OnError is told when a user task's secret appears with an error instead of a host.
	OnError func(task string, at time.Time)
	// OnDone is told when a user task completes, successfully or not.
	OnDone func(task string, at time.Time)
	// OnInternal is told the name of each internal TaskRun that names its user task (label
	// user-task-name), and that task's name.
	OnInternal func(name, task string)
	// Real leaves the user TaskRuns to the real Tekton (realtekton) that runs beside it: the
	// simulation only watches them get their secret and end, and plays the internal TaskRuns
	// alone, whose steps do host work no pod of kwok's does.
	Real bool

	writes     atomic.Int64
	provisions atomic.Int64
	mu         sync.Mutex
	seen       map[string]bool
}

// Provisions is how many provision TaskRuns the simulation completed.
func (t *Tekton) Provisions() int64 { return t.provisions.Load() }

// Writes is how many API writes the simulation made.
func (t *Tekton) Writes() int64 { return t.writes.Load() }

// Run simulates until ctx ends. It follows TaskRuns and secrets through informers, which
// re-list when the apiserver drops a watch (it does under a burst of thousands of objects).
func (t *Tekton) Run(ctx context.Context, cfg *rest.Config) error {
	t.seen = map[string]bool{}
	informers, err := cache.New(cfg, cache.Options{Scheme: t.Client.Scheme(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}:      {Namespaces: map[string]cache.Config{t.Namespace: {}}},
			&pipelinev1.TaskRun{}: {Namespaces: map[string]cache.Config{t.Namespace: {}, t.ControllerNamespace: {}}},
		}})
	if err != nil {
		return err
	}
	if err := onAddOrUpdate(ctx, informers, &pipelinev1.TaskRun{}, func(tr *pipelinev1.TaskRun) { t.onTaskRun(ctx, tr) }); err != nil {
		return err
	}
	if err := onAddOrUpdate(ctx, informers, &corev1.Secret{}, func(s *corev1.Secret) {
		if s.Labels[contract.SecretLabel] != "" {
			t.onSecret(ctx, s)
		}
	}); err != nil {
		return err
	}
	return informers.Start(ctx)
}

// onAddOrUpdate calls f with every object of obj's kind the informers see added or changed.
func onAddOrUpdate[T client.Object](ctx context.Context, informers cache.Cache, obj T, f func(T)) error {
	inf, err := informers.GetInformer(ctx, obj)
	if err != nil {
		return err
	}
	call := func(o any) {
		if typed, ok := o.(T); ok {
			f(typed)
		}
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: call, UpdateFunc: func(_, o any) { call(o) }})
	return err
}

func (t *Tekton) once(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.seen[key] {
		return false
	}
	t.seen[key] = true
	return true
}

func (t *Tekton) onTaskRun(ctx context.Context, tr *pipelinev1.TaskRun) {
	if task := tr.Labels[contract.UserTaskNameLabel]; task != "" && tr.Labels[contract.TaskTypeLabel] != "" && t.OnInternal != nil && t.once("internal/"+string(tr.UID)) {
		t.OnInternal(tr.Name, task)
	}
	if tr.IsDone() {
		if t.Real && tr.Labels[contract.TaskTypeLabel] == "" && tr.Namespace == t.Namespace && t.OnDone != nil && t.once("done/"+string(tr.UID)) {
			t.OnDone(tr.Name, time.Now())
		}
		return
	}
	switch tr.Labels[contract.TaskTypeLabel] {
	case "":
		if t.Real {
			return
		}
		if tr.Status.TaskSpec == nil && tr.Namespace == t.Namespace && t.once("resolve/"+string(tr.UID)) {
			go t.resolve(ctx, tr.DeepCopy())
		}
	case contract.TaskTypeProvision:
		if t.once("provision/" + string(tr.UID)) {
			go t.provision(ctx, tr.DeepCopy())
		}
	default: // clean, update: succeed
		if t.once("done/" + string(tr.UID)) {
			go t.complete(ctx, tr.DeepCopy(), succeeded, map[string]string{"healthy": "true", "reason": ""})
		}
	}
}

// resolve does what Tekton does first: the task's spec into status.taskSpec, and running.
func (t *Tekton) resolve(ctx context.Context, tr *pipelinev1.TaskRun) {
	t.updateStatus(ctx, tr, func(tr *pipelinev1.TaskRun) {
		if tr.Status.TaskSpec == nil {
			tr.Status.TaskSpec = tr.Spec.TaskSpec.DeepCopy()
		}
		now := metav1.Now()
		tr.Status.StartTime = &now
		tr.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionUnknown, Reason: "Running"})
	})
}

// provision does what the provision step does. Of the upstream contract (SECRET_NAME): the
// secret, then success. Of berth's (USER_NAME; the controller writes the secret): success with
// the user-dir result.
func (t *Tekton) provision(ctx context.Context, tr *pipelinev1.TaskRun) {
	t.provisions.Add(1)
	p := map[string]string{}
	for _, param := range tr.Spec.Params {
		p[param.Name] = param.Value.StringVal
	}
	if user := p["USER_NAME"]; user != "" && p["SECRET_NAME"] == "" {
		t.complete(ctx, tr, succeeded, map[string]string{"user-dir": "/home/" + user + "/build"})
		return
	}
	var user pipelinev1.TaskRun
	if err := t.Client.Get(ctx, client.ObjectKey{Namespace: p["NAMESPACE"], Name: p["TASKRUN_NAME"]}, &user); err == nil {
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: p["SECRET_NAME"], Namespace: p["NAMESPACE"],
				Labels:          map[string]string{contract.SecretLabel: "true"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "tekton.dev/v1", Kind: "TaskRun", Name: user.Name, UID: user.UID}}},
			Data: map[string][]byte{"id_rsa": []byte("simulated"), "host": []byte(p["USER"] + "@" + p["HOST"]), "user-dir": []byte("/home/build")},
		}
		t.writes.Add(1)
		if err := t.Client.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
			return
		}
	}
	t.complete(ctx, tr, succeeded, nil)
}

func (t *Tekton) onSecret(ctx context.Context, s *corev1.Secret) {
	name := s.Name[len(contract.SecretPrefix):]
	hasHost, hasError := len(s.Data["host"]) > 0, len(s.Data["error"]) > 0
	if !(hasHost || hasError) || !t.once("run/"+s.Namespace+"/"+name) {
		return
	}
	if hasHost {
		if t.OnSecret != nil {
			t.OnSecret(name, time.Now())
		}
	} else if t.OnError != nil {
		t.OnError(name, time.Now())
	}
	if t.Real {
		return // Tekton runs the task; kwok ends its pod after the run drawn at its creation
	}
	run, outcome := t.Duration(), succeeded
	if !hasHost {
		run, outcome = 0, failed
	}
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(run):
		}
		var tr pipelinev1.TaskRun
		if err := t.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: name}, &tr); err != nil {
			return
		}
		t.complete(ctx, &tr, outcome, nil)
		if t.OnDone != nil {
			t.OnDone(name, time.Now())
		}
	}()
}

// outcome is how a simulated TaskRun ends.
type outcome bool

const (
	succeeded outcome = true
	failed    outcome = false
)

func (t *Tekton) complete(ctx context.Context, tr *pipelinev1.TaskRun, how outcome, results map[string]string) {
	t.updateStatus(ctx, tr, func(tr *pipelinev1.TaskRun) {
		now := metav1.Now()
		for k, v := range results {
			tr.Status.Results = append(tr.Status.Results, pipelinev1.TaskRunResult{Name: k, Type: pipelinev1.ResultsTypeString, Value: *pipelinev1.NewStructuredValues(v)})
		}
		tr.Status.CompletionTime = &now
		cond := apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionTrue, Reason: "Succeeded"}
		if how == failed {
			cond.Status, cond.Reason, cond.Message = corev1.ConditionFalse, "Failed", "the step found an error in its multi-platform secret"
		}
		tr.Status.SetCondition(&cond)
	})
}

func (t *Tekton) updateStatus(ctx context.Context, tr *pipelinev1.TaskRun, mutate func(*pipelinev1.TaskRun)) {
	_ = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		var cur pipelinev1.TaskRun
		if err := t.Client.Get(ctx, client.ObjectKeyFromObject(tr), &cur); err != nil {
			return err
		}
		if cur.IsDone() {
			return nil
		}
		mutate(&cur)
		t.writes.Add(1)
		return t.Client.Status().Update(ctx, &cur)
	})
}

// Uniform draws durations uniformly from [min, max).
func Uniform(min, max time.Duration) func() time.Duration {
	return func() time.Duration {
		if max <= min {
			return min
		}
		return min + rand.N(max-min)
	}
}
