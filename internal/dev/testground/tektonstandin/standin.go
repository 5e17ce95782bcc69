// Package tektonstandin is a small stand-in for Tekton's controller, for tests and `berth dev`
// only: there is no kubelet here, so nothing would otherwise run a TaskRun. berth's controller
// never depends on it.
//
// For each TaskRun it resolves the Task into status.taskSpec (as Tekton does), creates the Pod
// object, and keeps Succeeded=Unknown while the run is in progress. A run then ends one of
// three ways: an Executor registered for the command of its one step (berth's own Tasks run
// `berth host ...`) runs Go code, the same code the real step runs; with RunScripts, a user
// TaskRun's steps run as local processes, each in a sandbox of its own (sandbox.go), once the
// Secrets and ConfigMaps its pod needs exist; or the caller ends it with Finish. Labels choose
// nothing, as in Tekton: a tenant's TaskRun labelled like berth's internal ones runs as what
// it is.
//
// Steps see what Tekton gives them (spec.go): params with defaults, array params expanded in
// args, StepActions of the namespace with their params and step results (stepactions.go),
// $(context…), $(results…) and /tekton/results, $(workspaces…), stepTemplate env and
// volume mounts, optional and projected volumes, the ServiceAccount's registry credentials in
// $HOME/.docker, Tekton's default timeout of an hour. As in a real pod, a step acts as the
// TaskRun's ServiceAccount through rest.InClusterConfig (incluster.go), and a step of an
// image given in Options.Images finds that image's programs on its PATH (images.go). When
// the steps have run, status.steps holds each one's state as Tekton reports it (exit code,
// Completed, Error, Continued, Skipped, TimeoutExceeded), and StepLog its output. A
// TaskRun that uses a feature the stand-in does not implement fails at once with reason
// StandInUnsupported and a message naming the feature; none is left Running without a word.
package tektonstandin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
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
	// RunScripts selects the TaskRuns without an executor whose steps run as local processes
	// (nil: none; they end by Finish). It needs root: each step runs in a sandbox of its own
	// mount and PID namespaces (see sandbox.go).
	RunScripts func(*pipelinev1.TaskRun) bool
	// WorkDir holds materialised volumes, results and step logs; a temporary directory if empty.
	WorkDir string
	// StepOutput, if set, also receives the output of step scripts, each line prefixed with
	// its TaskRun and step.
	StepOutput io.Writer
	// Images gives images their programs: image reference → directory of this machine. A
	// step of a listed image finds the directory's files bound read-only into
	// /usr/local/bin, as a container of the image would find the image's programs on its
	// PATH (ghcr.io/berth-ci/berth → a directory holding a freshly built `berth`). A
	// reference without tag or digest matches every tag and digest of its repository, one
	// with a tag matches that tag (a step image with neither tag nor digest is :latest),
	// one with a digest only that digest; the most specific match wins. Short names resolve
	// as a container runtime resolves them (busybox is docker.io/library/busybox). A step of
	// an image not listed runs with the machine's programs alone.
	Images map[string]string
}

// StandIn plays Tekton's part against a real apiserver.
type StandIn struct {
	opts   Options
	client client.Client
	// reader reads past the cache: the pod a run binds its tokens to, the ServiceAccount
	// that decides whether it gets one, both possibly created a moment before.
	reader    client.Reader
	apiserver apiServer

	mu        sync.Mutex
	executors map[string]Executor // by command line prefix, words joined by a space
	running   map[types.NamespacedName]*run
	ready     chan struct{} // closed once Start's watches have synced
	readyOnce sync.Once
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
		ready:     make(chan struct{}),
	}
}

// Ready is closed once the stand-in started by Start watches TaskRuns, so that a TaskRun
// created after it is served.
func (s *StandIn) Ready() <-chan struct{} { return s.ready }

// Register makes TaskRuns whose one step's command line (Command, then Args) begins with the
// words of prefix run e: "berth host" takes berth's host Tasks and leaves other berth steps to
// run as processes.
func (s *StandIn) Register(prefix []string, e Executor) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.executors[strings.Join(prefix, " ")] = e
}

