package bench

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

func write(verb, group, resource, sub, name string, at time.Time) *auditv1.Event {
	return &auditv1.Event{Verb: verb, RequestReceivedTimestamp: metav1.NewMicroTime(at),
		ObjectRef: &auditv1.ObjectReference{APIGroup: group, Resource: resource, Subresource: sub, Name: name}}
}

// Each write lands on the task whose object it names, or on none; only the measured part
// counts in the totals, while a measured task's writes count wherever they fall.
func TestWriteTallyAttributesWritesToTasks(t *testing.T) {
	o := owners{}
	o.addTask("task-00001", "5b1c")
	o.addTask("task-00002", "77aa-01")
	o.addTask(warmUpTask, "0000")
	o.add("provision-3f9a", "task-00002") // an internal TaskRun labelled with its task
	from := at(100)
	tally := newWriteTally(o, from, map[string]bool{"task-00001": false, "task-00002": true})
	for _, ev := range []*auditv1.Event{
		write("patch", "tekton.dev", "taskruns", "", "task-00001", at(101)),
		write("create", "", "secrets", "", "multi-platform-ssh-task-00001", at(102)),
		write("create", "berth.dev", "allocations", "", "5b1c", at(102)),
		write("create", "events.k8s.io", "events", "", "task-00001.18a7f3c2d1e0", at(103)),
		write("create", "", "events", "", "5b1c.18a7f3c2d1e1", at(103)),
		write("patch", "tekton.dev", "taskruns", "status", "task-00002", at(104)),
		write("create", "tekton.dev", "taskruns", "", "provision-3f9a", at(104)),
		write("create", "", "events", "", "provision-3f9a.18a7f3c2d1e2", at(104)),
		write("delete", "berth.dev", "allocations", "", "77aa-01", at(105)),
		write("update", "", "configmaps", "", "host-keys", at(105)),
		write("update", "coordination.k8s.io", "leases", "", "berth-controller", at(106)),
		write("deletecollection", "", "secrets", "", "", at(106)),
		// The warm-up's cleanup in the measured part: counted, but to no measured task.
		write("delete", "", "secrets", "", "multi-platform-ssh-warm-up", at(101)),
		// Before the measured part: only for its task.
		write("patch", "tekton.dev", "taskruns", "", "task-00001", at(99)),
		write("update", "coordination.k8s.io", "leases", "", "berth-controller", at(99)),
	} {
		tally.add(ev)
	}
	if tally.total != 13 || tally.outside != 3 || tally.events != 3 {
		t.Errorf("total %d, outside tasks %d, events %d; want 13, 3, 3", tally.total, tally.outside, tally.events)
	}
	noWait, waited, nWaited := tally.perTaskAverages()
	if noWait != 6 || waited != 4 || nWaited != 1 {
		t.Errorf("per task: no wait %.1f, waited %.1f (%d waited); want 6, 4, 1", noWait, waited, nWaited)
	}
	want := map[string]KindWrites{
		"taskruns.tekton.dev patch":         {Total: 1, NoWaitTasks: 2},
		"secrets create":                    {Total: 1, NoWaitTasks: 1},
		"allocations.berth.dev create":      {Total: 1, NoWaitTasks: 1},
		"events.events.k8s.io create":       {Total: 1, NoWaitTasks: 1},
		"events create":                     {Total: 2, NoWaitTasks: 1, WaitedTasks: 1},
		"taskruns.tekton.dev/status patch":  {Total: 1, WaitedTasks: 1},
		"taskruns.tekton.dev create":        {Total: 1, WaitedTasks: 1},
		"allocations.berth.dev delete":      {Total: 1, WaitedTasks: 1},
		"configmaps update":                 {Total: 1, OutsideTasks: 1},
		"leases.coordination.k8s.io update": {Total: 1, OutsideTasks: 1},
		"secrets deletecollection":          {Total: 1, OutsideTasks: 1},
		"secrets delete":                    {Total: 1},
	}
	if got := tally.kinds(); !maps.Equal(got, want) {
		t.Errorf("by kind:\n got %v\nwant %v", got, want)
	}
}

