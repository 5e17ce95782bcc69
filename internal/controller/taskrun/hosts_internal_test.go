package taskrun

// The static hosts as the task side meets them (their owner is package hosts): health checks,
// quarantine and its lifting, what build users leave behind, and the operator's drain,
// undrain and forget; and how the capacity and the tasks follow them. Same harness as the
// phases (phases_internal_test.go), with the hosts' owner wired as the manager wires it: the
// fake client with the BuildHost status subresource, the fake provisioner answering the
// checks, the real ledger. The stack tests hostcheck_test.go, hostadmin_test.go and
// leftovers_test.go keep the same promises against real hosts.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/hosts"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/provision"
	"github.com/berth-ci/berth/internal/provision/provisionfake"
	"github.com/berth-ci/berth/internal/remote"
)

// otherNS is a second tenant's namespace.
const otherNS = "other"

// hostsHarness is the harness with what the hosts' tests do and look at: checks, operators'
// edits of BuildHost records, what the records show.
type hostsHarness struct{ *harness }

// newHostsHarness is newHarness on an apiserver that keeps the generation of BuildHosts (see
// withGenerations), so that the conditions' ObservedGeneration means what it does on a cluster.
func newHostsHarness(t *testing.T, cfg map[string]string, tune func(*Reconciler)) *hostsHarness {
	t.Helper()
	h := &hostsHarness{&harness{t: t, api: withGenerations(newAPIServer()), events: &eventLog{}, cfg: cfg, tune: tune}}
	h.start()
	return h
}

// withGenerations keeps metadata.generation of BuildHosts as the apiserver does and the fake
// client does not: 1 at creation, one more at each write that changes the spec; a status
// write keeps it.
func withGenerations(api client.WithWatch) client.WithWatch {
	return interceptor.NewClient(api, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if bh, ok := obj.(*berthv1.BuildHost); ok {
				bh.Generation = 1
			}
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if bh, ok := obj.(*berthv1.BuildHost); ok {
				var stored berthv1.BuildHost
				if err := c.Get(ctx, client.ObjectKeyFromObject(bh), &stored); err == nil {
					bh.Generation = stored.Generation
					if !equality.Semantic.DeepEqual(stored.Spec, bh.Spec) {
						bh.Generation++
					}
				}
			}
			return c.Update(ctx, obj, opts...)
		},
	})
}

// hostsOwner is the owner of the BuildHost records, as newReconciler wired it.
func (h *hostsHarness) hostsOwner() *hosts.Owner {
	h.t.Helper()
	// By the time a host's event or check comes, the controller has rebuilt its ledger (its
	// restorer runs at start).
	if done, err := h.r.line.restoreOnce(h.ctx); !done || err != nil {
		h.t.Fatalf("restore: done %v, %v", done, err)
	}
	return h.r.Hosts.(*hosts.Owner)
}

// checkHosts runs one round of health checks, as the owner does each interval, and settles
// what it woke.
func (h *hostsHarness) checkHosts() {
	h.t.Helper()
	if err := h.hostsOwner().CheckNow(h.ctx); err != nil {
		h.t.Fatalf("check round: %v", err)
	}
	h.settle()
}

// sick makes the named hosts fail their checks with reason; every other host passes.
func (h *hostsHarness) sick(reasons map[string]string) {
	h.prov.Health = func(login berthv1.HostLogin) provision.Health {
		if reason, ok := reasons[login.Host]; ok {
			return provision.Health{Reason: reason}
		}
		return provision.Health{Healthy: true}
	}
}

// buildHost is the host's BuildHost record, nil when there is none.
func (h *hostsHarness) buildHost(host string) *berthv1.BuildHost {
	h.t.Helper()
	var bh berthv1.BuildHost
	err := h.api.Get(h.ctx, types.NamespacedName{Namespace: berthNS, Name: berthv1.BuildHostName(host)}, &bh)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return &bh
}

// operate edits the host's record as `berth host drain|undrain|forget` does, and lets the
// BuildHost loop handle the event of that write.
func (h *hostsHarness) operate(host string, edit func(*berthv1.BuildHostSpec)) {
	h.t.Helper()
	bh := h.buildHost(host)
	if bh == nil {
		h.t.Fatalf("%s has no record to edit", host)
	}
	edit(&bh.Spec)
	if err := h.api.Update(h.ctx, bh); err != nil {
		h.t.Fatal(err)
	}
	h.hostEvent(host)
}