// executorFor is the executor registered for the TaskRun's step command line, if any.
func (s *StandIn) executorFor(tr *pipelinev1.TaskRun) Executor {
	spec := tr.Status.TaskSpec
	if spec == nil || len(spec.Steps) != 1 || len(spec.Steps[0].Command) == 0 {
		return nil
	}
	line := append(slices.Clone(spec.Steps[0].Command), spec.Steps[0].Args...)
	for prefix, e := range s.executors {
		words := strings.Fields(prefix)
		if len(line) >= len(words) && slices.Equal(line[:len(words)], words) {
			return e
		}
	}
	return nil
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
	api, err := apiServerOf(cfg)
	if err != nil {
		return fmt.Errorf("tekton stand-in: %w", err)
	}
	s.apiserver = api
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 s.opts.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return fmt.Errorf("tekton stand-in manager: %w", err)
	}
	s.client, s.reader = mgr.GetClient(), mgr.GetAPIReader()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &pipelinev1.TaskRun{}, secretIndex, indexSecrets); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &pipelinev1.TaskRun{}, configMapIndex, indexConfigMaps); err != nil {
		return err
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("tekton-standin").
		For(&pipelinev1.TaskRun{}).
		// A user TaskRun's pod waits for the Secrets and ConfigMaps it mounts; their arrival
		// is what starts it.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(s.taskRunsUsing(secretIndex))).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(s.taskRunsUsing(configMapIndex))).
		WithOptions(controller.Options{MaxConcurrentReconciles: 8, SkipNameValidation: ptr(true)}).
		Complete(s)
	if err != nil {
		return err
	}
	defer s.cancelAll()
	go func() {
		if mgr.GetCache().WaitForCacheSync(ctx) {
			s.readyOnce.Do(func() { close(s.ready) })
		}
	}()
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
	s.mu.Lock()
	executor := s.executorFor(&tr)
	s.mu.Unlock()
	var rs *runSpec
	if executor == nil && s.opts.RunScripts != nil && s.opts.RunScripts(&tr) {
		built, err := buildSandboxSpec(&tr)
		if err != nil {
			return reconcile.Result{}, s.complete(ctx, req.NamespacedName, nil, err)
		}
		rs = built
	}
	if err := s.ensurePod(ctx, &tr, rs); err != nil {
		if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
			return reconcile.Result{}, s.complete(ctx, req.NamespacedName, nil,
				&runError{reason: reasonPodCreationFailed, message: err.Error()})
		}
		return reconcile.Result{}, err
	}
	return s.execute(ctx, &tr, executor, rs)
}

var errCancelled = &runError{reason: reasonCancelled, message: "TaskRun was cancelled"}

// resolve fills status.taskSpec from spec.taskSpec or the referenced Task, its StepActions
// resolved (stepactions.go), and marks the run started. A missing Task or StepAction fails the
// run, as Tekton does.
func (s *StandIn) resolve(ctx context.Context, tr *pipelinev1.TaskRun) error {
	key := client.ObjectKeyFromObject(tr)
	spec := tr.Spec.TaskSpec
	if ref := tr.Spec.TaskRef; spec == nil && ref != nil {
		if ref.Resolver != "" {
			return s.complete(ctx, key, nil, unsupported("remote resolution of tasks (resolver %q); apply the Task to the namespace and refer to it by name", ref.Resolver))
		}
		if ref.Kind != "" && ref.Kind != pipelinev1.NamespacedTaskKind {
			return s.complete(ctx, key, nil, unsupported("taskRef of kind %q", ref.Kind))
		}
		var task pipelinev1.Task
		err := s.client.Get(ctx, types.NamespacedName{Namespace: tr.Namespace, Name: ref.Name}, &task)
		if apierrors.IsNotFound(err) {
			return s.complete(ctx, key, nil, &runError{reason: reasonResolutionFailed,
				message: fmt.Sprintf("task %s/%s not found", tr.Namespace, ref.Name)})
		}
		if err != nil {
			return err
		}
		spec = &task.Spec
	}
	if spec == nil {
		return s.complete(ctx, key, nil, invalid("TaskRun has neither taskRef nor taskSpec"))
	}
	spec = spec.DeepCopy()
	steps, err := s.resolveStepActions(ctx, tr, spec)
	if err != nil {
		var runErr *runError
		if errors.As(err, &runErr) {
			return s.complete(ctx, key, nil, err)
		}
		return err
	}
	spec.Steps = steps
	tr.Status.TaskSpec = spec
	tr.Status.PodName = tr.Name + "-pod"
	now := metav1.Now()
	tr.Status.StartTime = &now
	tr.Status.MarkResourceOngoing(pipelinev1.TaskRunReasonRunning, "Running")
	return s.client.Status().Update(ctx, tr)
}

