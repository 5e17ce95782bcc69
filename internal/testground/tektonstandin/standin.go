// Package tektonstandin is a small stand-in for Tekton's controller, for tests and `berth dev`
// only: there is no kubelet here, so nothing would otherwise run a TaskRun. berth's controller
// never depends on it.
//
// For each TaskRun it resolves the Task into status.taskSpec (as Tekton does), creates the Pod
// object, and keeps Succeeded=Unknown while the run is in progress. A run then ends one of
// three ways: an Executor registered for the command of its one step (berth's own Tasks run
// `berth host ...`) runs Go code, the same code the real step runs; with RunScripts, a user
// TaskRun's step scripts run as local processes once the Secrets its volumes mount exist; or
// the caller ends it with Finish. Labels choose nothing, as in Tekton: a tenant's TaskRun
// labelled like berth's internal ones runs as what it is.
package tektonstandin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"knative.dev/pkg/apis"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Executor runs an internal TaskRun's work in Go. It returns the TaskRun's results; an error
// fails the TaskRun with the error as its message.
type Executor func(ctx context.Context, tr *pipelinev1.TaskRun) (results map[string]string, err error)

// Options configure a StandIn.
type Options struct {
	// Scheme must know core and Tekton v1 types.
	Scheme *runtime.Scheme
	// RunScripts selects the TaskRuns without an executor whose step scripts run as local
	// processes (nil: none; they end by Finish). It needs root: each step gets a private mount
	// namespace for its volumes.
	RunScripts func(*pipelinev1.TaskRun) bool
	// WorkDir holds materialised volumes, results and step logs; a temporary directory if empty.
	WorkDir string
	// StepOutput, if set, also receives the output of step scripts, each line prefixed with
	// its TaskRun and step.
	StepOutput io.Writer
}

// StandIn plays Tekton's part against a real apiserver.
type StandIn struct {
	opts   Options
	client client.Client

	mu        sync.Mutex
	executors map[string]Executor
	running   map[types.NamespacedName]*run
	mounts    *mountPoints
}

type run struct {
	uid    types.UID
	cancel context.CancelFunc
}

// New returns a StandIn; register executors before Start.
func New(opts Options) *StandIn {
	return &StandIn{
		opts:      opts,
		executors: map[string]Executor{},
		running:   map[types.NamespacedName]*run{},
		mounts:    newMountPoints(),
	}
}

// Register makes TaskRuns whose one step runs command (its first Command word) run e.
func (s *StandIn) Register(command string, e Executor) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.executors[command] = e
}

// executorFor is the executor registered for the TaskRun's step command, if any.
func (s *StandIn) executorFor(tr *pipelinev1.TaskRun) Executor {
	spec := tr.Status.TaskSpec
	if spec == nil || len(spec.Steps) != 1 || len(spec.Steps[0].Command) == 0 {
		return nil
	}
	return s.executors[spec.Steps[0].Command[0]]
}

// Start runs the stand-in with its own manager until ctx ends. It has its own cache so that it
// never shares (or widens) the cache of a controller under test in the same process.
func (s *StandIn) Start(ctx context.Context, cfg *rest.Config) error {
	if s.opts.WorkDir == "" {
		dir, err := os.MkdirTemp("", "berth-tekton-standin-")
		if err != nil {
			return err
		}
		s.opts.WorkDir = dir
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(s.opts.WorkDir, 0o700); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 s.opts.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return fmt.Errorf("tekton stand-in manager: %w", err)
	}
	s.client = mgr.GetClient()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &pipelinev1.TaskRun{}, secretVolumeIndex, indexSecretVolumes); err != nil {
		return err
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("tekton-standin").
		For(&pipelinev1.TaskRun{}).
		// A user TaskRun's pod waits for the Secrets it mounts; their arrival is what starts it.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(s.taskRunsMounting)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 8, SkipNameValidation: ptr(true)}).
		Complete(s)
	if err != nil {
		return err
	}
	defer s.cancelAll()
	return mgr.Start(ctx)
}

// Finish ends a running TaskRun as a test or the dev stack decides: nil succeeds it, an error
// fails it with the error's text.
func (s *StandIn) Finish(ctx context.Context, key types.NamespacedName, runErr error) error {
	return s.complete(ctx, key, nil, runErr)
}

