package taskrun

// The phases of the user-task reconciler (admit, reserve, provision, guard, finish, pay debts),
// each driven through Reconcile alone, with controller-runtime's fake client standing in for
// the apiserver (seen through the cache's transforms), a fake provisioner for the hosts, and
// the real capacity ledger and its wake-ups. No root, no apiserver, no sshd: milliseconds each.
// The stack tests (build tag stack) keep the same promises against real hosts.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tektoncd/pipeline/pkg/apis/pipeline/pod"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	clienttesting "k8s.io/client-go/testing"
	toolscache "k8s.io/client-go/tools/cache"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/controller/hosts"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/kubescheme"
	"github.com/berth-ci/berth/internal/localaffinity"
	"github.com/berth-ci/berth/internal/otp/keyserver"
	"github.com/berth-ci/berth/internal/provision"
	"github.com/berth-ci/berth/internal/provision/provisionfake"
	"github.com/berth-ci/berth/internal/remote"
)

const (
	berthNS  = "berth"  // the controller's namespace: records, config, admin keys
	tenantNS = "tenant" // where user TaskRuns and their secrets live
	s390x    = "linux/s390x"
	amd64    = "linux/amd64" // configured local
	// settleNS names the marker wake-ups settle sends itself; no TaskRun lives there.
	settleNS = "settle.invalid"
)

// hostsConfig is a host-config ConfigMap's data: static hosts of platform s390x (named
// h1, h2, ..., at 10.0.0.1, 10.0.0.2, ...) and amd64 as a local platform.
func hostsConfig(concurrency int, hosts ...string) map[string]string {
	data := map[string]string{"local-platforms": amd64}
	for i, h := range hosts {
		p := "host." + h + "."
		data[p+"address"] = addressOf(i)
		data[p+"user"] = "root"
		data[p+"platform"] = s390x
		data[p+"secret"] = "admin-key"
		data[p+"concurrency"] = strconv.Itoa(concurrency)
	}
	return data
}

func addressOf(i int) string { return fmt.Sprintf("10.0.0.%d", i+1) }

// newReconciler builds the reconciler as the manager would (internal/controller/manager.go)
// and does what SetupWithManager does before the manager starts, without one: this is the one
// place that knows how a Reconciler is put together, for these tests.
//   - Client is the cache as the manager configures it (CacheOptions): reads go through its
//     transforms; APIReader reads the apiserver itself.
//   - The field index on records is registered on the fake client (see newAPIServer).
//   - The capacity's wake-ups and host jobs' ends go to queue, as WatchesRawSource(r.Capacity.Source(...))
//     and WatchesRawSource(r.Capacity.JobEnds(...)) send them to the controller's queue.
func newReconciler(t *testing.T, ctx context.Context, apiserver client.WithWatch, faults *interceptor.Funcs,
	cfgData map[string]string, queue priorityqueue.PriorityQueue[reconcile.Request], recorder *eventLog,
	tune func(*Reconciler)) (*Reconciler, *provisionfake.Provisioner) {
	t.Helper()
	store := hostconfig.NewStore()
	if cfgData != nil {
		cfg, problems := config.Parse(cfgData)
		if len(cfg.Fatal()) > 0 {
			t.Fatalf("test config: %v", problems)
		}
		store.Apply(cfg)
	}
	store.MarkSynced() // the watcher has judged the cluster's config
	prov := &provisionfake.Provisioner{}
	cached := cacheView(apiserver, berthNS)
	if faults != nil {
		cached = interceptor.NewClient(cached, *faults)
	}
	r := &Reconciler{
		Client: cached, APIReader: apiserver, Namespace: berthNS, Config: store,
		Capacity: capacity.New(), Recorder: recorder, Provisioner: prov, NewKey: hostops.NewKey,
	}
	prov.Notify = r.Capacity.Notify // as provision.NewSSH(..., slots.Notify)
	// The hosts' owner, as the manager wires it: it judges failed cleans and keeps the hosts'
	// records; its VM side has no cloud here.
	r.Hosts = &hosts.Owner{Client: cached, APIReader: apiserver, Namespace: berthNS, Config: store,
		Capacity: r.Capacity, Recorder: recorder, Debts: r, Checker: prov}
	if tune != nil {
		tune(r)
	}
	r.init()
	if err := r.Capacity.Source(handOverPriority).Start(ctx, queue); err != nil {
		t.Fatal(err)
	}
	if err := r.Capacity.JobEnds(jobEndPriority).Start(ctx, queue); err != nil {
		t.Fatal(err)
	}
	return r, prov
}

// newAPIServer is the apiserver: berth's types and Tekton's, the status subresources their
// CRDs declare (config/crd/bases; Tekton's TaskRun), and the index the records are read by.
func newAPIServer() client.WithWatch {
	scheme := kubescheme.New()
	// A tracker without managed fields: berth never applies, and computing them for TaskRuns
	// costs tens of milliseconds a write.
	tracker := clienttesting.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())
	return fake.NewClientBuilder().WithScheme(scheme).WithObjectTracker(tracker).
		WithStatusSubresource(&pipelinev1.TaskRun{}, &berthv1.BuildHost{}).
		WithIndex(&berthv1.Allocation{}, taskRunKeyField, indexTaskRunKey).
		WithIndex(&pipelinev1.TaskRun{}, userTaskField, gate{namespace: berthNS}.indexUserTasks).
		Build()
}

// cacheView reads c as the manager's cache does with CacheOptions: only berth-labelled secrets
// outside its namespace, and TaskRuns and secrets cut down by the cache's own transforms. It
// is always current; the cache's lag is not modelled.
func cacheView(c client.WithWatch, namespace string) client.WithWatch {
	var secretT, taskRunT toolscache.TransformFunc
	for obj, by := range CacheOptions(namespace).ByObject {
		switch obj.(type) {
		case *corev1.Secret:
			secretT = by.Transform
		case *pipelinev1.TaskRun:
			taskRunT = by.Transform
		}
	}
	view := func(obj runtime.Object) (bool, error) {
		switch o := obj.(type) {
		case *corev1.Secret:
			if _, ok := o.Labels[contract.SecretLabel]; !ok || o.Namespace == namespace {
				return false, nil
			}
			out, err := secretT(o.DeepCopy())
			if err != nil {
				return false, err
			}
			*o = *out.(*corev1.Secret)
		case *pipelinev1.TaskRun:
			out, err := taskRunT(o.DeepCopy())
			if err != nil {
				return false, err
			}
			*o = *out.(*pipelinev1.TaskRun)
		}
		return true, nil
	}
	return interceptor.NewClient(c, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := c.Get(ctx, key, obj, opts...); err != nil {
				return err
			}
			if kept, err := view(obj); err != nil || kept {
				return err
			}
			return apierrors.NewNotFound(corev1.Resource("secrets"), key.Name)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			switch l := list.(type) {
			case *corev1.SecretList:
				var kept []corev1.Secret
				for i := range l.Items {
					if ok, err := view(&l.Items[i]); err != nil {
						return err
					} else if ok {
						kept = append(kept, l.Items[i])
					}
				}
				l.Items = kept
			case *pipelinev1.TaskRunList:
				for i := range l.Items {
					if _, err := view(&l.Items[i]); err != nil {
						return err
					}
				}
			}
			return nil
		},
	})
}