// hostEvent reconciles the host's record, as a watch event of it does, and settles what that
// woke.
func (h *hostsHarness) hostEvent(host string) {
	h.t.Helper()
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: berthNS, Name: berthv1.BuildHostName(host)}}
	if _, err := h.hostsOwner().Reconcile(h.ctx, req); err != nil {
		h.t.Fatalf("reconciling BuildHost %s: %v", host, err)
	}
	h.settle()
}

// shows asserts what `kubectl get bhost` shows of host: each condition as "Status/Reason",
// computed from the record's current spec.
func (h *hostsHarness) shows(host string, want map[string]string) *berthv1.BuildHost {
	h.t.Helper()
	bh := h.buildHost(host)
	if bh == nil {
		h.t.Fatalf("%s has no record", host)
	}
	if bh.Status.ObservedGeneration != bh.Generation {
		h.t.Errorf("%s: status observed generation %d of %d: the conditions do not show the current spec", host, bh.Status.ObservedGeneration, bh.Generation)
	}
	for typ, w := range want {
		c := meta.FindStatusCondition(bh.Status.Conditions, typ)
		if c == nil {
			h.t.Errorf("%s has no %s condition (conditions %+v)", host, typ, bh.Status.Conditions)
			continue
		}
		if got := string(c.Status) + "/" + c.Reason; got != w || c.ObservedGeneration != bh.Generation {
			h.t.Errorf("%s: %s %s (generation %d of %d, %q), want %s", host, typ, got, c.ObservedGeneration, bh.Generation, c.Message, w)
		}
	}
	return bh
}

// quarantined tells whether host's record keeps it out of service for berth's own reasons.
func (h *hostsHarness) quarantined(host string) bool {
	bh := h.buildHost(host)
	return bh != nil && bh.Status.Quarantined
}

// hostEvents lists the Events of one reason on the host's BuildHost record.
func (h *hostsHarness) hostEvents(host, reason string) []recordedEvent {
	h.events.mu.Lock()
	defer h.events.mu.Unlock()
	var out []recordedEvent
	for _, e := range h.events.events {
		// eventLog names no kind for a BuildHost.
		if e.kind == "" && e.namespace == berthNS && e.name == berthv1.BuildHostName(host) && e.reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// cleansOf counts the cleans of user started so far.
func (h *hostsHarness) cleansOf(user string) int {
	n := 0
	for _, s := range h.prov.Started() {
		if s.Kind == provisionfake.Clean && s.Job.User == user {
			n++
		}
	}
	return n
}

// createIn is create for a TaskRun of any namespace.
func (h *hostsHarness) createIn(tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	h.t.Helper()
	h.created++
	tr.UID = uuid.NewUUID()
	tr.CreationTimestamp = metav1.NewTime(time.Now().Add(-2 * time.Minute).Truncate(time.Second).Add(time.Duration(h.created) * time.Second))
	status := tr.Status.DeepCopy()
	if err := h.api.Create(h.ctx, tr); err != nil {
		h.t.Fatal(err)
	}
	tr.Status = *status
	if err := h.api.Status().Update(h.ctx, tr); err != nil {
		h.t.Fatal(err)
	}
	h.queue.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tr)})
	return tr
}

// finishIn is finish for a TaskRun of any namespace.
func (h *hostsHarness) finishIn(tr *pipelinev1.TaskRun) {
	h.t.Helper()
	var got pipelinev1.TaskRun
	if err := h.api.Get(h.ctx, client.ObjectKeyFromObject(tr), &got); err != nil {
		h.t.Fatal(err)
	}
	now := metav1.Now()
	got.Status.CompletionTime = &now
	got.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionTrue, Reason: "Succeeded"})
	if err := h.api.Status().Update(h.ctx, &got); err != nil {
		h.t.Fatal(err)
	}
	h.queue.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tr)})
}