// Slot utilisation: busy slot-seconds (secret → done of served tasks) over slots × the span
// from the first creation to the last completion. An error-secret task holds no slot.
func TestSlotUtilisation(t *testing.T) {
	tl := Timeline{Start: at(0), Tasks: []TaskTimes{
		{Created: at(0), Secret: at(0), Done: at(4)},
		{Created: at(0), Secret: at(1), Done: at(3)},
		{Created: at(0), Secret: at(4), Done: at(8)},
		{Created: at(1), Secret: at(1), Done: at(1), Error: true},
		{Created: at(2)}, // never served
	}}
	// 4 + 2 + 4 = 10 busy slot-seconds of 2 slots × 8 s.
	if got := tl.slotUtilisation(2); got != 10.0/16 {
		t.Errorf("utilisation %v, want %v", got, 10.0/16)
	}
	if got := len(tl.served()); got != 3 {
		t.Errorf("%d served, want 3", got)
	}
	if got := (Timeline{}).slotUtilisation(2); got != 0 {
		t.Errorf("an empty timeline: %v, want 0", got)
	}
}

// The real thing: the bench's control plane logs the writes of the user it names, and only
// them, with what the tally needs (verb, resource, name, time).
func TestAuditLogRecordsTheControllersWrites(t *testing.T) {
	ctx := context.Background()
	kubeconfig, err := cp.KubeConfigAs(controllerUser, "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	as, err := client.New(cfg, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.EnsureNamespace(ctx, "audited"); err != nil {
		t.Fatal(err)
	}
	from := time.Now()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "multi-platform-ssh-task-00007", Namespace: "audited"}}
	if err := as.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	// Another client's write, and a refused one of the controller's: one is not logged, the
	// other is.
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "not-the-controllers", Namespace: "audited"}}
	if err := cp.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	again := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret.Name, Namespace: secret.Namespace}}
	if err := as.Create(ctx, again); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating the secret again: %v, want AlreadyExists", err)
	}
	if err := as.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	o := owners{}
	o.addTask("task-00007", "")
	tally := newWriteTally(o, from, map[string]bool{"task-00007": false})
	var users []string
	if err := controlplane.ReadAuditLog(auditLogPath, func(ev *auditv1.Event) {
		if ev.ObjectRef != nil && ev.ObjectRef.Namespace == "audited" {
			users = append(users, ev.User.Username)
			tally.add(ev)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{controllerUser, controllerUser, controllerUser}; !slices.Equal(users, want) {
		t.Errorf("logged writes by %v, want %v", users, want)
	}
	want := map[string]KindWrites{"secrets create": {Total: 2, NoWaitTasks: 2}, "secrets delete": {Total: 1, NoWaitTasks: 1}}
	if got := tally.kinds(); !maps.Equal(got, want) {
		t.Errorf("by kind %v, want %v", got, want)
	}
	// The real apiserver logs when it received each write and when it answered.
	if got := percentiles(tally.serverTimes); got.N != 3 || got.P50 <= 0 || got.Max > float64(time.Minute.Milliseconds()) {
		t.Errorf("apiserver time per write %+v; want 3 writes, each between 0 and a minute", got)
	}
}

// Only answered writes of the measured part say how long the apiserver took.
func TestWriteTallyTimesTheServersAnswers(t *testing.T) {
	o := owners{}
	o.addTask("task-00001", "")
	tally := newWriteTally(o, at(100), map[string]bool{"task-00001": false})
	answered := func(ev *auditv1.Event, took time.Duration) *auditv1.Event {
		ev.Stage = auditv1.StageResponseComplete
		ev.StageTimestamp = metav1.NewMicroTime(ev.RequestReceivedTimestamp.Add(took))
		return ev
	}
	tally.add(answered(write("patch", "tekton.dev", "taskruns", "", "task-00001", at(101)), 20*time.Millisecond))
	tally.add(answered(write("create", "", "secrets", "", "multi-platform-ssh-task-00001", at(102)), 180*time.Millisecond))
	tally.add(answered(write("patch", "tekton.dev", "taskruns", "", "task-00001", at(99)), time.Second)) // before the measured part
	panicked := write("delete", "", "secrets", "", "multi-platform-ssh-task-00001", at(103))
	panicked.Stage, panicked.StageTimestamp = auditv1.StagePanic, metav1.NewMicroTime(at(108))
	tally.add(panicked)
	got := percentiles(tally.serverTimes)
	if got.N != 2 || got.P50 != 20 || got.Max != 180 {
		t.Errorf("apiserver time per write %+v; want 2 writes, p50 20 ms, max 180 ms", got)
	}
}