// Reconcile moves one TaskRun through resolve → pod → run.
func (s *StandIn) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var tr pipelinev1.TaskRun
	if err := s.client.Get(ctx, req.NamespacedName, &tr); err != nil {
		if apierrors.IsNotFound(err) {
			s.stop(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if tr.IsDone() {
		s.stop(req.NamespacedName)
		return reconcile.Result{}, nil
	}
	if tr.Spec.Status == pipelinev1.TaskRunSpecStatusCancelled {
		s.stop(req.NamespacedName)
		return reconcile.Result{}, s.complete(ctx, req.NamespacedName, nil, errCancelled)
	}
	if tr.Status.TaskSpec == nil {
		if err := s.resolve(ctx, &tr); err != nil {
			return reconcile.Result{}, err
		}
		if tr.IsDone() {
			return reconcile.Result{}, nil
		}
	}
	if err := s.ensurePod(ctx, &tr); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, s.execute(ctx, &tr)
}

var errCancelled = errors.New("TaskRun was cancelled")

// resolve fills status.taskSpec from spec.taskSpec or the referenced Task, and marks the run
// started. A missing Task fails the run, as Tekton does.
func (s *StandIn) resolve(ctx context.Context, tr *pipelinev1.TaskRun) error {
	spec := tr.Spec.TaskSpec
	if spec == nil && tr.Spec.TaskRef != nil {
		var task pipelinev1.Task
		err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: tr.Spec.TaskRef.Name}, &task)
		if apierrors.IsNotFound(err) {
			return s.complete(ctx, client.ObjectKeyFromObject(tr), nil,
				fmt.Errorf("task %s/%s not found", tr.Namespace, tr.Spec.TaskRef.Name))
		}
		if err != nil {
			return err
		}
		spec = &task.Spec
	}
	if spec == nil {
		return s.complete(ctx, client.ObjectKeyFromObject(tr), nil, errors.New("TaskRun has neither taskRef nor taskSpec"))
	}
	tr.Status.TaskSpec = spec.DeepCopy()
	tr.Status.PodName = tr.Name + "-pod"
	now := metav1.Now()
	tr.Status.StartTime = &now
	tr.Status.MarkResourceOngoing(pipelinev1.TaskRunReasonRunning, "Running")
	return s.client.Status().Update(ctx, tr)
}

// ensurePod creates the Pod object Tekton would: nothing runs it, but its volumes and owner are
// what a real cluster would show. The namespace's ServiceAccount is created if absent, because
// no controller-manager runs here to do it and admission refuses pods without one.
func (s *StandIn) ensurePod(ctx context.Context, tr *pipelinev1.TaskRun) error {
	sa := tr.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	account := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: tr.Namespace}}
	if err := s.client.Create(ctx, account); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating service account %s/%s: %w", tr.Namespace, sa, err)
	}
	pod := podFor(tr, sa)
	if err := ctrl.SetControllerReference(tr, pod, s.opts.Scheme); err != nil {
		return err
	}
	if err := s.client.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

func podFor(tr *pipelinev1.TaskRun, serviceAccount string) *corev1.Pod {
	spec := tr.Status.TaskSpec
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      tr.Status.PodName,
			Namespace: tr.Namespace,
			Labels:    map[string]string{"tekton.dev/taskRun": tr.Name},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName:           serviceAccount,
			AutomountServiceAccountToken: ptr(false),
			RestartPolicy:                corev1.RestartPolicyNever,
			Volumes:                      volumes(tr),
		},
	}
	for _, step := range spec.Steps {
		image := step.Image
		if image == "" {
			image = "scratch"
		}
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
			Name:         "step-" + step.Name,
			Image:        image,
			Command:      step.Command,
			Args:         step.Args,
			VolumeMounts: step.VolumeMounts,
		})
	}
	return pod
}