// ensurePod creates the Pod object Tekton would, as admitted by a real apiserver: nothing
// runs it, but its containers, volumes (the ServiceAccount token's included, see
// incluster.go) and owner are what a real cluster would show. The namespace's
// ServiceAccount is created if absent, because no controller-manager runs here to do it and
// admission refuses pods without one.
func (s *StandIn) ensurePod(ctx context.Context, tr *pipelinev1.TaskRun, rs *runSpec) error {
	sa := serviceAccountOf(tr)
	account := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: tr.Namespace}}
	err := s.client.Create(ctx, account)
	if apierrors.IsAlreadyExists(err) {
		err = s.reader.Get(ctx, client.ObjectKeyFromObject(account), account)
	}
	if err != nil {
		return fmt.Errorf("service account %s/%s: %w", tr.Namespace, sa, err)
	}
	pod := podFor(tr, account, rs)
	if err := ctrl.SetControllerReference(tr, pod, s.opts.Scheme); err != nil {
		return err
	}
	if err := s.client.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// podFor is the TaskRun's pod: its steps as built for the run when there is one, else as the
// task writes them.
func podFor(tr *pipelinev1.TaskRun, sa *corev1.ServiceAccount, rs *runSpec) *corev1.Pod {
	steps, volumes := tr.Status.TaskSpec.Steps, podVolumes(tr)
	var wsMounts []corev1.VolumeMount
	if rs != nil {
		steps, volumes = rs.steps, append([]corev1.Volume{}, rs.volumes...)
		for _, w := range rs.workspaces {
			if w.binding != nil {
				v := workspaceVolume(w)
				volumes = append(volumes, v)
				wsMounts = append(wsMounts, corev1.VolumeMount{Name: v.Name, MountPath: w.mountPath, SubPath: w.binding.SubPath, ReadOnly: w.decl.ReadOnly})
			}
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      tr.Status.PodName,
			Namespace: tr.Namespace,
			Labels:    map[string]string{"tekton.dev/taskRun": tr.Name},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa.Name,
			RestartPolicy:      corev1.RestartPolicyNever,
			Volumes:            volumes,
		},
	}
	if pt := tr.Spec.PodTemplate; pt != nil {
		// As Tekton copies them. Nothing schedules the pod here, but what it would be scheduled
		// by (berth's pin of a local platform to its architecture) shows on it as on a cluster.
		pod.Spec.AutomountServiceAccountToken = pt.AutomountServiceAccountToken
		pod.Spec.NodeSelector, pod.Spec.Tolerations, pod.Spec.Affinity = pt.NodeSelector, pt.Tolerations, pt.Affinity
	}
	for i, step := range steps {
		image := step.Image
		if image == "" {
			image = "scratch"
		}
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
			Name:         stepName(step.Name, i),
			Image:        image,
			Command:      step.Command,
			Args:         step.Args,
			WorkingDir:   step.WorkingDir,
			Env:          step.Env,
			EnvFrom:      step.EnvFrom,
			VolumeMounts: append(append([]corev1.VolumeMount{}, step.VolumeMounts...), wsMounts...),
		})
	}
	if automountsToken(tr, sa) {
		mountServiceAccountToken(pod)
	}
	return pod
}

