package memory_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/tektoncd/pipeline/pkg/apis/pipeline/pod"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/bench"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

// The sizes a tenant can give its objects, each as large as the apiserver takes it:
//   - a Secret's data, keys included, at most 1 MiB (k8s.io/kubernetes pkg/apis/core:
//     MaxSecretSize);
//   - an object's annotations, keys included, at most 256 KiB (apimachinery's
//     TotalAnnotationSizeLimitB), which leaves no room for berth's own (see taskMirror.patch);
//   - a TaskRun (a custom resource, stored as JSON) below etcd's request limit of 1.5 MiB
//     (--max-request-bytes): 1 MiB of params and 256 KiB of annotations leave it ~200 KiB.
const (
	maxSecretData = 1 << 20
	paramBytes    = 1 << 20
	floodSecrets  = 500
	floodTaskRuns = 500
	answeredTasks = 20 // error secrets of berth's, inflated by the tenant
	heldTasks     = 2  // the flood's cap (max-tasks-per-namespace); the last slot serves others
	heapPerObject = 4 << 10
	// TaskRuns of each kind whose megabyte is in metadata or spec berth reads part of:
	// finalizers, and the required node affinity of the pod template (see primeMeta).
	metaTaskRuns = 20
	metaKinds    = 5
	// The outside namespace's two kinds with PLATFORM, each answered with an error secret.
	outsideAnswered = 2 * metaTaskRuns
	floodWorkers    = 4
	tenantBlobName  = "blob"
)