// A failed check takes the host out of service (its record says why, and so does a Warning on
// it); a waiting task is not given it, while the healthy host serves others. The next check
// that passes puts it back, and the waiter gets it without being reconciled by anyone.
func TestAFailedCheckQuarantinesTheHostUntilOnePasses(t *testing.T) {
	h := newHostsHarness(t, hostsConfig(1, "h1", "h2"), nil)
	const unreachable = "host 10.0.0.1 is unreachable over SSH: connection refused"
	h.sick(map[string]string{"h1": unreachable})
	h.checkHosts()

	bh := h.shows("h1", map[string]string{berthv1.HostQuarantined: "True/" + berthv1.QuarantineCheckFailed, berthv1.HostReady: "False/Quarantined"})
	if !bh.Status.Quarantined || bh.Status.QuarantineReason != unreachable || bh.Status.LastCheck == nil ||
		bh.Status.Platform != s390x || bh.Status.Address != addressOf(0) {
		t.Errorf("h1's status %+v, want quarantined for %q, checked, of %s at %s", bh.Status, unreachable, s390x, addressOf(0))
	}
	if c := meta.FindStatusCondition(bh.Status.Conditions, berthv1.HostQuarantined); c != nil && c.Message != unreachable {
		t.Errorf("Quarantined says %q, want the check's reason", c.Message)
	}
	if e := h.hostEvents("h1", "HostQuarantined"); len(e) != 1 || e[0].eventType != corev1.EventTypeWarning ||
		!strings.Contains(e[0].note, "takes no new builds until a check passes: "+unreachable) {
		t.Errorf("HostQuarantined Events on h1: %+v, want one Warning with the reason", e)
	}
	h.shows("h2", map[string]string{berthv1.HostQuarantined: "False/NotQuarantined", berthv1.HostReady: "True/TakesTasks"})

	served := h.create(userTaskRun("served", s390x))
	waiter := h.create(userTaskRun("waiter", s390x))
	h.settle()
	if _, address := h.handedOver(served); address != addressOf(1) {
		t.Errorf("served on %s, want h2 (%s): h1 is quarantined", address, addressOf(1))
	}
	if failed := h.get("served").Annotations[contract.FailedHostsAnnotation]; failed != "" {
		t.Errorf("the quarantined host was even tried: failed-hosts %q", failed)
	}
	h.waiting("waiter")
	if slices.ContainsFunc(h.hostJobs(), func(j string) bool { return strings.HasSuffix(j, "@h1") }) {
		t.Errorf("berth worked on the quarantined host: %v", h.hostJobs())
	}

	h.sick(nil)
	h.checkHosts()
	h.shows("h1", map[string]string{berthv1.HostQuarantined: "False/NotQuarantined", berthv1.HostReady: "True/TakesTasks"})
	if e := h.hostEvents("h1", "HostHealthy"); len(e) != 1 || e[0].eventType != corev1.EventTypeNormal {
		t.Errorf("HostHealthy Events on h1: %+v, want one Normal", e)
	}
	if _, address := h.handedOver(waiter); address != addressOf(0) {
		t.Errorf("the waiter went to %s, want h1 (%s), back in service", address, addressOf(0))
	}
}

// A quarantine is kept in the host's record: a restarted controller that has not checked the
// host yet (it answers again by now) keeps it out of service from its first decision.
func TestARestartedControllerKeepsAQuarantinedHostOut(t *testing.T) {
	h := newHostsHarness(t, hostsConfig(1, "h1", "h2"), nil)
	h.sick(map[string]string{"h1": "host 10.0.0.1 is unreachable over SSH: i/o timeout"})
	h.checkHosts()

	h.start() // the new process has no checks yet; its provisioner finds every host healthy
	first := h.create(userTaskRun("first", s390x))
	h.create(userTaskRun("second", s390x))
	h.settle()
	if _, address := h.handedOver(first); address != addressOf(1) {
		t.Errorf("the first task after the restart went to %s, want h2 (%s)", address, addressOf(1))
	}
	h.waiting("second")
	if jobs := h.hostJobs(); slices.ContainsFunc(jobs, func(j string) bool { return strings.HasSuffix(j, "@h1") }) {
		t.Errorf("the restarted controller worked on the quarantined host: %v", jobs)
	}

	h.checkHosts()
	if _, address := h.handedOver(h.get("second")); address != addressOf(0) {
		t.Errorf("after a passing check the waiter went to %s, want h1", address)
	}
}