// execute starts the TaskRun's work once; a second reconcile of a running TaskRun is a no-op.
// A user TaskRun's steps wait, with a Pending message naming what is missing, until the
// Secrets and ConfigMaps its pod needs exist; the TaskRun's timeout runs from its start
// either way, so nothing waits forever.
func (s *StandIn) execute(ctx context.Context, tr *pipelinev1.TaskRun, executor Executor, rs *runSpec) (reconcile.Result, error) {
	key := client.ObjectKeyFromObject(tr)
	s.mu.Lock()
	previous := s.running[key]
	s.mu.Unlock()
	if previous != nil && previous.uid == tr.UID {
		return reconcile.Result{}, nil
	}
	if previous != nil {
		s.stop(key) // a new TaskRun took the name of one still running here
	}
	deadline, timeout := deadlineOf(tr)
	if timeout > 0 && !time.Now().Before(deadline) {
		return reconcile.Result{}, s.complete(ctx, key, nil, timeoutError(tr, timeout))
	}
	wait := reconcile.Result{}
	if timeout > 0 {
		wait.RequeueAfter = time.Until(deadline)
	}
	var work func(context.Context) (*runOutcome, error)
	switch {
	case executor != nil:
		work = func(ctx context.Context) (*runOutcome, error) {
			results, err := executor(ctx, tr.DeepCopy())
			return &runOutcome{results: results}, err
		}
	case rs != nil:
		missing, err := s.missingObjects(ctx, tr.Namespace, rs)
		if err != nil {
			return reconcile.Result{}, err
		}
		if len(missing) > 0 { // their watches bring the TaskRun back when they appear
			return wait, s.setOngoing(ctx, key, reasonPending, "pod is waiting for "+strings.Join(missing, ", "))
		}
		if err := s.setOngoing(ctx, key, reasonRunning, "Not all Steps in the Task have finished executing"); err != nil {
			return reconcile.Result{}, err
		}
		work = func(ctx context.Context) (*runOutcome, error) { return s.runSteps(ctx, tr.DeepCopy()) }
	default:
		return wait, nil // ended by Finish, or by its timeout
	}

	runCtx, cancel := context.WithCancel(context.Background())
	if timeout > 0 {
		runCtx, cancel = context.WithDeadline(context.Background(), deadline)
	}
	s.mu.Lock()
	s.running[key] = &run{uid: tr.UID, cancel: cancel}
	s.mu.Unlock()
	go func() {
		defer cancel()
		outcome, err := work(runCtx)
		switch {
		case errors.Is(runCtx.Err(), context.DeadlineExceeded):
			outcome, err = &runOutcome{}, timeoutError(tr, timeout)
		case runCtx.Err() != nil:
			return // deleted or cancelled meanwhile: nothing to report
		}
		finishCtx, done := context.WithTimeout(context.Background(), 30*time.Second)
		defer done()
		if cerr := s.end(finishCtx, key, outcome, err); cerr != nil && !apierrors.IsNotFound(cerr) {
			ctrl.Log.WithName("tekton-standin").Error(cerr, "recording the end of a TaskRun", "taskrun", key)
		}
	}()
	return reconcile.Result{}, nil
}

// deadlineOf is when the TaskRun times out: Tekton's default of an hour from its start unless
// spec.timeout says otherwise (0 means never; then timeout is 0).
func deadlineOf(tr *pipelinev1.TaskRun) (deadline time.Time, timeout time.Duration) {
	timeout = defaultTimeoutMinutes * time.Minute
	if tr.Spec.Timeout != nil {
		timeout = tr.Spec.Timeout.Duration
	}
	start := time.Now()
	if tr.Status.StartTime != nil {
		start = tr.Status.StartTime.Time
	}
	return start.Add(timeout), timeout
}

func timeoutError(tr *pipelinev1.TaskRun, timeout time.Duration) error {
	return &runError{reason: reasonTaskRunTimeout, message: fmt.Sprintf("TaskRun %q failed to finish within %q", tr.Name, timeout.String())}
}

// setOngoing records why a TaskRun in progress is where it is, if that changed.
func (s *StandIn) setOngoing(ctx context.Context, key types.NamespacedName, reason, message string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var tr pipelinev1.TaskRun
		if err := s.client.Get(ctx, key, &tr); err != nil {
			return err
		}
		if c := tr.Status.GetCondition(apis.ConditionSucceeded); tr.IsDone() || (c != nil && c.Reason == reason && c.Message == message) {
			return nil
		}
		tr.Status.MarkResourceOngoing(pipelinev1.TaskRunReason(reason), message)
		return s.client.Status().Update(ctx, &tr)
	})
}