// execute starts the TaskRun's work once; a second reconcile of a running TaskRun is a no-op.
func (s *StandIn) execute(ctx context.Context, tr *pipelinev1.TaskRun) error {
	key := client.ObjectKeyFromObject(tr)
	s.mu.Lock()
	executor := s.executorFor(tr)
	previous := s.running[key]
	s.mu.Unlock()
	if previous != nil && previous.uid == tr.UID {
		return nil
	}
	if previous != nil {
		s.stop(key) // a new TaskRun took the name of one still running here
	}
	var work func(context.Context) (map[string]string, error)
	switch {
	case executor != nil:
		work = func(ctx context.Context) (map[string]string, error) { return executor(ctx, tr.DeepCopy()) }
	case s.opts.RunScripts != nil && s.opts.RunScripts(tr):
		ready, err := s.secretsPresent(ctx, tr)
		if err != nil || !ready {
			return err // the Secret watch brings it back when one appears
		}
		work = func(ctx context.Context) (map[string]string, error) { return s.runSteps(ctx, tr.DeepCopy()) }
	default:
		return nil // ended by Finish
	}

	runCtx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	s.running[key] = &run{uid: tr.UID, cancel: cancel}
	s.mu.Unlock()
	go func() {
		defer cancel()
		results, err := work(runCtx)
		if runCtx.Err() != nil {
			return // deleted or cancelled meanwhile: nothing to report
		}
		finishCtx, done := context.WithTimeout(context.Background(), 30*time.Second)
		defer done()
		if cerr := s.complete(finishCtx, key, results, err); cerr != nil && !apierrors.IsNotFound(cerr) {
			ctrl.Log.WithName("tekton-standin").Error(cerr, "recording the end of a TaskRun", "taskrun", key)
		}
	}()
	return nil
}

// complete marks the TaskRun succeeded (runErr nil) or failed, with results and completion time.
func (s *StandIn) complete(ctx context.Context, key types.NamespacedName, results map[string]string, runErr error) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var tr pipelinev1.TaskRun
		if err := s.client.Get(ctx, key, &tr); err != nil {
			return err
		}
		if tr.IsDone() {
			return nil
		}
		now := metav1.Now()
		for name, value := range results {
			tr.Status.Results = append(tr.Status.Results, pipelinev1.TaskRunResult{
				Name: name, Type: pipelinev1.ResultsTypeString, Value: *pipelinev1.NewStructuredValues(value),
			})
		}
		cond := apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionTrue,
			Reason: pipelinev1.TaskRunReasonSuccessful.String(), Message: "All Steps have completed executing"}
		switch {
		case errors.Is(runErr, errCancelled):
			cond.Status, cond.Reason, cond.Message = corev1.ConditionFalse, pipelinev1.TaskRunReasonCancelled.String(), runErr.Error()
		case runErr != nil:
			cond.Status, cond.Reason, cond.Message = corev1.ConditionFalse, pipelinev1.TaskRunReasonFailed.String(), runErr.Error()
		}
		tr.Status.SetCondition(&cond)
		tr.Status.CompletionTime = &now
		return s.client.Status().Update(ctx, &tr)
	})
}

// stop cancels the local work of a TaskRun that ended or was deleted.
func (s *StandIn) stop(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.running[key]; ok {
		r.cancel()
		delete(s.running, key)
	}
}

func (s *StandIn) cancelAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, r := range s.running {
		r.cancel()
		delete(s.running, key)
	}
}

const secretVolumeIndex = "berth.standin/secret-volume"

func indexSecretVolumes(obj client.Object) []string {
	tr := obj.(*pipelinev1.TaskRun)
	var names []string
	for _, v := range volumes(tr) {
		if v.Secret != nil {
			names = append(names, v.Secret.SecretName)
		}
	}
	return names
}

func (s *StandIn) taskRunsMounting(ctx context.Context, secret client.Object) []reconcile.Request {
	var list pipelinev1.TaskRunList
	if err := s.client.List(ctx, &list, client.InNamespace(secret.GetNamespace()),
		client.MatchingFields{secretVolumeIndex: secret.GetName()}); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, tr := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&tr)})
	}
	return reqs
}

func (s *StandIn) secretsPresent(ctx context.Context, tr *pipelinev1.TaskRun) (bool, error) {
	for _, name := range indexSecretVolumes(tr) {
		var secret corev1.Secret
		err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: name}, &secret)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

func ptr[T any](v T) *T { return &v }