// A host that passes its check again while build users are still owed to it stays out of
// service (CleansPending) though it has a free slot; the check retries their cleans at once
// rather than at their backoff. The clean of the last one puts it back, without a check.
func TestAHostWithOwedCleansStaysQuarantinedUntilTheyAreDone(t *testing.T) {
	h := newHostsHarness(t, hostsConfig(2, "h1"), nil)
	ended := h.create(userTaskRun("ended", s390x))
	h.settle()
	user, _ := h.handedOver(ended)

	h.sick(map[string]string{"h1": "host 10.0.0.1 is unreachable over SSH: no route to host"})
	h.checkHosts()
	h.prov.Rule = func(kind provisionfake.Kind, j provision.Job) (provision.Outcome, bool) {
		if kind == provisionfake.Clean {
			return provision.Outcome{Err: &remote.UnreachableError{Host: j.Login.Address, Err: errors.New("no route to host")}}, true
		}
		return provision.Outcome{}, true
	}
	h.finish("ended")
	waiter := h.create(userTaskRun("waiter", s390x))
	h.settle()
	if rec := h.record(ended); rec == nil || len(rec.Status.Debts) != 1 || rec.Status.CleanFailures != 1 {
		t.Fatalf("record %+v, want %s owed after one failed clean", rec, user)
	}
	h.waiting("waiter")

	// Reachable again; removing the user takes its time.
	h.sick(nil)
	h.prov.Rule = func(kind provisionfake.Kind, _ provision.Job) (provision.Outcome, bool) {
		return provision.Outcome{}, kind != provisionfake.Clean
	}
	h.checkHosts()
	bh := h.shows("h1", map[string]string{berthv1.HostQuarantined: "True/" + berthv1.QuarantineCleansPending, berthv1.HostReady: "False/Quarantined"})
	if bh.Status.PendingCleans != 1 || !strings.Contains(bh.Status.QuarantineReason, "1 build user(s) still to be removed") {
		t.Errorf("h1: %d pending cleans, reason %q; want 1, saying a build user is still to be removed", bh.Status.PendingCleans, bh.Status.QuarantineReason)
	}
	if running := h.prov.Running(provisionfake.Clean); len(running) != 1 || running[0].User != user || h.cleansOf(user) != 2 {
		t.Errorf("cleans running %+v after %d started: want %s's retried at the check", running, h.cleansOf(user), user)
	}
	h.waiting("waiter") // h1 has a free slot, but is not in service
	lastCheck := bh.Status.LastCheck
	if n := len(h.hostEvents("h1", "HostQuarantined")); n != 1 {
		t.Errorf("%d HostQuarantined Events, want 1: the host never left quarantine", n)
	}

	if err := h.prov.End(provisionfake.Clean, user, provision.Outcome{}); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if h.record(ended) != nil {
		t.Fatal("the record outlived its paid debt")
	}
	// Back in service as the last owed user goes, not at the next check.
	bh = h.shows("h1", map[string]string{berthv1.HostQuarantined: "False/NotQuarantined", berthv1.HostReady: "True/TakesTasks"})
	if bh.Status.PendingCleans != 0 {
		t.Errorf("h1 shows %d pending cleans, want 0", bh.Status.PendingCleans)
	}
	if bh.Status.LastCheck == nil || !bh.Status.LastCheck.Equal(lastCheck) {
		t.Errorf("h1's last check moved to %v without a check (was %v)", bh.Status.LastCheck, lastCheck)
	}
	h.handedOver(waiter)
	if users := h.prov.Users("h1"); slices.Contains(users, user) {
		t.Errorf("%s is still on h1: %v", user, users)
	}
}

// A drained host takes no new task though it has a free slot, and a passing check does not
// undo the drain; the task already on it keeps its user, finishes and is cleaned as usual.
// Undraining serves the waiter. The record shows Draining for the spec it was computed from.
func TestADrainedHostTakesNoNewTaskUntilUndrained(t *testing.T) {
	h := newHostsHarness(t, hostsConfig(2, "h1"), nil)
	h.checkHosts()
	running := h.create(userTaskRun("running", s390x))
	h.settle()
	user, _ := h.handedOver(running)
	handed := h.secret("running")

	h.operate("h1", func(s *berthv1.BuildHostSpec) { s.Drained = true })
	bh := h.shows("h1", map[string]string{berthv1.HostDraining: "True/Drained", berthv1.HostReady: "False/Drained", berthv1.HostQuarantined: "False/NotQuarantined"})
	if bh.Generation != 2 {
		t.Fatalf("generation %d after one spec change, want 2: the conditions' generations would prove nothing", bh.Generation)
	}
	next := h.create(userTaskRun("next", s390x))
	h.settle()
	h.waiting("next")
	h.checkHosts()
	h.waiting("next")
	h.shows("h1", map[string]string{berthv1.HostDraining: "True/Drained", berthv1.HostReady: "False/Drained"})

	if s := h.secret("running"); s == nil || s.ResourceVersion != handed.ResourceVersion {
		t.Error("the drain touched the running task's secret")
	}
	h.finish("running")
	h.settle()
	if h.record(running) != nil || slices.Contains(h.prov.Users("h1"), user) {
		t.Errorf("the task that ended on the drained host was not cleaned: users %v", h.prov.Users("h1"))
	}
	h.waiting("next")

	h.operate("h1", func(s *berthv1.BuildHostSpec) { s.Drained = false })
	h.shows("h1", map[string]string{berthv1.HostDraining: "False/NotDrained", berthv1.HostReady: "True/TakesTasks"})
	if _, address := h.handedOver(next); address != addressOf(0) {
		t.Errorf("the waiter went to %s, want h1", address)
	}
}