// TestTenantObjectsDoNotSizeControllerMemory floods a tenant namespace with the largest objects
// the apiserver accepts, all of which berth's controller watches: Secrets carrying berth's
// label, TaskRuns of a platform it serves with 1 MiB of params and 256 KiB of annotations,
// and berth's own task secrets blown up to 1 MiB by the tenant. The controller runs as the
// real binary in a child process. What it keeps of them, its live heap (heap?gc=1, from the
// heap profile) less its watches' wire buffers (see splitHeap), may grow by at most
// heapPerObject per object; its peak RSS must stay under the memory limit the shipped
// Deployment sets, also when it starts again with all of it there; and it must still serve
// tasks.
func TestTenantObjectsDoNotSizeControllerMemory(t *testing.T) {
	limitMiB := shippedMemoryLimitMiB(t)
	bin := buildBerth(t)
	began := time.Now()
	phase := func(what string) {
		t.Logf("%s (%s into the test)", what, time.Since(began).Round(time.Second))
	}
	flood := stacktest.NewTenant(t, stack, "flood")
	other := stacktest.NewTenant(t, stack, "other")
	// A namespace berth does not serve (allowed-namespaces): its TaskRuns get an error secret,
	// and the cache still holds them.
	outside := stacktest.NewTenant(t, stack, "outside")
	// One slot per host. The flood's namespace may hold heldTasks of them at once, so its
	// TaskRuns all wait (none is ever provisioned) and the last slot shows berth serving
	// another tenant meanwhile.
	applyConfig(t, 1, map[string]string{"max-tasks-per-namespace": fmt.Sprint(heldTasks),
		"allowed-namespaces": regexp.QuoteMeta(flood.Namespace) + "," + regexp.QuoteMeta(other.Namespace)})
	ctx := context.Background()

	// The stack's in-process controller gives way to the real binary. Nothing is cleaned up
	// after: the control plane is this package's alone and goes with it (deleting a gigabyte
	// of 1 MiB objects costs the apiserver more memory than writing them).
	if err := stack.StopController(); err != nil {
		t.Fatal(err)
	}
	child, pprofAddr := startChild(t, bin)

	// Warm up: one task served means caches synced and the config read.
	warm := other.Create(t, other.TaskRun("warm", platform))
	ready(t, warm)
	finish(t, warm)
	settled(t, other.Namespace)

	// The flood's slots taken; once the heap is measured, each held task's secret is blown up
	// by the tenant: berth sees the tampering (a direct read) and writes an error in its place.
	held := make([]*pipelinev1.TaskRun, heldTasks)
	for i := range held {
		held[i] = flood.Create(t, flood.TaskRun(fmt.Sprintf("held-%d", i), platform))
	}
	for _, tr := range held {
		ready(t, tr)
	}
	quiet(t, pprofAddr)
	before := splitHeap(t, pprofAddr)
	phase(fmt.Sprintf("before the flood: live heap %s (%s of it wire buffers), peak RSS %.0f MiB",
		kib(before.total), kib(before.wire), child.PeakRSSMiB()))
	saveHeap(t, before, "before")
	for _, tr := range held {
		inflate(t, flood, contract.SecretPrefix+tr.Name)
	}
	// Tasks berth answers with an error secret at once, which it keeps (owned, labelled) for
	// as long as the task lives; the tenant blows each up.
	var answered []*pipelinev1.TaskRun
	for i := range answeredTasks {
		answered = append(answered, flood.Create(t, flood.TaskRun(fmt.Sprintf("answered-%d", i), "linux/no-such-arch")))
	}
	for _, tr := range answered {
		eventually(t, tr.Name+" has berth's error secret", func() (bool, error) {
			var s corev1.Secret
			err := admin().Get(ctx, client.ObjectKey{Namespace: flood.Namespace, Name: contract.SecretPrefix + tr.Name}, &s)
			return err == nil && len(s.Data["error"]) > 0, client.IgnoreNotFound(err)
		})
		inflate(t, flood, contract.SecretPrefix+tr.Name)
	}

	phase("berth's own secrets inflated")
	start := time.Now()
	prime(t, flood, "big", floodSecrets)
	t.Logf("the tenant wrote %d Secrets of 1 MiB and %d TaskRuns of 1.25 MiB in %s", floodSecrets, floodTaskRuns, time.Since(start).Round(time.Second))
	start = time.Now()
	primeMeta(t, flood, outside)
	t.Logf("the tenants wrote %d TaskRuns with a megabyte of finalizers or of node affinity in %s", metaKinds*metaTaskRuns, time.Since(start).Round(time.Second))
	start = time.Now()
	// berth keeps no record of a task that never held a slot: the waiting label it writes
	// on each (a patch answered with the TaskRun's metadata: taskMirror.write) shows it in line.
	floodEventually(t, "berth has labelled every big TaskRun waiting", func() (bool, error) {
		n, err := waitingIn(ctx, flood.Namespace)
		return n >= floodTaskRuns, err
	})
	for _, tr := range held {
		eventually(t, tr.Name+"'s inflated secret was replaced by berth's error", func() (bool, error) {
			var s corev1.Secret
			err := admin().Get(ctx, client.ObjectKey{Namespace: flood.Namespace, Name: contract.SecretPrefix + tr.Name}, &s)
			return err == nil && len(s.Data[tenantBlobName]) == 0 && len(s.Data["error"]) > 0, client.IgnoreNotFound(err)
		})
	}
	t.Logf("berth labelled them all waiting within %s", time.Since(start).Round(time.Second))

	// What the tenant added since the heap was measured: the flood, and the answered tasks
	// with their secrets (the held tasks' secrets it only blew up).
	// berth answers the outside namespace's TaskRuns of its platform with an error secret each.
	floodEventually(t, "berth has answered every TaskRun of the namespace it does not serve", func() (bool, error) {
		var list corev1.SecretList
		err := admin().List(ctx, &list, client.InNamespace(outside.Namespace))
		return len(list.Items) >= outsideAnswered, err
	})
	objects := int64(floodSecrets + floodTaskRuns + 2*answeredTasks + metaKinds*metaTaskRuns + outsideAnswered)
	check := func(when, profileName string) {
		t.Helper()
		if how, dead := child.Died(); dead {
			t.Fatalf("%s: the controller died: %s", when, how)
		}
		quiet(t, pprofAddr)
		now, rss := splitHeap(t, pprofAddr), child.PeakRSSMiB()
		saveHeap(t, now, profileName)
		kept := now.kept - before.kept
		t.Logf("%s: live heap %s (%+d bytes); kept of the tenant's objects %+d bytes, %.0f bytes per object; wire buffers %s (%s before); peak RSS %.0f MiB of the shipped limit %d MiB",
			when, kib(now.total), now.total-before.total, kept, float64(kept)/float64(objects), kib(now.wire), kib(before.wire), rss, limitMiB)
		if kept > objects*heapPerObject {
			t.Errorf("%s: berth keeps %s more for %d tenant objects: more than %d bytes each; what grew most, by the function that allocated it:\n%s",
				when, kib(kept), objects, heapPerObject, grown(before, now, 15))
		}
		if rss >= float64(limitMiB) {
			t.Errorf("%s: peak RSS %.0f MiB reached the shipped memory limit of %d MiB", when, rss, limitMiB)
		}
	}
	check("with the flood in place", "flood")
	serves(t, other, "after-flood")
	phase("served another tenant with the flood in place")

	// As a pod OOM-killed or rescheduled would: the objects are all there when it starts.
	if err := child.Restart(); err != nil {
		t.Fatal(err)
	}
	waitPprof(t, pprofAddr)
	serves(t, other, "after-restart")
	phase("served another tenant after a restart")
	check("after a restart with the flood in place", "restart")
}