// complete marks the TaskRun succeeded (runErr nil) or failed, with results and completion
// time. A runError's reason becomes the condition's reason; any other error is a step's
// failure.
func (s *StandIn) complete(ctx context.Context, key types.NamespacedName, results map[string]string, runErr error) error {
	return s.end(ctx, key, &runOutcome{results: results}, runErr)
}

// end is complete with the states of the steps that ran, which go to status.steps.
func (s *StandIn) end(ctx context.Context, key types.NamespacedName, outcome *runOutcome, runErr error) error {
	results := outcome.results
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var tr pipelinev1.TaskRun
		if err := s.client.Get(ctx, key, &tr); err != nil {
			return err
		}
		if tr.IsDone() {
			return nil
		}
		now := metav1.Now()
		tr.Status.Results = nil
		names := make([]string, 0, len(results))
		for name := range results {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			tr.Status.Results = append(tr.Status.Results, taskRunResult(tr.Status.TaskSpec, name, results[name]))
		}
		cond := apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionTrue,
			Reason: reasonSuccessful, Message: "All Steps have completed executing"}
		var re *runError
		switch {
		case errors.As(runErr, &re):
			cond.Status, cond.Reason, cond.Message = corev1.ConditionFalse, re.reason, re.message
		case runErr != nil:
			cond.Status, cond.Reason, cond.Message = corev1.ConditionFalse, reasonFailed, runErr.Error()
		}
		tr.Status.SetCondition(&cond)
		tr.Status.Steps = outcome.steps
		tr.Status.CompletionTime = &now
		return s.client.Status().Update(ctx, &tr)
	})
}

// taskRunResult types a result as the task declares it: an array or object result is JSON.
func taskRunResult(spec *pipelinev1.TaskSpec, name, value string) pipelinev1.TaskRunResult {
	r := pipelinev1.TaskRunResult{Name: name, Type: pipelinev1.ResultsTypeString, Value: *pipelinev1.NewStructuredValues(value)}
	if spec == nil {
		return r
	}
	for _, decl := range spec.Results {
		if decl.Name != name || (decl.Type != pipelinev1.ResultsTypeArray && decl.Type != pipelinev1.ResultsTypeObject) {
			continue
		}
		var v pipelinev1.ResultValue
		if err := json.Unmarshal([]byte(value), &v); err == nil && string(v.Type) == string(decl.Type) {
			r.Type, r.Value = decl.Type, v
		}
	}
	return r
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

// Indexes of TaskRuns by the Secrets and ConfigMaps their pods mount, so that one appearing
// starts the runs waiting for it.
const (
	secretIndex    = "berth.standin/secret"
	configMapIndex = "berth.standin/configmap"
)

func indexSecrets(obj client.Object) []string { return referenced(obj.(*pipelinev1.TaskRun), "secret") }
func indexConfigMaps(obj client.Object) []string {
	return referenced(obj.(*pipelinev1.TaskRun), "configmap")
}

func referenced(tr *pipelinev1.TaskRun, kind string) []string {
	var names []string
	add := func(v corev1.VolumeSource) {
		switch {
		case kind == "secret" && v.Secret != nil:
			names = append(names, v.Secret.SecretName)
		case kind == "configmap" && v.ConfigMap != nil:
			names = append(names, v.ConfigMap.Name)
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if kind == "secret" && src.Secret != nil {
					names = append(names, src.Secret.Name)
				}
				if kind == "configmap" && src.ConfigMap != nil {
					names = append(names, src.ConfigMap.Name)
				}
			}
		}
	}
	for _, v := range podVolumes(tr) {
		add(v.VolumeSource)
	}
	for _, w := range tr.Spec.Workspaces {
		add(corev1.VolumeSource{Secret: w.Secret, ConfigMap: w.ConfigMap, Projected: w.Projected})
	}
	return names
}

func (s *StandIn) taskRunsUsing(index string) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		var list pipelinev1.TaskRunList
		if err := s.client.List(ctx, &list, client.InNamespace(obj.GetNamespace()),
			client.MatchingFields{index: obj.GetName()}); err != nil {
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(list.Items))
		for _, tr := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&tr)})
		}
		return reqs
	}
}

func ptr[T any](v T) *T { return &v }
