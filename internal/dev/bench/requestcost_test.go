package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
)

// BenchmarkAPIServerCostPerRequest is what one request of each kind a controller sends per task
// costs kube-apiserver and etcd in CPU, on the package's control plane with nobody else
// writing: the floor's TaskRun patch beside berth's, and the records, secrets and Events
// berth writes. It reports apiserver-ms/op and etcd-ms/op (from /proc, so any background work
// of theirs during the loop counts too; on an idle control plane that is little). Each kind
// runs on objects of its own, made before the loop.
//
//	go test -run '^$' -bench APIServerCost -benchtime 1000x ./internal/dev/bench/
func BenchmarkAPIServerCostPerRequest(b *testing.B) {
	ctx := context.Background()
	for _, ns := range []string{userNamespace, controllerNamespace} {
		if err := cp.EnsureNamespace(ctx, ns); err != nil {
			b.Fatal(err)
		}
	}
	c := cp.Client
	run := 0
	taskRuns := func(b *testing.B) []*pipelinev1.TaskRun {
		run++
		out := make([]*pipelinev1.TaskRun, b.N)
		err := parallel(b.N, 8, func(i int) error {
			out[i] = userTask(fmt.Sprintf("cost-%d-%06d", run, i))
			return c.Create(ctx, out[i])
		})
		if err != nil {
			b.Fatal(err)
		}
		return out
	}
	// resolved is taskRuns after Tekton's first status write (the simulation's resolve): the
	// task's spec copied into status.taskSpec, a start time, Running. A task that waits meets
	// berth's first patch in this state, where the floor's, a moment after creation, mostly
	// comes before it.
	resolved := func(b *testing.B) []*pipelinev1.TaskRun {
		trs := taskRuns(b)
		err := parallel(len(trs), 8, func(i int) error {
			tr := trs[i]
			tr.Status.TaskSpec = tr.Spec.TaskSpec.DeepCopy()
			now := metav1.Now()
			tr.Status.StartTime = &now
			tr.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionUnknown, Reason: "Running"})
			return c.Status().Update(ctx, tr)
		})
		if err != nil {
			b.Fatal(err)
		}
		return trs
	}
	allocation := func(i int) *berthv1.Allocation {
		return &berthv1.Allocation{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cost-%d-%06d", run, i), Namespace: controllerNamespace},
			Spec: berthv1.AllocationSpec{TaskRun: berthv1.TaskRunRef{Namespace: userNamespace, Name: "t", UID: "u"},
				Platform: benchPlatform, Strategy: "static", Queued: metav1.Now()}}
	}
	patchAll := func(trs []*pipelinev1.TaskRun, pt types.PatchType, patch string) func(int) error {
		return func(i int) error { return c.Patch(ctx, trs[i], client.RawPatch(pt, []byte(patch))) }
	}
	label := fmt.Sprintf("%q:\"host-1\"", contract.AssignedHostLabel)
	floorPatch := `{"metadata":{"labels":{` + label + `}}}`
	// berth's: a JSON patch that tests what it replaces, with the finalizer.
	berthPatch := fmt.Sprintf(`[{"op":"test","path":"/metadata/labels","value":null},`+
		`{"op":"add","path":"/metadata/labels","value":{%s}},{"op":"test","path":"/metadata/finalizers","value":null},`+
		`{"op":"add","path":"/metadata/finalizers","value":[%q]}]`, label, contract.Finalizer)
	kinds := []struct {
		name    string
		prepare func(b *testing.B) func(i int) error
	}{
		{"taskrun merge patch, label (the floor)", func(b *testing.B) func(int) error {
			return patchAll(taskRuns(b), types.MergePatchType, floorPatch)
		}},
		{"taskrun merge patch, label and finalizer", func(b *testing.B) func(int) error {
			return patchAll(taskRuns(b), types.MergePatchType, fmt.Sprintf(`{"metadata":{"labels":{%s},"finalizers":[%q]}}`, label, contract.Finalizer))
		}},
		{"taskrun JSON patch, tested label and finalizer (berth)", func(b *testing.B) func(int) error {
			return patchAll(taskRuns(b), types.JSONPatchType, berthPatch)
		}},
		{"taskrun merge patch, label (the floor), after Tekton's status", func(b *testing.B) func(int) error {
			return patchAll(resolved(b), types.MergePatchType, floorPatch)
		}},
		{"taskrun JSON patch (berth), after Tekton's status", func(b *testing.B) func(int) error {
			return patchAll(resolved(b), types.JSONPatchType, berthPatch)
		}},
		{"allocation create", func(b *testing.B) func(int) error {
			run++
			return func(i int) error { return c.Create(ctx, allocation(i)) }
		}},
		{"allocation delete", func(b *testing.B) func(int) error {
			run++
			if err := parallel(b.N, 8, func(i int) error { return c.Create(ctx, allocation(i)) }); err != nil {
				b.Fatal(err)
			}
			return func(i int) error { return c.Delete(ctx, allocation(i)) }
		}},
		{"task secret create", func(b *testing.B) func(int) error {
			run++
			key := make([]byte, 3300) // an OpenSSH RSA-3072 private key's length
			return func(i int) error {
				return c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cost-%d-%06d", run, i), Namespace: userNamespace},
					Data: map[string][]byte{"id_rsa": key, "host": []byte("builder@198.51.100.7"), "user-dir": []byte("/home/u")}})
			}
		}},
		{"event create", func(b *testing.B) func(int) error {
			run++
			return func(i int) error {
				return c.Create(ctx, &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cost-%d-%06d", run, i), Namespace: userNamespace},
					EventTime: metav1.NowMicro(), Type: corev1.EventTypeNormal, Reason: "Waiting", Action: "Queue", ReportingController: "berth.dev/controller",
					ReportingInstance: "berth", Note: "waiting for a linux/arm64 host: 3 ahead",
					Regarding: corev1.ObjectReference{Kind: "TaskRun", APIVersion: "tekton.dev/v1", Namespace: userNamespace, Name: "t"}})
			}
		}},
	}
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			send := k.prepare(b)
			// Let the writes of the preparation settle before measuring.
			time.Sleep(time.Second)
			before := cp.CPUSeconds()
			b.ResetTimer()
			if err := parallel(b.N, 8, send); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			after := cp.CPUSeconds()
			for name, unit := range map[string]string{"kube-apiserver": "apiserver-ms/op", "etcd": "etcd-ms/op"} {
				if _, ok := before[name]; !ok {
					b.Fatalf("no CPU time of %s", name)
				}
				b.ReportMetric((after[name]-before[name])*1000/float64(b.N), unit)
			}
		})
	}
}