// prime is the tenant writing n labelled Secrets of 1 MiB and n TaskRuns with 1 MiB of params
// and 256 KiB of annotations, named prefix-<i>.
func prime(t *testing.T, tn *stacktest.Tenant, prefix string, n int) {
	t.Helper()
	ctx := context.Background()
	parallel(t, n, func(i int) error {
		return tn.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i), Namespace: tn.Namespace,
				Labels: map[string]string{contract.SecretLabel: "true"}},
			Data: map[string][]byte{tenantBlobName: filler(maxSecretData - len(tenantBlobName))},
		})
	})
	parallel(t, n, func(i int) error {
		tr := tn.TaskRun(fmt.Sprintf("%s-%d", prefix, i), platform)
		const key = "tenant.example/blob"
		tr.Annotations = map[string]string{key: string(filler(validation.TotalAnnotationSizeLimitB - len(key)))}
		tr.Spec.Params = append(tr.Spec.Params, pipelinev1.Param{Name: tenantBlobName, Value: *pipelinev1.NewStructuredValues(string(filler(paramBytes)))})
		return tn.Client.Create(ctx, tr)
	})
}

// primeMeta is the tenants writing TaskRuns whose megabyte is where berth reads a part: in the
// flood's namespace, which berth serves, TaskRuns of its platform with a megabyte of finalizers
// or of required node affinity, and TaskRuns without PLATFORM with a megabyte of finalizers;
// in outside, which it does not serve, TaskRuns of its platform with either. metaTaskRuns of
// each of the metaKinds.
func primeMeta(t *testing.T, flood, outside *stacktest.Tenant) {
	t.Helper()
	ctx := context.Background()
	finalizers := func(tr *pipelinev1.TaskRun) { tr.Finalizers = tenantFinalizers(paramBytes / 317) }
	affinity := func(tr *pipelinev1.TaskRun) { tr.Spec.PodTemplate = bigAffinity(paramBytes) }
	unrelated := func(tr *pipelinev1.TaskRun) {
		tr.Spec.Params = nil
		finalizers(tr)
	}
	kinds := []struct {
		tn     *stacktest.Tenant
		prefix string
		shape  func(*pipelinev1.TaskRun)
	}{
		{flood, "fin", finalizers}, {flood, "aff", affinity}, {flood, "plain", unrelated},
		{outside, "fin", finalizers}, {outside, "aff", affinity},
	}
	if len(kinds) != metaKinds {
		t.Fatalf("%d kinds of TaskRun, metaKinds says %d", len(kinds), metaKinds)
	}
	for _, k := range kinds {
		parallel(t, metaTaskRuns, func(i int) error {
			tr := k.tn.TaskRun(fmt.Sprintf("%s-%d", k.prefix, i), platform)
			k.shape(tr)
			return k.tn.Client.Create(ctx, tr)
		})
	}
}

// tenantFinalizers are n distinct finalizers of the longest name the apiserver takes, a DNS
// subdomain prefix of 253 characters and a name of 63: 317 bytes each. The apiserver bounds
// each name, not how many there are.
func tenantFinalizers(n int) []string {
	label := strings.Repeat("p", 63)
	out := make([]string, n)
	for i := range out {
		first := fmt.Sprintf("f%d", i)
		out[i] = first + label[len(first):] + "." + label + "." + label + "." + label[:61] + "/" + strings.Repeat("n", 63)
	}
	return out
}

// bigAffinity is a required node affinity of about size bytes: one term whose values are
// label values of 63 characters. It pins the pod to no platform's nodes.
func bigAffinity(size int) *pod.Template {
	values := make([]string, size/66)
	for i := range values {
		values[i] = fmt.Sprintf("%063d", i)
	}
	return &pod.Template{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "tenant.example/zone", Operator: corev1.NodeSelectorOpIn, Values: values}},
		}}},
	}}}
}