// harness is one controller process over one apiserver.
type harness struct {
	t      *testing.T
	ctx    context.Context
	api    client.WithWatch // the apiserver as tenants, Tekton and the test see it
	r      *Reconciler
	prov   *provisionfake.Provisioner
	events *eventLog
	queue  priorityqueue.PriorityQueue[reconcile.Request]
	// requeues holds the last timed requeue (longer than settle follows) asked per TaskRun.
	requeues map[types.NamespacedName]time.Duration
	created  int
	markers  int
	cfg      map[string]string
	faults   *interceptor.Funcs
	tune     func(*Reconciler)
}

func newHarness(t *testing.T, cfg map[string]string, tune func(*Reconciler)) *harness {
	t.Helper()
	h := &harness{t: t, api: newAPIServer(), events: &eventLog{}, cfg: cfg, tune: tune}
	h.start()
	return h
}

// start starts a controller process: a fresh ledger, provisioner and memory, on the same
// apiserver (a restart, when one ran before).
func (h *harness) start() {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	h.ctx = ctx
	h.queue = priorityqueue.New[reconcile.Request]("phases")
	h.t.Cleanup(h.queue.ShutDown)
	h.requeues = map[types.NamespacedName]time.Duration{}
	h.r, h.prov = newReconciler(h.t, ctx, h.api, h.faults, h.cfg, h.queue, h.events, h.tune)
}

// userTaskRun is a TaskRun as buildah-remote makes them, once Tekton has resolved its spec:
// PLATFORM, and the secret volume in status.taskSpec.
func userTaskRun(name, platform string) *pipelinev1.TaskRun {
	spec := &pipelinev1.TaskSpec{
		Steps: []pipelinev1.Step{{Name: "build", Image: "quay.io/buildah/stable", Script: "cat /ssh/host",
			VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh", ReadOnly: true}}}},
		Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: contract.SecretPrefix + name}}}},
	}
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: tenantNS, Name: name},
		Spec: pipelinev1.TaskRunSpec{
			Params:   pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(platform)}},
			TaskSpec: spec.DeepCopy(),
		},
	}
	tr.Status.TaskSpec = spec
	tr.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionUnknown, Reason: "Pending"})
	return tr
}

// create makes the TaskRun as the apiserver and Tekton would (a UID, a creation time one
// second after the previous TaskRun's, the resolved spec in status) and queues it as the
// watch would. It returns the TaskRun as created.
func (h *harness) create(tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	h.t.Helper()
	h.created++
	tr.UID = uuid.NewUUID()
	if tr.CreationTimestamp.IsZero() {
		tr.CreationTimestamp = metav1.NewTime(time.Now().Add(-2 * time.Minute).Truncate(time.Second).Add(time.Duration(h.created) * time.Second))
	}
	status := tr.Status.DeepCopy()
	if err := h.api.Create(h.ctx, tr); err != nil {
		h.t.Fatal(err)
	}
	tr.Status = *status
	if err := h.api.Status().Update(h.ctx, tr); err != nil {
		h.t.Fatal(err)
	}
	h.enqueue(tr.Name)
	return h.get(tr.Name)
}

// enqueue queues TaskRun names, as a watch event of the TaskRun, its secret or its record does.
func (h *harness) enqueue(names ...string) {
	for _, n := range names {
		h.queue.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: tenantNS, Name: n}})
	}
}

// settle reconciles until nothing is left to do: the queue is empty and every wake-up and
// host job's end sent so far has reached it (a marker sent through each of the two, after the
// last reconcile, came back). A requeue within a quarter second (a stale read, a restore not
// done) is followed at once; a longer one is noted in requeues. Any reconcile error fails the
// test.
func (h *harness) settle() {
	h.t.Helper()
	if errs := h.settleErrs(); len(errs) > 0 {
		h.t.Fatalf("reconcile errors: %v", errors.Join(errs...))
	}
}

// settleErrs is settle for a test that expects errors: a failed reconcile is retried (three
// times at most, at once) and its error returned.
func (h *harness) settleErrs() []error {
	h.t.Helper()
	var errs []error
	failures := map[reconcile.Request]int{}
	// The markers sent since the last reconcile, if any, and how many of the two came back.
	marker, back := "", 0
	deadline := time.Now().Add(10 * time.Second)
	for reconciles := 0; ; {
		if h.queue.Len() == 0 {
			if marker == "" {
				h.markers++
				marker, back = strconv.Itoa(h.markers), 0
				h.r.Capacity.Wake(allocation.Task{Namespace: settleNS, Name: marker})
				h.r.Capacity.Notify(settleNS + "/" + marker + "-job")
			}
			if time.Now().After(deadline) {
				h.t.Fatal("a wake-up never reached the queue")
			}
			time.Sleep(20 * time.Microsecond)
			continue
		}
		req, _, _ := h.queue.GetWithPriority()
		h.queue.Done(req)
		if req.Namespace == settleNS {
			if marker != "" && (req.Name == marker || req.Name == marker+"-job") {
				back++
			}
			if back == 2 && h.queue.Len() == 0 {
				return errs
			}
			continue
		}
		if reconciles++; reconciles > 1000 {
			h.t.Fatalf("not settled after %d reconciles (last %s)", reconciles, req)
		}
		marker = "" // what this reconcile wakes comes after any marker sent before it
		res, err := h.r.Reconcile(h.ctx, req)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", req.Name, err))
			if failures[req]++; failures[req] <= 3 {
				h.queue.Add(req)
			}
		case res.RequeueAfter > 0 && res.RequeueAfter <= 250*time.Millisecond:
			h.queue.Add(req)
		case res.RequeueAfter > 0:
			h.requeues[req.NamespacedName] = res.RequeueAfter
		default:
			delete(h.requeues, req.NamespacedName)
		}
	}
}

// finish ends the TaskRun as Tekton does when its pod ends.
func (h *harness) finish(name string) {
	h.t.Helper()
	tr := h.get(name)
	now := metav1.Now()
	tr.Status.CompletionTime = &now
	tr.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionTrue, Reason: "Succeeded"})
	if err := h.api.Status().Update(h.ctx, tr); err != nil {
		h.t.Fatal(err)
	}
	h.enqueue(name)
}

func (h *harness) get(name string) *pipelinev1.TaskRun {
	h.t.Helper()
	var tr pipelinev1.TaskRun
	if err := h.api.Get(h.ctx, types.NamespacedName{Namespace: tenantNS, Name: name}, &tr); err != nil {
		h.t.Fatal(err)
	}
	return &tr
}