// A drain is kept in the host's record: a controller that restarts while a task runs on a
// drained host hands no new task to it, from its first decision on (before the record's own
// event reaches the hosts' owner), keeps the running task's slot, and cleans that task's user
// when it ends. Undraining after the restart serves the waiter.
func TestARestartedControllerKeepsADrainedHostOut(t *testing.T) {
	h := newHostsHarness(t, hostsConfig(2, "h1", "h2"), nil)
	h.checkHosts()
	running := h.create(userTaskRun("running", s390x))
	h.settle()
	user, address := h.handedOver(running)
	if address != addressOf(0) {
		t.Fatalf("the first task went to %s, want h1 (%s)", address, addressOf(0))
	}
	h.operate("h1", func(s *berthv1.BuildHostSpec) { s.Drained = true })
	h.operate("h2", func(s *berthv1.BuildHostSpec) { s.Drained = true })

	h.start() // no host event has reached the new process's hosts' owner yet
	next := h.create(userTaskRun("next", s390x))
	h.settle()
	h.waiting("next")
	if jobs := h.hostJobs(); len(jobs) > 0 {
		t.Errorf("the restarted controller worked on drained hosts: %v", jobs)
	}
	if h.record(running) == nil {
		t.Fatal("the running task lost its record in the restart")
	}

	h.finish("running")
	h.settle()
	if h.record(running) != nil || !slices.Contains(h.hostJobs(), "clean "+user+"@h1") {
		t.Errorf("the task that ended on the drained host was not cleaned: record %v, host jobs %v", h.record(running), h.hostJobs())
	}
	h.waiting("next")

	h.operate("h2", func(s *berthv1.BuildHostSpec) { s.Drained = false })
	if _, address := h.handedOver(next); address != addressOf(1) {
		t.Errorf("the waiter went to %s, want h2 (%s), undrained", address, addressOf(1))
	}
}