// busyFrames are the functions a goroutine of the controller is in while it works on
// something: a reconcile of a TaskRun, or an Event on its way to the apiserver.
var busyFrames = []string{
	"github.com/berth-ci/berth/internal/controller/taskrun.(*Reconciler).Reconcile",
	"github.com/berth-ci/berth/internal/controller.(*eventWriter).write",
}

// atWork is the first goroutine in stacks (a goroutine profile, debug=2) that holds something
// the controller works on rather than keeps, "" when none does:
//   - one in a TaskRun reconcile or writing an Event (busyFrames);
//   - a watch's reader that is not waiting for bytes: it is decoding an object, or handing
//     one it decoded to its informer. That object is whole (a tenant's 1.25 MiB TaskRun), and
//     a watch that lags under load holds one for as long as it lags;
//   - an informer's watch loop that is not waiting for the next object: it holds the one it
//     is storing, whole until the cache's transform has cut it down.
func atWork(stacks string) string {
	for _, g := range strings.Split(stacks, "\n\n") {
		lines := strings.SplitN(g, "\n", 3)
		if len(lines) < 2 {
			continue
		}
		top := lines[1]
		switch {
		case slices.ContainsFunc(busyFrames, func(f string) bool { return strings.Contains(g, f) }):
		case strings.Contains(g, "k8s.io/apimachinery/pkg/watch.(*StreamWatcher).receive("):
			if strings.Contains(g, "golang.org/x/net/http2.(*pipe).Read(") || strings.Contains(g, "internal/poll.runtime_pollWait(") {
				continue
			}
		case strings.Contains(g, "k8s.io/client-go/tools/cache.handleAnyWatch("):
			if strings.HasPrefix(top, "k8s.io/client-go/tools/cache.handleAnyWatch(") {
				continue
			}
		default:
			continue
		}
		return lines[0] + " " + top
	}
	return ""
}

// quiet waits until no goroutine of the controller is at work (atWork), at two looks in a
// row: its heap then holds what it keeps, not what it is at work on (under load, a backlog of
// reconciles, Events and watch events holds megabytes for a while, which is no more kept than
// a buffer).
func quiet(t *testing.T, addr string) {
	t.Helper()
	calm := 0
	floodEventually(t, "the controller is between tasks", func() (bool, error) {
		stacks, err := bench.GoroutineStacks(context.Background(), addr)
		if err != nil {
			return false, err
		}
		if atWork(stacks) != "" {
			calm = 0
		} else {
			calm++
		}
		return calm >= 2, nil
	})
}

// saveHeap keeps the heap profile h was read from as <name>.pb.gz in BERTH_MEMORY_PROFILES,
// when that names a directory, to be read with go tool pprof (-base for what grew).
func saveHeap(t *testing.T, h heap, name string) {
	t.Helper()
	dir := os.Getenv("BERTH_MEMORY_PROFILES")
	if dir == "" {
		return
	}
	if err := os.WriteFile(filepath.Join(dir, name+".pb.gz"), h.profile, 0o644); err != nil {
		t.Error(err)
	}
}

// floodPatience bounds the waits for berth to get through the flood: each of its writes of a
// big TaskRun carries the whole object through the apiserver, which on a shared test machine
// takes longer than Patience (stacktest) for them all.
const floodPatience = 15 * time.Minute

func floodEventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	stacktest.EventuallyWithin(t, floodPatience, time.Second, what, cond)
}

// inflate is the tenant replacing the data of a secret in its namespace with 1 MiB.
func inflate(t *testing.T, tn *stacktest.Tenant, name string) {
	t.Helper()
	var s corev1.Secret
	if err := tn.Client.Get(context.Background(), client.ObjectKey{Namespace: tn.Namespace, Name: name}, &s); err != nil {
		t.Fatalf("the tenant reading %s: %v", name, err)
	}
	s.Data = map[string][]byte{tenantBlobName: filler(maxSecretData - len(tenantBlobName))}
	if err := tn.Client.Update(context.Background(), &s); err != nil {
		t.Fatalf("the tenant inflating %s: %v", name, err)
	}
}