func (h *harness) gone(name string) bool {
	var tr pipelinev1.TaskRun
	return apierrors.IsNotFound(h.api.Get(h.ctx, types.NamespacedName{Namespace: tenantNS, Name: name}, &tr))
}

// secret is the task's secret, nil when there is none.
func (h *harness) secret(name string) *corev1.Secret {
	h.t.Helper()
	var s corev1.Secret
	err := h.api.Get(h.ctx, types.NamespacedName{Namespace: tenantNS, Name: contract.SecretPrefix + name}, &s)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return &s
}

// record is berth's record of the TaskRun, nil when there is none.
func (h *harness) record(tr *pipelinev1.TaskRun) *berthv1.Allocation {
	h.t.Helper()
	var rec berthv1.Allocation
	err := h.api.Get(h.ctx, types.NamespacedName{Namespace: berthNS, Name: string(tr.UID)}, &rec)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return &rec
}

func (h *harness) records() []berthv1.Allocation {
	h.t.Helper()
	var list berthv1.AllocationList
	if err := h.api.List(h.ctx, &list, client.InNamespace(berthNS)); err != nil {
		h.t.Fatal(err)
	}
	return list.Items
}

// handedOver asserts the task got a build user: a secret of the contract's success shape,
// labelled and owned as the contract says, whose key is the one installed for the user. It
// returns the user and the address the secret names.
func (h *harness) handedOver(tr *pipelinev1.TaskRun) (user, address string) {
	h.t.Helper()
	s := h.secret(tr.Name)
	if s == nil {
		h.t.Fatalf("%s has no secret", tr.Name)
	}
	if got := slices.Sorted(maps.Keys(s.Data)); !slices.Equal(got, []string{"host", "id_rsa", "user-dir"}) {
		h.t.Fatalf("%s's secret has keys %v, want host, id_rsa, user-dir (error: %s)", tr.Name, got, s.Data["error"])
	}
	contractSecret(h.t, s, tr)
	user, address, ok := strings.Cut(string(s.Data["host"]), "@")
	if !ok {
		h.t.Fatalf("secret host %q is not user@address", s.Data["host"])
	}
	if want := "/home/" + user + "/build"; string(s.Data["user-dir"]) != want {
		h.t.Errorf("user-dir %q, want %q (what the host made)", s.Data["user-dir"], want)
	}
	job := h.provisionOf(user)
	signer, err := ssh.ParsePrivateKey(s.Data["id_rsa"])
	if err != nil {
		h.t.Fatalf("id_rsa is not a private key: %v", err)
	}
	installed, _, _, _, err := ssh.ParseAuthorizedKey(job.AuthorizedKey)
	if err != nil || !bytes.Equal(installed.Marshal(), signer.PublicKey().Marshal()) {
		h.t.Fatalf("the key in the secret is not the one installed for %s (%v)", user, err)
	}
	if job.Login.Address != address {
		h.t.Fatalf("the secret names %s, the user was made on %s", address, job.Login.Address)
	}
	return user, address
}

// provisionOf is the provision job that made user.
func (h *harness) provisionOf(user string) provision.Job {
	h.t.Helper()
	for _, s := range h.prov.Started() {
		if s.Kind == provisionfake.Provision && s.Job.User == user {
			return s.Job
		}
	}
	h.t.Fatalf("no provision of %s was started", user)
	return provision.Job{}
}

// hostJobs lists the host jobs this process started, in order, as "provision user@host".
func (h *harness) hostJobs() []string {
	var out []string
	for _, s := range h.prov.Started() {
		out = append(out, string(s.Kind)+" "+s.Job.User+"@"+s.Job.Login.Host)
	}
	return out
}

// contractSecret asserts what every secret berth hands a task carries: its label, and an
// owner reference to the TaskRun (what the task's garbage collection and berth's cache rely on).
func contractSecret(t *testing.T, s *corev1.Secret, tr *pipelinev1.TaskRun) {
	t.Helper()
	if s.Labels[contract.SecretLabel] != "true" {
		t.Errorf("secret %s lacks %s=true: %v", s.Name, contract.SecretLabel, s.Labels)
	}
	if !slices.ContainsFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool {
		return o.Kind == "TaskRun" && o.Name == tr.Name && o.UID == tr.UID
	}) {
		t.Errorf("secret %s is not owned by TaskRun %s (%s): %v", s.Name, tr.Name, tr.UID, s.OwnerReferences)
	}
}

// errorSecret asserts the task got an error secret and returns its message.
func (h *harness) errorSecret(tr *pipelinev1.TaskRun) string {
	h.t.Helper()
	s := h.secret(tr.Name)
	if s == nil {
		h.t.Fatalf("%s has no secret", tr.Name)
	}
	if got := slices.Collect(maps.Keys(s.Data)); !slices.Equal(got, []string{"error"}) {
		h.t.Fatalf("%s's secret has keys %v, want only error", tr.Name, got)
	}
	contractSecret(h.t, s, tr)
	return string(s.Data["error"])
}

// waiting asserts the task waits: no secret, and its labels say so.
func (h *harness) waiting(name string) {
	h.t.Helper()
	if s := h.secret(name); s != nil {
		h.t.Fatalf("%s should wait, but has a secret: %v", name, slices.Sorted(maps.Keys(s.Data)))
	}
	tr := h.get(name)
	if got := tr.Labels[contract.WaitingForPlatformLabel]; got != contract.PlatformLabelValue(s390x) {
		h.t.Fatalf("%s: waiting-for-platform %q, want %q (labels %v)", name, got, contract.PlatformLabelValue(s390x), tr.Labels)
	}
	if tr.Labels[contract.AssignedHostLabel] != "" || len(tr.Finalizers) > 0 {
		h.t.Fatalf("%s waits, yet shows host %q and finalizers %v", name, tr.Labels[contract.AssignedHostLabel], tr.Finalizers)
	}
}

// noBuildUsersLeft asserts every build user made was removed again.
func (h *harness) noBuildUsersLeft() {
	h.t.Helper()
	if left := h.prov.AllUsers(); len(left) > 0 {
		h.t.Fatalf("build users left on hosts: %v", left)
	}
}

// eventLog is an events.EventRecorder that keeps every Event.
type eventLog struct {
	mu     sync.Mutex
	events []recordedEvent
}

type recordedEvent struct {
	kind, namespace, name string
	eventType, reason     string
	note                  string
}

func (l *eventLog) Eventf(regarding, _ runtime.Object, eventType, reason, _, note string, args ...any) {
	e := recordedEvent{eventType: eventType, reason: reason, note: fmt.Sprintf(note, args...)}
	if a, err := meta.Accessor(regarding); err == nil {
		e.namespace, e.name = a.GetNamespace(), a.GetName()
	}
	switch regarding.(type) {
	case *pipelinev1.TaskRun:
		e.kind = "TaskRun"
	case *berthv1.Allocation:
		e.kind = "Allocation"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// on lists the Events of one reason on the object kind namespace/name.
func (l *eventLog) on(kind, namespace, name, reason string) []recordedEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []recordedEvent
	for _, e := range l.events {
		if e.kind == kind && e.namespace == namespace && e.name == name && e.reason == reason {
			out = append(out, e)
		}
	}
	return out
}

func (l *eventLog) warnings() []recordedEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []recordedEvent
	for _, e := range l.events {
		if e.eventType == corev1.EventTypeWarning {
			out = append(out, e)
		}
	}
	return out
}