// Forgetting a host that is gone for good drops the build users owed to it: their records
// stop retrying the clean and go, the operator learns which user to remove by hand (an Event
// on the record), their slots are free, and the host is left drained with nothing pending. The
// user stays on the host: berth does not touch it again. Undraining hands the freed slot out.
func TestForgettingAHostDropsItsDebtsAndLeavesItDrained(t *testing.T) {
	clock := newTestClock()
	h := newHostsHarness(t, hostsConfig(1, "h1", "h2"), func(r *Reconciler) { r.now = clock.now })
	h.checkHosts()
	first := h.create(userTaskRun("first", s390x))
	second := h.create(userTaskRun("second", s390x))
	h.settle()
	user, address := h.handedOver(first)
	if _, other := h.handedOver(second); address != addressOf(0) || other != addressOf(1) {
		t.Fatalf("tasks on %s and %s, want h1 and h2", address, other)
	}

	// h1 dies with the user on it: its clean is owed and holds h1's slot.
	h.prov.Rule = cleansUnreachableOn("h1")
	h.finish("first")
	h.create(userTaskRun("waiter", s390x))
	h.settle()
	if rec := h.record(first); rec == nil || rec.Status.Phase != berthv1.PhaseCleaning || len(rec.Status.Debts) != 1 {
		t.Fatalf("record %+v, want Cleaning with %s owed", rec, user)
	}
	recName := h.record(first).Name
	h.waiting("waiter")
	cleans := h.cleansOf(user)

	h.operate("h1", func(s *berthv1.BuildHostSpec) { s.Forget = true })
	if h.record(first) != nil {
		t.Error("the record of the forgotten debt is left")
	}
	if e := h.events.on("Allocation", berthNS, recName, "DebtForgotten"); len(e) != 1 || e[0].eventType != corev1.EventTypeWarning ||
		!strings.Contains(e[0].note, "build user "+user+" of "+tenantNS+"/first") || !strings.Contains(e[0].note, "remove the user by hand") {
		t.Errorf("DebtForgotten Events on the record: %+v", e)
	}
	bh := h.buildHost("h1")
	if bh.Spec.Forget || !bh.Spec.Drained || bh.Status.PendingCleans != 0 || len(bh.Status.Leftovers) > 0 {
		t.Errorf("h1 after the forget: spec %+v, %d pending cleans, leftovers %v; want drained, forget done, nothing pending",
			bh.Spec, bh.Status.PendingCleans, bh.Status.Leftovers)
	}
	h.hostEvent("h1") // the event of the forget's own spec write
	h.shows("h1", map[string]string{berthv1.HostDraining: "True/Drained", berthv1.HostReady: "False/Drained"})
	h.waiting("waiter")

	clock.advance(maxCleanBackoff)
	h.enqueue("first") // the failed clean's backoff comes due
	h.settle()
	if n := h.cleansOf(user); n != cleans {
		t.Errorf("berth cleaned %s again after forgetting it (%d cleans, were %d)", user, n, cleans)
	}
	if users := h.prov.Users("h1"); !slices.Equal(users, []string{user}) {
		t.Errorf("users on h1 %v, want %s left for the operator", users, user)
	}

	h.operate("h1", func(s *berthv1.BuildHostSpec) { s.Drained = false })
	if _, address := h.handedOver(h.get("waiter")); address != addressOf(0) {
		t.Errorf("the waiter went to %s, want h1's freed slot", address)
	}
}

// A build user that leaves what its clean cannot remove costs only its own slot: the host's
// record says what was left (and an Event on it), its clean keeps failing past the count that
// quarantines a host for cleans, yet the host stays in service, and even a passing check lifts
// a quarantine with only that user owed. The user's slot stays owed; once the clean passes,
// the entry goes and the slot serves the next task.
func TestLeftoversCostOnlyTheBuildUsersOwnSlot(t *testing.T) {
	const threshold = 2
	clock := newTestClock()
	h := newHostsHarness(t, hostsConfig(2, "h1"), func(r *Reconciler) {
		r.Hosts.(*hosts.Owner).QuarantineAfterCleanFailures = threshold
		r.now = clock.now
	})
	dirty := h.create(userTaskRun("dirty", s390x))
	h.settle()
	user, _ := h.handedOver(dirty)

	const what = "1 process(es) of its IDs still run, e.g. pid 4242 (sleep, state D)"
	h.prov.Rule = func(kind provisionfake.Kind, j provision.Job) (provision.Outcome, bool) {
		if kind == provisionfake.Clean {
			// As it reaches the debts from the SSH provisioner: wrapped.
			return provision.Outcome{Err: fmt.Errorf("removing build user %s: %w", j.User, &hostops.LeftoverError{Host: j.Login.Address, User: j.User, What: what})}, true
		}
		return provision.Outcome{}, true
	}
	h.finish("dirty")
	h.settle()
	for range threshold + 1 {
		clock.advance(maxCleanBackoff)
		h.enqueue("dirty") // the backoff's requeue
		h.settle()
	}
	failures := threshold + 2
	if rec := h.record(dirty); rec == nil || rec.Status.CleanFailures != failures {
		t.Fatalf("record %+v, want %d failed cleans", rec, failures)
	}
	bh := h.shows("h1", map[string]string{berthv1.HostQuarantined: "False/NotQuarantined", berthv1.HostReady: "True/TakesTasks"})
	want := berthv1.Leftover{BuildUser: user, TaskRun: tenantNS + "/dirty", What: what, Failures: failures}
	if len(bh.Status.Leftovers) != 1 || func(l berthv1.Leftover) berthv1.Leftover { l.LastFailure = metav1.Time{}; return l }(bh.Status.Leftovers[0]) != want {
		t.Errorf("leftovers on h1's record %+v, want %+v", bh.Status.Leftovers, want)
	}
	if e := h.hostEvents("h1", "BuildUserLeftovers"); len(e) != failures || e[0].eventType != corev1.EventTypeWarning ||
		!strings.Contains(e[0].note, "build user "+user+" of "+tenantNS+"/dirty left "+what) || !strings.Contains(e[0].note, "the host stays in service") {
		t.Errorf("BuildUserLeftovers Events on h1: %+v", e)
	}

	// A failed check quarantines the host; the next passing one lifts it though the dirty user
	// is still owed: what a user left never keeps the host out.
	h.sick(map[string]string{"h1": "host 10.0.0.1 is unreachable over SSH: connection reset"})
	h.checkHosts()
	h.sick(nil)
	h.checkHosts()
	bh = h.shows("h1", map[string]string{berthv1.HostQuarantined: "False/NotQuarantined", berthv1.HostReady: "True/TakesTasks"})
	if bh.Status.PendingCleans != 1 || len(bh.Status.Leftovers) != 1 {
		t.Errorf("h1: %d pending cleans, leftovers %+v; want the dirty user still owed and told", bh.Status.PendingCleans, bh.Status.Leftovers)
	}

	// The host's other slot serves; the dirty user's slot is still owed.
	other := h.create(userTaskRun("other", s390x))
	third := h.create(userTaskRun("third", s390x))
	h.settle()
	if _, address := h.handedOver(other); address != addressOf(0) {
		t.Errorf("the next task went to %s, want h1", address)
	}
	h.waiting("third")

	h.prov.Rule = nil // what was left can go now
	clock.advance(maxCleanBackoff)
	h.enqueue("dirty") // the backoff's requeue
	h.settle()
	if h.record(dirty) != nil || slices.Contains(h.prov.Users("h1"), user) {
		t.Fatalf("%s was not removed once its clean could pass", user)
	}
	if bh := h.buildHost("h1"); len(bh.Status.Leftovers) > 0 {
		t.Errorf("leftovers on h1's record after the user went: %+v", bh.Status.Leftovers)
	}
	h.handedOver(third)
	if h.quarantined("h1") {
		t.Error("h1 is quarantined")
	}
}