// serves shows the controller still serving: a new task of another namespace gets its build
// user on the slot the flood's cap leaves free, and lets it go when it ends.
//
// Its two writes retry what withRetries calls transient: with a gigabyte in etcd and its
// compaction under way, the apiserver now and then answers a write with etcd's request
// timeout, as a real one under such load does, and a real tenant's client retries it too.
func serves(t *testing.T, tn *stacktest.Tenant, name string) {
	t.Helper()
	tr := tn.TaskRun(name, platform)
	if err := withRetries(func() error { return tn.Client.Create(t.Context(), tr) }); err != nil {
		t.Fatalf("the tenant creating %s: %v", name, err)
	}
	ready(t, tr)
	if err := withRetries(func() error { return stack.StandIn.Finish(t.Context(), client.ObjectKeyFromObject(tr), nil) }); err != nil {
		t.Fatalf("finishing %s: %v", name, err)
	}
	settled(t, tn.Namespace)
}

// waitingIn counts the TaskRuns of ns that carry berth's waiting label, reading metadata only
// and from the apiserver's watch cache (resourceVersion 0): a list read from etcd would make
// the apiserver read every 1.25 MiB TaskRun of the namespace, once a second.
func waitingIn(ctx context.Context, ns string) (int, error) {
	var list metav1.PartialObjectMetadataList
	list.SetGroupVersionKind(pipelinev1.SchemeGroupVersion.WithKind("TaskRunList"))
	if err := admin().List(ctx, &list, &client.ListOptions{Namespace: ns, Raw: &metav1.ListOptions{ResourceVersion: "0"}}, client.HasLabels{contract.WaitingForPlatformLabel}); err != nil {
		return 0, err
	}
	return len(list.Items), nil
}

// parallel runs do(0..n-1) on floodWorkers goroutines, each with retries (withRetries); the
// first error fails the test.
func parallel(t *testing.T, n int, do func(int) error) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range floodWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := withRetries(func() error { return do(i) }); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("object %d: %w", i, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}
}

func filler(n int) []byte { return []byte(strings.Repeat("x", n)) }

func kib(n int64) string { return fmt.Sprintf("%.0f KiB", float64(n)/1024) }

// startChild runs the built controller as its own process, the way the bench does, under the
// shipped RBAC, serving pprof on a loopback port and the webhook where the stack's apiserver
// calls it.
func startChild(t *testing.T, bin string) (*bench.Child, string) {
	t.Helper()
	kubeconfig, err := stack.ControllerKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	addr, err := bench.FreeLoopbackAddress()
	if err != nil {
		t.Fatal(err)
	}
	w := stack.Webhook
	command := fmt.Sprintf("%s controller --kubeconfig %s --namespace %s --pprof-bind-address %s --metrics-bind-address=0 --health-probe-bind-address=0 --host-check-interval=0 --webhook-host %s --webhook-port %d --webhook-cert-dir %s",
		bin, kubeconfig, devstack.Namespace, addr, w.Host, w.Port, w.CertDir)
	// One heap sample per 1 KiB allocated (the default is 512 KiB), for splitHeap; and Go's
	// default GC target, whatever this test's own environment says (TestMain).
	command = "env GODEBUG=memprofilerate=1024 GOGC=100 " + command
	log := filepath.Join(t.TempDir(), "controller.log")
	child, err := bench.StartChild(command, kubeconfig, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		child.Stop()
		if t.Failed() {
			if out, err := os.ReadFile(log); err == nil {
				lines := strings.Split(string(out), "\n")
				t.Logf("the controller's log ends:\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
			}
		}
	})
	waitPprof(t, addr)
	return child, addr
}

func waitPprof(t *testing.T, addr string) {
	t.Helper()
	eventually(t, "the controller serves pprof at "+addr, func() (bool, error) {
		_, err := bench.GoroutineStacks(context.Background(), addr)
		return err == nil, nil
	})
}

// heap is the controller's live heap after a GC, split into what it keeps and its watches'
// wire buffers, with the kept part's bytes by the function that allocated them (the heap
// profile's leaf frames), for grown.
type heap struct {
	total, wire, kept int64
	keptBy            map[string]int64
	profile           []byte // as read (gzipped protobuf), for saveHeap
}

// wireFrames are the functions whose allocations are a watch's wire buffers: an HTTP/2
// stream's data received and not yet read, the JSON framer's read buffer, the streaming
// decoder's frame buffer and the last event decoded from it. Each is about as large as the
// largest objects the watch carried (etcd takes none over 1.5 MiB), or a few of them,
// depending on how the stream's reads fell; never one per object.
var wireFrames = []string{
	"golang.org/x/net/http2.",
	"net/http.(*http2",
	"encoding/json.(*Decoder).refill",
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming.(*decoder).Decode",
}