// TestATaskGetsABuildUserInTheContractsShape: admit, reserve and provision. The task's secret
// holds the key installed for its own build user on the host, user@address and the user's
// directory; the TaskRun shows its host and platform and carries the finalizer; berth's record
// names the host and the user; and a task that goes well costs no Event.
func TestATaskGetsABuildUserInTheContractsShape(t *testing.T) {
	h := newHarness(t, hostsConfig(2, "h1", "h2"), nil)
	tr := h.create(userTaskRun("build", s390x))
	h.settle()

	user, address := h.handedOver(tr)
	if want := hostops.UserName(string(tr.UID), 1); user != want {
		t.Errorf("build user %s, want %s (the TaskRun's UID, attempt 1)", user, want)
	}
	if address != addressOf(0) {
		t.Errorf("served on %s, want h1 (%s), the first host", address, addressOf(0))
	}
	got := h.get("build")
	for k, want := range map[string]string{contract.AssignedHostLabel: "h1", contract.TargetPlatformLabel: "linux-s390x"} {
		if got.Labels[k] != want {
			t.Errorf("label %s = %q, want %q", k, got.Labels[k], want)
		}
	}
	if _, waits := got.Labels[contract.WaitingForPlatformLabel]; waits || !slices.Contains(got.Finalizers, contract.Finalizer) {
		t.Errorf("labels %v, finalizers %v: want no waiting label and berth's finalizer", got.Labels, got.Finalizers)
	}
	rec := h.record(tr)
	if rec == nil || rec.Status.Phase != berthv1.PhaseProvisioning || rec.Status.Login == nil || rec.Status.Login.Host != "h1" || rec.Status.BuildUser != user {
		t.Fatalf("record %+v, want Provisioning on h1 for %s", rec, user)
	}
	if users := h.prov.Users("h1"); !slices.Equal(users, []string{user}) {
		t.Errorf("build users on h1: %v", users)
	}
	if w := h.events.warnings(); len(w) > 0 {
		t.Errorf("warnings for a task that went well: %+v", w)
	}
}

// TestAnEndedTaskPaysItsDebtBeforeTheNextTakesItsSlot: finish and pay debts, and the ledger's
// wake-ups. With one slot, the second task waits (labelled, no secret); when the first ends,
// its labels and finalizer go at once, but its slot goes to the next task only once its build
// user is removed from the host. Nobody reconciles the waiter: the freed slot wakes it.
func TestAnEndedTaskPaysItsDebtBeforeTheNextTakesItsSlot(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1"), nil)
	first := h.create(userTaskRun("first", s390x))
	h.settle()
	firstUser, _ := h.handedOver(first)
	second := h.create(userTaskRun("second", s390x))
	third := h.create(userTaskRun("third", s390x))
	h.settle()
	h.waiting("second")
	h.waiting("third")
	if got := h.get("second").Annotations[contract.QueuePositionAnnotation]; got != "1" {
		t.Errorf("second's queue position %q, want 1", got)
	}
	if len(h.events.on("TaskRun", tenantNS, "second", "Waiting")) != 1 {
		t.Errorf("second was not told once that it waits: %+v", h.events.on("TaskRun", tenantNS, "second", "Waiting"))
	}

	// The host takes its time to remove the user.
	h.prov.Rule = func(kind provisionfake.Kind, _ provision.Job) (provision.Outcome, bool) {
		return provision.Outcome{}, kind != provisionfake.Clean
	}
	h.finish("first")
	h.settle()
	ended := h.get("first")
	if ended.Labels[contract.AssignedHostLabel] != "" || len(ended.Finalizers) > 0 {
		t.Errorf("the ended task still shows host %q, finalizers %v", ended.Labels[contract.AssignedHostLabel], ended.Finalizers)
	}
	if running := h.prov.Running(provisionfake.Clean); len(running) != 1 || running[0].User != firstUser {
		t.Fatalf("cleans running: %+v, want the one of %s", running, firstUser)
	}
	h.waiting("second") // the slot is the clean's until the user is gone

	if err := h.prov.End(provisionfake.Clean, firstUser, provision.Outcome{}); err != nil {
		t.Fatal(err)
	}
	h.settle()
	secondUser, _ := h.handedOver(second)
	h.waiting("third")
	if h.record(first) != nil {
		t.Error("the first task's record outlived its paid debt")
	}
	if users := h.prov.Users("h1"); !slices.Equal(users, []string{secondUser}) {
		t.Errorf("build users on h1: %v, want only %s", users, secondUser)
	}
	if order, want := h.hostJobs(), []string{"provision " + firstUser + "@h1", "clean " + firstUser + "@h1", "provision " + secondUser + "@h1"}; !slices.Equal(order, want) {
		t.Errorf("host jobs %v, want %v", order, want)
	}

	h.prov.Rule = nil
	h.finish("second")
	h.settle()
	h.handedOver(third)
	h.finish("third")
	h.settle()
	h.noBuildUsersLeft()
	if recs := h.records(); len(recs) > 0 {
		t.Errorf("records left: %+v", recs)
	}
}