// Cleans that fail in a way no tenant can cause quarantine the host once they failed
// QuarantineAfterCleanFailures times in a row: berth cannot log in to it, or cleans of users of
// two namespaces fail unexplained (one namespace's alone never do, however often). The
// quarantined host takes no new task though it has a free slot; a passing check retries the
// cleans, and the check after them puts it back.
func TestCleansThatShowTheHostBrokenQuarantineIt(t *testing.T) {
	const threshold = 2
	for _, tc := range []struct {
		name       string
		err        func(j provision.Job) error
		namespaces []string // a task of each, on h1
		why        string
	}{
		{"berth cannot log in", func(j provision.Job) error {
			return &remote.LoginError{Host: j.Login.Address, User: "root", Err: errors.New("ssh: unable to authenticate")}
		}, []string{tenantNS}, "berth cannot log in to it"},
		{"two namespaces' cleans fail unexplained", func(j provision.Job) error {
			return &remote.RemoteError{Host: j.Login.Address, Command: "removing user " + j.User, ExitCode: 1, Stderr: "userdel: cannot lock /etc/passwd; try again later"}
		}, []string{tenantNS, otherNS}, "cleans of build users of different namespaces (other, tenant) fail there"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newTestClock()
			h := newHostsHarness(t, hostsConfig(3, "h1"), func(r *Reconciler) {
				r.Hosts.(*hosts.Owner).QuarantineAfterCleanFailures = threshold
				r.now = clock.now
			})
			var tasks []*pipelinev1.TaskRun
			for i, ns := range tc.namespaces {
				tr := userTaskRun(fmt.Sprintf("task-%d", i), s390x)
				tr.Namespace = ns
				tasks = append(tasks, h.createIn(tr))
			}
			h.settle()
			h.prov.Rule = func(kind provisionfake.Kind, j provision.Job) (provision.Outcome, bool) {
				if kind == provisionfake.Clean {
					return provision.Outcome{Err: tc.err(j)}, true
				}
				return provision.Outcome{}, true
			}
			for i, tr := range tasks {
				h.finishIn(tr)
				h.settle()
				for failures := 1; failures < threshold; failures++ {
					if h.quarantined("h1") {
						t.Fatalf("quarantined after %d failure(s) of %s's clean, threshold %d", failures, tr.Namespace, threshold)
					}
					clock.advance(maxCleanBackoff)
					h.queue.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tr)}) // the backoff's requeue
					h.settle()
				}
				if rec := h.record(tr); rec == nil || rec.Status.CleanFailures != threshold {
					t.Fatalf("record of %s: %+v, want %d failed cleans", tr.Name, rec, threshold)
				}
				if i < len(tasks)-1 {
					// One namespace's failures, past the threshold: the host stays in service.
					h.queue.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tr)})
					h.settle()
					if h.quarantined("h1") {
						t.Fatalf("quarantined for the failing cleans of one namespace (%s): %s", tr.Namespace, h.buildHost("h1").Status.QuarantineReason)
					}
				}
			}
			bh := h.shows("h1", map[string]string{berthv1.HostQuarantined: "True/" + berthv1.QuarantineCleansFailing, berthv1.HostReady: "False/Quarantined"})
			if !strings.Contains(bh.Status.QuarantineReason, tc.why) {
				t.Errorf("quarantine reason %q lacks %q", bh.Status.QuarantineReason, tc.why)
			}
			if e := h.hostEvents("h1", "HostQuarantined"); len(e) != 1 || e[0].eventType != corev1.EventTypeWarning || !strings.Contains(e[0].note, tc.why) {
				t.Errorf("HostQuarantined Events on h1: %+v", e)
			}
			waiter := h.create(userTaskRun("waiter", s390x))
			h.settle()
			h.waiting("waiter") // h1 has a free slot

			h.prov.Rule = nil
			// The check passes and retries the cleans at once: they pass, and the host is back
			// in service as the last one does, without waiting for another check.
			h.checkHosts()
			for _, tr := range tasks {
				if rec := h.record(tr); rec != nil {
					t.Fatalf("the record of %s owes %+v after the check retried its clean", tr.Name, rec.Status.Debts)
				}
			}
			h.shows("h1", map[string]string{berthv1.HostQuarantined: "False/NotQuarantined", berthv1.HostReady: "True/TakesTasks"})
			h.handedOver(waiter)
		})
	}
}