// splitHeap reads the heap profile, which tells what was live at the last collection, each
// sample by the stack that allocated it: the samples of wire buffers (see wireFrames) are the
// wire share, the rest is what berth keeps. Both shares come from the one profile, so from one
// moment: MemStats' HeapAlloc, read after the collection, also counts what the controller
// allocated since (under load, a watch's next big objects), none of which it keeps.
//
// The profile is read after a second collection: pooled buffers outlive one (sync.Pool keeps
// them for one more). It is sampled, about one allocation per KiB allocated (startChild): each
// share is estimated without bias, with a standard deviation of √(its bytes × 1 KiB), about
// 100 KiB in 10 MiB, some 140 bytes per object in what the check compares.
func splitHeap(t *testing.T, addr string) heap {
	t.Helper()
	ctx := context.Background()
	if _, err := bench.HeapProfile(ctx, addr); err != nil {
		t.Fatal(err)
	}
	data, err := bench.HeapProfile(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := profile.ParseData(data)
	if err != nil {
		t.Fatalf("the heap profile: %v", err)
	}
	inuse := -1
	for i, st := range p.SampleType {
		if st.Type == "inuse_space" {
			inuse = i
		}
	}
	if inuse < 0 {
		t.Fatal("the heap profile has no inuse_space")
	}
	h := heap{keptBy: map[string]int64{}, profile: data}
	for _, s := range p.Sample {
		h.total += s.Value[inuse]
		if onWire(s) {
			h.wire += s.Value[inuse]
			continue
		}
		if len(s.Location) > 0 && len(s.Location[0].Line) > 0 && s.Location[0].Line[0].Function != nil {
			h.keptBy[s.Location[0].Line[0].Function.Name] += s.Value[inuse]
		}
	}
	h.kept = h.total - h.wire
	return h
}

// grown is the n functions whose allocations the controller keeps grew most from before to
// now, a line each with the growth, largest first: what a failed check looks at first.
func grown(before, now heap, n int) string {
	type site struct {
		function string
		bytes    int64
	}
	var sites []site
	for f, b := range now.keptBy {
		if d := b - before.keptBy[f]; d > 0 {
			sites = append(sites, site{f, d})
		}
	}
	slices.SortFunc(sites, func(a, b site) int { return cmp.Compare(b.bytes, a.bytes) })
	var out strings.Builder
	for _, s := range sites[:min(n, len(sites))] {
		fmt.Fprintf(&out, "  %8s  %s\n", kib(s.bytes), s.function)
	}
	return out.String()
}

func onWire(s *profile.Sample) bool {
	for _, loc := range s.Location {
		for _, line := range loc.Line {
			for _, f := range wireFrames {
				if line.Function != nil && strings.HasPrefix(line.Function.Name, f) {
					return true
				}
			}
		}
	}
	return false
}

// shippedMemoryLimitMiB is the memory limit of the controller's container in the shipped
// Deployment (config/manager).
func shippedMemoryLimitMiB(t *testing.T) int64 {
	t.Helper()
	d := stacktest.ShippedController(t)
	for _, c := range d.Spec.Template.Spec.Containers {
		if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
			return q.Value() >> 20
		}
	}
	t.Fatal("config/manager/deployment.yaml sets no memory limit")
	return 0
}

// buildBerth builds berth from this tree; BERTH_MEMORY_TEST_BINARY names another build to
// measure instead (say, one of main before a change, for comparison).
func buildBerth(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("BERTH_MEMORY_TEST_BINARY"); bin != "" {
		return bin
	}
	return stacktest.BuildBerth(t)
}

// withRetries runs write until it succeeds, fails for good, or has failed seven times for
// want of time (an etcd or apiserver timeout, or too many requests), backing off from a
// second to a minute. A tenant would retry such writes too; on a test machine shared with
// other suites, etcd takes more than its five seconds now and then under a gigabyte of
// writes. A create that timed out may have been done all the same, so after a retry,
// AlreadyExists is success.
func withRetries(write func() error) error {
	tries := 0
	transient := func(err error) bool {
		return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
			apierrors.IsInternalError(err) && strings.Contains(err.Error(), "timed out")
	}
	return retry.OnError(wait.Backoff{Steps: 7, Duration: time.Second, Factor: 2}, transient, func() error {
		tries++
		if err := write(); err != nil && !(tries > 1 && apierrors.IsAlreadyExists(err)) {
			return err
		}
		return nil
	})
}