// TestRefusedTasksGetAnErrorTheyCanActOn: admit's refusals. Each ends in a secret holding only
// an error that names what is wrong and what to do, a Warning Event on the TaskRun, no record
// and no host work; the task is labelled with its platform and nothing else of berth's.
func TestRefusedTasksGetAnErrorTheyCanActOn(t *testing.T) {
	for _, tc := range []struct {
		name     string
		config   map[string]string
		platform string
		reason   string
		want     []string
		tune     func(*Reconciler)
	}{
		{"unknown platform", hostsConfig(1, "h1"), "linux/riscv64", "UnknownPlatform",
			[]string{`platform "linux/riscv64" is not configured`, s390x, "Fix the PLATFORM param"}, nil},
		{"namespace not allowed", with(hostsConfig(1, "h1"), "allowed-namespaces", "team-.*"), s390x, "NamespaceNotAllowed",
			[]string{"namespace tenant may not use multi-platform builds", "allowed-namespaces"}, nil},
		{"no config", nil, s390x, "ConfigInvalid",
			[]string{"no valid host configuration", contract.ConfigLabel, berthNS}, nil},
		{"dynamic platform without a fleet", with(hostsConfig(1, "h1"), "dynamic-platforms", "linux/arm64",
			"dynamic.linux-arm64.type", "aws", "dynamic.linux-arm64.max-instances", "2", "dynamic.linux-arm64.ssh-secret", "aws-ssh",
			"dynamic.linux-arm64.region", "us-east-1", "dynamic.linux-arm64.ami", "ami-0123456789abcdef0",
			"dynamic.linux-arm64.instance-type", "m6g.large", "dynamic.linux-arm64.key-name", "berth",
			"dynamic.linux-arm64.aws-secret", "aws-creds"), "linux/arm64", "PlatformUnsupported",
			[]string{"platform linux/arm64 is configured as dynamic", "static host"}, func(r *Reconciler) { r.Hosts = nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.config, tc.tune)
			tr := h.create(userTaskRun("refused", tc.platform))
			h.settle()
			msg := h.errorSecret(tr)
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
			if e := h.events.on("TaskRun", tenantNS, "refused", tc.reason); len(e) != 1 || e[0].eventType != corev1.EventTypeWarning {
				t.Errorf("want one Warning %s on the TaskRun, got %+v", tc.reason, e)
			}
			got := h.get("refused")
			if got.Labels[contract.TargetPlatformLabel] != contract.PlatformLabelValue(tc.platform) || got.Labels[contract.AssignedHostLabel] != "" ||
				got.Labels[contract.WaitingForPlatformLabel] != "" || len(got.Finalizers) > 0 {
				t.Errorf("labels %v, finalizers %v", got.Labels, got.Finalizers)
			}
			if recs := h.records(); len(recs) > 0 || len(h.prov.Started()) > 0 {
				t.Errorf("a refused task left records %+v or host jobs %v", recs, h.hostJobs())
			}
		})
	}
}

func with(data map[string]string, kv ...string) map[string]string {
	out := maps.Clone(data)
	for i := 0; i < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// TestALocalPlatformIsAnsweredWithLocalhost: a local platform holds no host. A TaskRun whose
// pod is pinned to the platform's nodes (as berth's webhook pins it) gets host=localhost and
// nothing else, and the assigned-host label localhost; one not pinned gets an error naming
// the webhook, since it could build for the wrong architecture.
func TestALocalPlatformIsAnsweredWithLocalhost(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1"), nil)
	pinned := userTaskRun("native", amd64)
	node, _ := localaffinity.NodeOf(amd64)
	pinned.Spec.PodTemplate = &pod.Template{Affinity: &corev1.Affinity{NodeAffinity: localaffinity.Require(nil, node)}}
	native := h.create(pinned)
	loose := h.create(userTaskRun("loose", amd64))
	h.settle()

	s := h.secret("native")
	if s == nil || len(s.Data) != 1 || string(s.Data["host"]) != contract.Localhost {
		t.Fatalf("local secret %v, want only host=localhost", s)
	}
	contractSecret(t, s, native)
	got := h.get("native")
	if got.Labels[contract.AssignedHostLabel] != contract.Localhost || got.Labels[contract.TargetPlatformLabel] != "linux-amd64" || len(got.Finalizers) > 0 {
		t.Errorf("labels %v, finalizers %v: want assigned-host localhost and no finalizer", got.Labels, got.Finalizers)
	}
	if msg := h.errorSecret(loose); !strings.Contains(msg, "must run on a linux/amd64 node") || !strings.Contains(msg, localaffinity.WebhookName) {
		t.Errorf("the unpinned task's error %q does not say why and what to check", msg)
	}
	if recs := h.records(); len(recs) > 0 || len(h.prov.Started()) > 0 {
		t.Errorf("local tasks left records %+v or host jobs %v", recs, h.hostJobs())
	}
	// A later pass (the secret's own watch event) changes nothing.
	h.enqueue("native", "loose")
	h.settle()
	if again := h.secret("native"); again.ResourceVersion != s.ResourceVersion {
		t.Error("a second pass wrote the local secret again")
	}
}

// TestAFailedProvisionMovesTheTaskToAnotherHost: provision's failover. Creating the user fails
// on h1: the task gets a user on h2 under a new name, failed-hosts names h1, the tenant's Event
// says what kind of failure without the host's output, the operator's Event on the record has
// it. What the attempt may have left on h1 is cleaned, and h1's slot is free for the next task.
func TestAFailedProvisionMovesTheTaskToAnotherHost(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1", "h2"), nil)
	const stderr = "useradd: cannot lock /etc/passwd; try again later"
	var failedOnce bool
	h.prov.Rule = func(kind provisionfake.Kind, j provision.Job) (provision.Outcome, bool) {
		if kind == provisionfake.Provision && j.Login.Host == "h1" && !failedOnce {
			failedOnce = true
			return provision.Outcome{Err: &remote.RemoteError{Host: "h1", Command: "creating user " + j.User, ExitCode: 1, Stderr: stderr}}, true
		}
		return provision.Outcome{}, true
	}
	tr := h.create(userTaskRun("failover", s390x))
	h.settle()

	user, address := h.handedOver(tr)
	if want := hostops.UserName(string(tr.UID), 2); user != want || address != addressOf(1) {
		t.Errorf("served as %s@%s, want %s@%s (h2, attempt 2)", user, address, want, addressOf(1))
	}
	got := h.get("failover")
	if got.Annotations[contract.FailedHostsAnnotation] != "h1" || got.Labels[contract.AssignedHostLabel] != "h2" {
		t.Errorf("failed-hosts %q, assigned-host %q: want h1, h2", got.Annotations[contract.FailedHostsAnnotation], got.Labels[contract.AssignedHostLabel])
	}
	tenant := h.events.on("TaskRun", tenantNS, "failover", "ProvisioningFailed")
	if len(tenant) != 1 || !strings.Contains(tenant[0].note, "creating the build user failed on the host") || strings.Contains(tenant[0].note, stderr) {
		t.Errorf("tenant's Event %+v: want the kind of failure, not the host's output", tenant)
	}
	operator := h.events.on("Allocation", berthNS, string(tr.UID), "ProvisioningFailed")
	if len(operator) != 1 || !strings.Contains(operator[0].note, stderr) {
		t.Errorf("operator's Event %+v: want the host's output", operator)
	}
	if left := h.prov.Users("h1"); len(left) > 0 {
		t.Errorf("h1 still has %v", left)
	}
	cleaned := slices.ContainsFunc(h.prov.Started(), func(s provisionfake.Started) bool {
		return s.Kind == provisionfake.Clean && s.Job.Login.Host == "h1" && s.Job.User == hostops.UserName(string(tr.UID), 1)
	})
	if !cleaned {
		t.Error("what the failed attempt may have left on h1 was not cleaned")
	}
	next := h.create(userTaskRun("next", s390x))
	h.settle()
	if _, address := h.handedOver(next); address != addressOf(0) {
		t.Errorf("the next task went to %s, want h1's freed slot", address)
	}
}

// TestAllHostsFailingEndsInAnErrorSecret: when no host can be provisioned, the task is not left
// waiting: its error names the platform and every host that failed. Hosts never reached are
// owed nothing, so the task's end leaves no record behind.
func TestAllHostsFailingEndsInAnErrorSecret(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1", "h2"), nil)
	h.prov.Rule = func(kind provisionfake.Kind, j provision.Job) (provision.Outcome, bool) {
		return provision.Outcome{Err: &remote.UnreachableError{Host: j.Login.Host, Err: errors.New("connection refused")}}, true
	}
	tr := h.create(userTaskRun("stranded", s390x))
	h.settle()
	msg := h.errorSecret(tr)
	for _, w := range []string{"no host of platform linux/s390x could be provisioned", "h1", "h2"} {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q lacks %q", msg, w)
		}
	}
	if recs := h.records(); len(recs) > 0 {
		t.Errorf("records left for hosts never reached: %+v", recs)
	}
	if slices.ContainsFunc(h.prov.Started(), func(s provisionfake.Started) bool { return s.Kind == provisionfake.Clean }) {
		t.Error("berth cleaned hosts it never logged in to")
	}
}