// A host being forgotten is out of service from the moment its debts go: freeing their slots
// wakes the waiters, and a worker that reconciles one while the forget is still writing the
// host's record must not be handed the host that is going away.
func TestAForgottenHostIsNotHandedOutWhileItIsForgotten(t *testing.T) {
	var duringForget func()
	h := &hostsHarness{&harness{t: t, api: withGenerations(newAPIServer()), events: &eventLog{}, cfg: hostsConfig(1, "h1", "h2"),
		faults: &interceptor.Funcs{SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if f := duringForget; f != nil && sub == "status" {
				duringForget = nil
				f()
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		}}}}
	h.start()
	h.checkHosts()
	first := h.create(userTaskRun("first", s390x))
	h.create(userTaskRun("second", s390x))
	h.settle()
	if _, address := h.handedOver(first); address != addressOf(0) {
		t.Fatalf("first is on %s, want h1", address)
	}
	// h1 dies with first's user on it: the clean is owed and holds h1's slot.
	h.prov.Rule = cleansUnreachableOn("h1")
	h.finish("first")
	h.create(userTaskRun("waiter", s390x))
	h.settle()
	h.waiting("waiter")

	// Another worker reconciles the waiter, woken by the freed slot, while the forget writes.
	duringForget = func() {
		req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: tenantNS, Name: "waiter"}}
		if _, err := h.r.Reconcile(h.ctx, req); err != nil {
			t.Errorf("reconciling the waiter during the forget: %v", err)
		}
	}
	h.operate("h1", func(s *berthv1.BuildHostSpec) { s.Forget = true })
	if duringForget != nil {
		t.Fatal("the forget wrote no status: the test did not reconcile the waiter in between")
	}
	h.waiting("waiter")
	if rec := h.record(h.get("waiter")); rec != nil {
		t.Errorf("the waiter has a record (%s on %v, failed hosts %v): it was handed the host being forgotten",
			rec.Status.Phase, rec.Status.Login, rec.Status.FailedHosts)
	}
}

// cleansUnreachableOn is a provisioner whose cleans on host fail as on a host that died; every
// other job ends well at once.
func cleansUnreachableOn(host string) provisionfake.Rule {
	return func(kind provisionfake.Kind, j provision.Job) (provision.Outcome, bool) {
		if kind == provisionfake.Clean && j.Login.Host == host {
			return provision.Outcome{Err: &remote.UnreachableError{Host: j.Login.Address, Err: errors.New("connection timed out")}}, true
		}
		return provision.Outcome{}, true
	}
}