// TestADeletedTaskRunReleasesItsSlot: a TaskRun deleted while it holds a host is held by
// berth's finalizer only until its cleanup is under way; then it goes, its build user is
// removed, the next task gets the slot, and the secret it leaves behind is deleted.
func TestADeletedTaskRunReleasesItsSlot(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1"), nil)
	doomed := h.create(userTaskRun("doomed", s390x))
	h.settle()
	h.handedOver(doomed)
	next := h.create(userTaskRun("next", s390x))
	h.settle()
	h.waiting("next")

	if err := h.api.Delete(h.ctx, h.get("doomed")); err != nil {
		t.Fatal(err)
	}
	h.enqueue("doomed")
	h.settle()
	if !h.gone("doomed") {
		t.Fatalf("the deleted TaskRun is held: finalizers %v", h.get("doomed").Finalizers)
	}
	h.handedOver(next)
	if h.record(doomed) != nil {
		t.Error("the deleted task's record is left")
	}
	// Its deletion's own event reconciles the name once more.
	h.enqueue("doomed")
	h.settle()
	if s := h.secret("doomed"); s != nil {
		t.Error("the deleted task's secret is left")
	}
	h.finish("next")
	h.settle()
	h.noBuildUsersLeft()
}

// TestATenantsEditOfTheSecretIsAnsweredWithAnError: guard the secret. A secret changed or
// deleted after berth wrote it can no longer be trusted: it is written back holding only an
// error, the record says never to touch the user again but to remove it, and the user is still
// removed when the task ends.
func TestATenantsEditOfTheSecretIsAnsweredWithAnError(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(context.Context, client.Client, *corev1.Secret) error
	}{
		{"changed", func(ctx context.Context, c client.Client, s *corev1.Secret) error {
			s.Data["host"] = []byte("root@10.9.9.9")
			return c.Update(ctx, s)
		}},
		{"deleted", func(ctx context.Context, c client.Client, s *corev1.Secret) error { return c.Delete(ctx, s) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, hostsConfig(1, "h1"), nil)
			tr := h.create(userTaskRun("guarded", s390x))
			h.settle()
			user, _ := h.handedOver(tr)
			if err := tc.edit(h.ctx, h.api, h.secret("guarded")); err != nil {
				t.Fatal(err)
			}
			h.enqueue("guarded") // the secret's watch event
			h.settle()
			if msg := h.errorSecret(tr); !strings.Contains(msg, "was changed or deleted after berth wrote it") || !strings.Contains(msg, "Re-run the task") {
				t.Errorf("error %q", msg)
			}
			if rec := h.record(tr); rec == nil || !rec.Status.SecretTampered {
				t.Errorf("record %+v does not say the secret was tampered with", rec)
			}
			if len(h.events.on("TaskRun", tenantNS, "guarded", "SecretTampered")) != 1 {
				t.Error("no SecretTampered Event on the TaskRun")
			}
			// Berth's own error secret is not taken for another edit.
			h.enqueue("guarded")
			h.settle()
			if n := len(h.events.on("TaskRun", tenantNS, "guarded", "SecretTampered")); n != 1 {
				t.Errorf("%d SecretTampered Events, want 1", n)
			}
			h.finish("guarded")
			h.settle()
			if slices.Contains(h.prov.Users("h1"), user) || len(h.records()) > 0 {
				t.Errorf("after the task ended: users %v, records %+v", h.prov.Users("h1"), h.records())
			}
		})
	}
}

// TestATenantsEditOfTheMirrorsIsUndone: the labels and finalizer are berth's mirrors of its
// record. A tenant who takes them off (or claims a wait) sees them put back with a Warning, and
// nothing else changes; a second edit right away is put back only after MirrorRevertInterval,
// so an edit loop cannot drive berth's writes.
func TestATenantsEditOfTheMirrorsIsUndone(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1"), nil)
	tr := h.create(userTaskRun("mirrored", s390x))
	h.settle()
	user, _ := h.handedOver(tr)
	want := h.get("mirrored")

	edit := func() {
		t.Helper()
		got := h.get("mirrored")
		delete(got.Labels, contract.AssignedHostLabel)
		got.Labels[contract.WaitingForPlatformLabel] = "linux-s390x"
		got.Finalizers = nil
		if err := h.api.Update(h.ctx, got); err != nil {
			t.Fatal(err)
		}
		h.enqueue("mirrored")
		h.settle()
	}
	edit()
	got := h.get("mirrored")
	if !maps.Equal(got.Labels, want.Labels) || !slices.Equal(got.Finalizers, want.Finalizers) {
		t.Errorf("after the revert: labels %v finalizers %v, want %v %v", got.Labels, got.Finalizers, want.Labels, want.Finalizers)
	}
	if e := h.events.on("TaskRun", tenantNS, "mirrored", "MirrorReverted"); len(e) != 1 || e[0].eventType != corev1.EventTypeWarning {
		t.Errorf("MirrorReverted Events %+v, want one Warning", e)
	}
	if rec := h.record(tr); rec.Status.Phase != berthv1.PhaseProvisioning || rec.Status.BuildUser != user || len(h.prov.Started()) != 1 {
		t.Errorf("the edit changed more than the mirrors: record %+v, host jobs %v", rec.Status, h.hostJobs())
	}

	edit()
	if got := h.get("mirrored"); got.Labels[contract.AssignedHostLabel] != "" {
		t.Error("a second edit was reverted at once")
	}
	if after := h.requeues[types.NamespacedName{Namespace: tenantNS, Name: "mirrored"}]; after <= 0 || after > h.r.MirrorRevertInterval {
		t.Errorf("the second revert is due in %s, want within MirrorRevertInterval (%s)", after, h.r.MirrorRevertInterval)
	}
}

// TestAWaitTimeoutEndsInAnErrorSecret: with WaitTimeout set, a task that has waited that long
// since it was created gets an error instead of waiting on, and leaves the line.
func TestAWaitTimeoutEndsInAnErrorSecret(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1"), func(r *Reconciler) { r.WaitTimeout = 10 * time.Minute })
	h.create(userTaskRun("holder", s390x))
	h.settle()
	late := userTaskRun("late", s390x)
	late.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Hour))
	lateTR := h.create(late)
	fresh := h.create(userTaskRun("fresh", s390x))
	h.settle()
	if msg := h.errorSecret(lateTR); !strings.Contains(msg, "no host of platform linux/s390x became free within 10m0s") {
		t.Errorf("error %q", msg)
	}
	h.waiting("fresh")
	if after := h.requeues[types.NamespacedName{Namespace: tenantNS, Name: "fresh"}]; after <= 0 || after > 10*time.Minute {
		t.Errorf("the waiting task asks to be looked at again in %s, want within its wait timeout", after)
	}
	h.finish("holder")
	h.settle()
	h.handedOver(fresh)
}

// TestAHostAddedToTheConfigServesAWaiter: the config callbacks set up before the first
// Reconcile. A host added by a config change takes a waiting task at once, woken by the change.
func TestAHostAddedToTheConfigServesAWaiter(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1"), nil)
	h.create(userTaskRun("holder", s390x))
	waiter := h.create(userTaskRun("waiter", s390x))
	h.settle()
	h.waiting("waiter")
	cfg, problems := config.Parse(hostsConfig(1, "h1", "h2"))
	if len(cfg.Fatal()) > 0 {
		t.Fatal(problems)
	}
	h.r.Config.Apply(cfg)
	h.settle()
	if _, address := h.handedOver(waiter); address != addressOf(1) {
		t.Errorf("the waiter went to %s, want the new host h2", address)
	}
}

// TestAWaiterWokenBeforeIsWokenAgainForAFreedSlot: a wake-up is sent once until the task's
// reconcile starts (the capacity folds repeats), so a waiter woken for another reason (the
// queue position's refresh, capacity that came and went) and reconciled while it still had
// to wait must still be woken when a slot is freed for it.
func TestAWaiterWokenBeforeIsWokenAgainForAFreedSlot(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1"), nil)
	h.create(userTaskRun("holder", s390x))
	waiter := h.create(userTaskRun("waiter", s390x))
	h.settle()
	h.r.Capacity.Wake(allocation.Task{Namespace: tenantNS, Name: "waiter"})
	h.settle()
	h.waiting("waiter")
	h.finish("holder")
	h.settle()
	h.handedOver(waiter)
}

// TestARestartRedoesAUserBeingMade: restore. berth restarts while a build user is being made:
// the new process does not have its key, so that user is owed a clean and a new one is made on
// the same slot; the ledger rebuilt from the records keeps the slot, so the waiting task still
// waits.
func TestARestartRedoesAUserBeingMade(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1"), nil)
	h.prov.Rule = func(provisionfake.Kind, provision.Job) (provision.Outcome, bool) { return provision.Outcome{}, false }
	tr := h.create(userTaskRun("interrupted", s390x))
	h.create(userTaskRun("waiter", s390x))
	h.settle()
	if s := h.secret("interrupted"); s != nil {
		t.Fatal("a secret before the user was made")
	}
	h.waiting("waiter")

	h.start() // the old process is gone, with its key and its running job
	h.enqueue("interrupted", "waiter")
	h.settle()
	user, _ := h.handedOver(tr)
	if want := hostops.UserName(string(tr.UID), 2); user != want {
		t.Errorf("served as %s, want a new user %s", user, want)
	}
	old := hostops.UserName(string(tr.UID), 1)
	if !slices.ContainsFunc(h.prov.Started(), func(s provisionfake.Started) bool {
		return s.Kind == provisionfake.Clean && s.Job.User == old
	}) {
		t.Errorf("the half-made user %s was not cleaned", old)
	}
	h.waiting("waiter")
	h.finish("interrupted")
	h.settle()
	h.handedOver(h.get("waiter"))
}

// TestAFailedSecretWriteNeverMakesASecondUser: the secret's write fails once after the user was
// made; the retry hands over that same user, and the host was worked on once.
func TestAFailedSecretWriteNeverMakesASecondUser(t *testing.T) {
	failed := false
	faults := &interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		if _, ok := obj.(*corev1.Secret); ok && obj.GetNamespace() == tenantNS && !failed {
			failed = true
			return apierrors.NewServiceUnavailable("etcd leader changed")
		}
		return c.Create(ctx, obj, opts...)
	}}
	h := &harness{t: t, api: newAPIServer(), events: &eventLog{}, cfg: hostsConfig(1, "h1"), faults: faults}
	h.start()
	tr := h.create(userTaskRun("retried", s390x))
	if errs := h.settleErrs(); len(errs) != 1 || !apierrors.IsServiceUnavailable(errors.Unwrap(errs[0])) {
		t.Fatalf("reconcile errors %v, want the one injected", errs)
	}
	user, _ := h.handedOver(tr)
	if user != hostops.UserName(string(tr.UID), 1) || len(h.prov.Started()) != 1 {
		t.Errorf("served as %s after host jobs %v, want attempt 1 made once", user, h.hostJobs())
	}
}

// TestAnErrorSeenLateIsToldOnce: a reconcile that runs before the cache has the task's error
// secret answers the task again; the answer in place is kept, and the task is counted and told
// once (berth_error_secrets_total, a reason's own counter such as
// berth_local_affinity_missing_total, and the Event), not once per stale read.
func TestAnErrorSeenLateIsToldOnce(t *testing.T) {
	lagging := false
	faults := &interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if _, ok := obj.(*corev1.Secret); ok && key.Namespace == tenantNS && lagging {
			return apierrors.NewNotFound(corev1.Resource("secrets"), key.Name)
		}
		return c.Get(ctx, key, obj, opts...)
	}}
	h := &harness{t: t, api: newAPIServer(), events: &eventLog{}, cfg: hostsConfig(1, "h1"), faults: faults}
	h.start()
	counters := map[string]prometheus.Counter{
		"UnknownPlatform":      errorSecrets.WithLabelValues("UnknownPlatform"),
		"LocalAffinityMissing": errorSecrets.WithLabelValues("LocalAffinityMissing"),
		"local affinity":       localAffinityMissing.WithLabelValues(amd64),
	}
	before := map[string]float64{}
	for name, c := range counters {
		before[name] = testutil.ToFloat64(c)
	}
	tasks := map[string]string{"refused": "UnknownPlatform", "unpinned": "LocalAffinityMissing"}
	h.create(userTaskRun("refused", "linux/riscv64"))
	h.create(userTaskRun("unpinned", amd64)) // no webhook pinned its pod to amd64 nodes
	h.settle()
	first := map[string]types.UID{}
	for name := range tasks {
		first[name] = h.secret(name).UID
	}
	lagging = true
	h.enqueue("refused", "unpinned")
	h.settle()
	lagging = false
	for name, reason := range tasks {
		if now := h.secret(name); now.UID != first[name] {
			t.Errorf("%s: the error secret was written again (uid %s → %s)", name, first[name], now.UID)
		}
		if e := h.events.on("TaskRun", tenantNS, name, reason); len(e) != 1 {
			t.Errorf("%s: want one %s Event, got %+v", name, reason, e)
		}
	}
	for name, c := range counters {
		if got := testutil.ToFloat64(c) - before[name]; got != 1 {
			t.Errorf("counter %s grew by %v, want 1", name, got)
		}
	}
}

// TestWithOneTimeKeysTheSecretHoldsATokenForTheKey: readySecret with the OTP option. The
// secret has the contract's OTP shape and no key; the token redeems the installed key once.
func TestWithOneTimeKeysTheSecretHoldsATokenForTheKey(t *testing.T) {
	const url = "https://berth-otp.berth.svc:8443/otp"
	var keys *keyserver.Store
	h := &harness{t: t, api: newAPIServer(), events: &eventLog{}, cfg: hostsConfig(1, "h1")}
	keys = &keyserver.Store{Client: h.api, Namespace: berthNS}
	h.tune = func(r *Reconciler) {
		r.OTP = &OneTimeKeys{Keys: keys, URL: url, CA: func() ([]byte, error) { return []byte("-----BEGIN CERTIFICATE-----\n"), nil }}
	}
	h.start()
	tr := h.create(userTaskRun("otp", s390x))
	h.settle()
	s := h.secret("otp")
	if s == nil {
		t.Fatal("no secret")
	}
	if got := slices.Sorted(maps.Keys(s.Data)); !slices.Equal(got, []string{"host", "otp", "otp-ca", "otp-server", "user-dir"}) {
		t.Fatalf("secret keys %v, want host, otp, otp-ca, otp-server, user-dir (error: %s)", got, s.Data["error"])
	}
	contractSecret(t, s, tr)
	if string(s.Data["otp-server"]) != url {
		t.Errorf("otp-server %q, want %q", s.Data["otp-server"], url)
	}
	user, _, _ := strings.Cut(string(s.Data["host"]), "@")
	redeemed, err := keys.Redeem(h.ctx, string(s.Data["otp"]))
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(redeemed.Key)
	if err != nil {
		t.Fatal(err)
	}
	installed, _, _, _, err := ssh.ParseAuthorizedKey(h.provisionOf(user).AuthorizedKey)
	if err != nil || !bytes.Equal(installed.Marshal(), signer.PublicKey().Marshal()) {
		t.Fatalf("the redeemed key is not the one installed for %s (%v)", user, err)
	}
	if _, err := keys.Redeem(h.ctx, string(s.Data["otp"])); !errors.Is(err, keyserver.ErrUnknown) {
		t.Errorf("a second redemption: %v, want ErrUnknown", err)
	}
}

// TestAFailedCleanHoldsTheSlotUntilItPasses: pay debts with a host that fails the clean. The
// record keeps the debt (Cleaning, counted), the operator gets a Warning on the record, the
// clean is retried after a backoff, and the slot stays the debt's: the waiting task gets it
// only once the user is gone.
func TestAFailedCleanHoldsTheSlotUntilItPasses(t *testing.T) {
	clock := newTestClock()
	h := newHarness(t, hostsConfig(1, "h1"), func(r *Reconciler) { r.now = clock.now })
	ended := h.create(userTaskRun("ended", s390x))
	h.settle()
	user, _ := h.handedOver(ended)
	waiter := h.create(userTaskRun("waiter", s390x))
	h.settle()
	h.waiting("waiter")

	h.prov.Rule = func(kind provisionfake.Kind, j provision.Job) (provision.Outcome, bool) {
		if kind == provisionfake.Clean {
			return provision.Outcome{Err: &remote.RemoteError{Host: "h1", Command: "removing user " + j.User, ExitCode: 1, Stderr: "userdel: user is currently used by process 4242"}}, true
		}
		return provision.Outcome{}, true
	}
	h.finish("ended")
	h.settle()
	rec := h.record(ended)
	if rec == nil || rec.Status.Phase != berthv1.PhaseCleaning || len(rec.Status.Debts) != 1 || rec.Status.Debts[0].BuildUser != user || rec.Status.CleanFailures != 1 {
		t.Fatalf("record after a failed clean: %+v, want Cleaning with %s owed, one failure", rec, user)
	}
	if e := h.events.on("Allocation", berthNS, rec.Name, "CleanFailed"); len(e) != 1 || !strings.Contains(e[0].note, "currently used by process 4242") {
		t.Errorf("CleanFailed Events on the record: %+v", e)
	}
	if after := h.requeues[types.NamespacedName{Namespace: tenantNS, Name: "ended"}]; after != time.Second {
		t.Errorf("the clean is retried in %s, want the first backoff, 1s", after)
	}
	h.waiting("waiter")

	h.prov.Rule = nil
	clock.advance(time.Second)
	h.enqueue("ended") // the backoff's requeue
	h.settle()
	if h.record(ended) != nil {
		t.Error("the record outlived its paid debt")
	}
	waiterUser, _ := h.handedOver(waiter)
	if users := h.prov.Users("h1"); !slices.Equal(users, []string{waiterUser}) {
		t.Errorf("build users on h1: %v, want only %s", users, waiterUser)
	}
}

// TestARestartKeepsAHandedOverUser: restore. After a restart, a task whose user was handed over
// keeps it (the secret's seal tells; the host is not worked on again), and the ledger rebuilt
// from the records keeps its slot: the waiter, reconciled first, still waits.
func TestARestartKeepsAHandedOverUser(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "h1"), nil)
	holder := h.create(userTaskRun("holder", s390x))
	h.settle()
	user, _ := h.handedOver(holder)
	handed := h.secret("holder")
	h.create(userTaskRun("waiter", s390x))
	h.settle()
	h.waiting("waiter")
	rec := h.record(holder)

	h.start()
	h.enqueue("waiter", "holder")
	h.settle()
	h.waiting("waiter")
	if s := h.secret("holder"); s.ResourceVersion != handed.ResourceVersion {
		t.Error("the handed-over secret was written again after the restart")
	}
	if after := h.record(holder); after == nil || after.ResourceVersion != rec.ResourceVersion || after.Status.Attempt != 1 {
		t.Errorf("the record was written after the restart: %+v, was resourceVersion %s", after, rec.ResourceVersion)
	}
	if jobs := h.hostJobs(); len(jobs) > 0 {
		t.Errorf("the restarted controller worked on hosts: %v", jobs)
	}
	h.finish("holder")
	h.settle()
	h.handedOver(h.get("waiter"))
	if !slices.ContainsFunc(h.prov.Started(), func(s provisionfake.Started) bool {
		return s.Kind == provisionfake.Clean && s.Job.User == user && s.Job.Login.Host == "h1"
	}) {
		t.Errorf("%s was not removed when its task ended after the restart", user)
	}
}
