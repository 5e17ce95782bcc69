package v1alpha1

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What kubectl shows of a host (its Ready, Quarantined and Draining conditions) is what its
// spec and status say.
func TestSetConditions(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	static := func() *BuildHost {
		return &BuildHost{ObjectMeta: metav1.ObjectMeta{Name: "s390x-1", Generation: 3}, Spec: BuildHostSpec{HostName: "s390x-1"}}
	}
	vm := func(phase InstancePhase, retire, message string) *BuildHost {
		b := &BuildHost{ObjectMeta: metav1.ObjectMeta{Name: "vm-linux-arm64-x1", Generation: 3},
			Spec: BuildHostSpec{Instance: &InstanceSpec{Platform: "linux/arm64", Retire: retire}}}
		if phase != "" || message != "" {
			b.Status.Instance = &InstanceStatus{Phase: phase, Message: message}
		}
		return b
	}
	type want struct {
		status  metav1.ConditionStatus
		reason  string
		message string
	}
	for _, tc := range []struct {
		name                         string
		host                         *BuildHost
		ready, quarantined, draining want
	}{
		{
			name:        "a static host in service",
			host:        static(),
			ready:       want{metav1.ConditionTrue, "TakesTasks", ""},
			quarantined: want{metav1.ConditionFalse, "NotQuarantined", ""},
			draining:    want{metav1.ConditionFalse, "NotDrained", ""},
		},
		{
			name:        "drained",
			host:        func() *BuildHost { b := static(); b.Spec.Drained = true; return b }(),
			ready:       want{metav1.ConditionFalse, "Drained", "an operator drained the host"},
			quarantined: want{metav1.ConditionFalse, "NotQuarantined", ""},
			draining:    want{metav1.ConditionTrue, "Drained", "an operator drained the host: tasks on it finish; it takes no new one"},
		},
		{
			name: "quarantined by a failed check, and drained",
			host: func() *BuildHost {
				b := static()
				b.Spec.Drained = true
				b.Quarantine(QuarantineCheckFailed, "less than 10Gi free at /home", now)
				return b
			}(),
			ready:       want{metav1.ConditionFalse, "Quarantined", "less than 10Gi free at /home"},
			quarantined: want{metav1.ConditionTrue, "CheckFailed", "less than 10Gi free at /home"},
			draining:    want{metav1.ConditionTrue, "Drained", "an operator drained the host: tasks on it finish; it takes no new one"},
		},
		{
			name: "quarantined before berth kept the cause",
			host: func() *BuildHost {
				b := static()
				b.Status.Quarantined, b.Status.QuarantineReason = true, "cleanups keep failing: no route to host"
				return b
			}(),
			ready:       want{metav1.ConditionFalse, "Quarantined", "cleanups keep failing: no route to host"},
			quarantined: want{metav1.ConditionTrue, "Quarantined", "cleanups keep failing: no route to host"},
			draining:    want{metav1.ConditionFalse, "NotDrained", ""},
		},
		{
			name:        "a VM recorded, not yet launched",
			host:        vm("", "", ""),
			ready:       want{metav1.ConditionFalse, "Launching", "the VM is launching"},
			quarantined: want{metav1.ConditionFalse, "NotQuarantined", ""},
			draining:    want{metav1.ConditionFalse, "NotDrained", ""},
		},
		{
			name:        "a VM waiting for SSH",
			host:        vm(InstanceBooting, "", "waiting for SSH: connection refused"),
			ready:       want{metav1.ConditionFalse, "Booting", "waiting for SSH: connection refused"},
			quarantined: want{metav1.ConditionFalse, "NotQuarantined", ""},
			draining:    want{metav1.ConditionFalse, "NotDrained", ""},
		},
		{
			name:        "a ready VM",
			host:        vm(InstanceReady, "", ""),
			ready:       want{metav1.ConditionTrue, "TakesTasks", ""},
			quarantined: want{metav1.ConditionFalse, "NotQuarantined", ""},
			draining:    want{metav1.ConditionFalse, "NotDrained", ""},
		},
		{
			name:        "a retired VM still serving its task",
			host:        vm(InstanceReady, "it served its task", ""),
			ready:       want{metav1.ConditionFalse, "Retired", "the VM takes no new tasks: it served its task"},
			quarantined: want{metav1.ConditionFalse, "NotQuarantined", ""},
			draining:    want{metav1.ConditionFalse, "NotDrained", ""},
		},
		{
			name:        "a VM being terminated",
			host:        vm(InstanceTerminating, "it is older than max-age", ""),
			ready:       want{metav1.ConditionFalse, "Terminating", "the VM is being terminated: it is older than max-age"},
			quarantined: want{metav1.ConditionFalse, "NotQuarantined", ""},
			draining:    want{metav1.ConditionFalse, "NotDrained", ""},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.host
			b.SetConditions(now)
			if b.Status.ObservedGeneration != 3 {
				t.Errorf("observedGeneration %d, want 3", b.Status.ObservedGeneration)
			}
			for typ, w := range map[string]want{HostReady: tc.ready, HostQuarantined: tc.quarantined, HostDraining: tc.draining} {
				c := meta.FindStatusCondition(b.Status.Conditions, typ)
				if c == nil {
					t.Errorf("no %s condition", typ)
					continue
				}
				if got := (want{c.Status, c.Reason, c.Message}); got != w {
					t.Errorf("%s: %+v, want %+v", typ, got, w)
				}
				if c.ObservedGeneration != 3 || !c.LastTransitionTime.Time.Equal(now) {
					t.Errorf("%s: observedGeneration %d, lastTransitionTime %v; want 3 and %v", typ, c.ObservedGeneration, c.LastTransitionTime, now)
				}
			}
			if len(b.Status.Conditions) != 3 {
				t.Errorf("%d conditions, want 3: %+v", len(b.Status.Conditions), b.Status.Conditions)
			}
			again := b.DeepCopy()
			again.SetConditions(now.Add(time.Minute))
			if !equality.Semantic.DeepEqual(again.Status, b.Status) {
				t.Errorf("a second pass over the same record changed it:\n%+v\nwant\n%+v", again.Status, b.Status)
			}
		})
	}
}

// A condition keeps the time it last changed while its status holds, and the quarantine keeps
// its cause through writes that do not touch it, until it is lifted.
func TestConditionsChangeOverAHostsLife(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	b := &BuildHost{ObjectMeta: metav1.ObjectMeta{Name: "s390x-1", Generation: 1}, Spec: BuildHostSpec{HostName: "s390x-1"}}
	b.SetConditions(t0)

	t1 := t0.Add(time.Minute)
	b.Quarantine(QuarantineCleansFailing, "cleanups keep failing: berth cannot log in to it", t1)
	b.SetConditions(t1)

	t2 := t1.Add(time.Minute)
	b.Status.PendingCleans = 2 // a later check, the host still down
	b.SetConditions(t2)
	q := meta.FindStatusCondition(b.Status.Conditions, HostQuarantined)
	if q.Reason != QuarantineCleansFailing || !q.LastTransitionTime.Time.Equal(t1) {
		t.Fatalf("quarantined: %s since %v, want %s since %v", q.Reason, q.LastTransitionTime, QuarantineCleansFailing, t1)
	}

	t3 := t2.Add(time.Minute)
	b.Quarantine(QuarantineCleansPending, "reachable again; 2 build user(s) still to be removed before it takes builds", t3)
	b.SetConditions(t3)
	if q := meta.FindStatusCondition(b.Status.Conditions, HostQuarantined); q.Reason != QuarantineCleansPending || !q.LastTransitionTime.Time.Equal(t1) {
		t.Fatalf("reachable again: %s since %v, want %s, still since %v", q.Reason, q.LastTransitionTime, QuarantineCleansPending, t1)
	}

	t4 := t3.Add(time.Minute)
	b.Status.Quarantined, b.Status.QuarantineReason = false, ""
	b.Generation = 2 // drained meanwhile
	b.Spec.Drained = true
	b.SetConditions(t4)
	for _, tc := range []struct {
		typ    string
		status metav1.ConditionStatus
		since  time.Time
	}{
		{HostQuarantined, metav1.ConditionFalse, t4},
		{HostDraining, metav1.ConditionTrue, t4},
		{HostReady, metav1.ConditionFalse, t1},
	} {
		c := meta.FindStatusCondition(b.Status.Conditions, tc.typ)
		if c.Status != tc.status || !c.LastTransitionTime.Time.Equal(tc.since) || c.ObservedGeneration != 2 {
			t.Errorf("%s: %s since %v (generation %d), want %s since %v (generation 2)", tc.typ, c.Status, c.LastTransitionTime, c.ObservedGeneration, tc.status, tc.since)
		}
	}
	if r := meta.FindStatusCondition(b.Status.Conditions, HostReady); r.Reason != "Drained" {
		t.Errorf("ready's reason once lifted and drained: %s, want Drained", r.Reason)
	}
}

// A quarantine reason longer than the apiserver takes in a condition is cut, not refused: a
// refused status write would keep the host's record from changing at all.
func TestLongReasonIsCut(t *testing.T) {
	b := &BuildHost{ObjectMeta: metav1.ObjectMeta{Name: "s390x-1"}}
	b.Quarantine(QuarantineCheckFailed, strings.Repeat("é", maxMessage), time.Now())
	b.SetConditions(time.Now())
	for _, c := range b.Status.Conditions {
		if len(c.Message) > maxMessage || !utf8.ValidString(c.Message) {
			t.Errorf("%s: a message of %d bytes (valid UTF-8: %v), want at most %d", c.Type, len(c.Message), utf8.ValidString(c.Message), maxMessage)
		}
	}
}

// A check's warning that builds are not bounded shows on the record while it holds, is told as
// new only once, leaves the host ready, survives the status write's SetConditions, and goes
// when a check no longer warns.
func TestBuildsBoundedFollowsTheCheck(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	b := &BuildHost{ObjectMeta: metav1.ObjectMeta{Name: "s390x-1", Generation: 2}, Spec: BuildHostSpec{HostName: "s390x-1"}}
	if !b.SetBuildsBounded("systemd does not run on host 10.0.0.1", now) {
		t.Error("the first warning is not new")
	}
	if b.SetBuildsBounded("systemd does not run on host 10.0.0.1", now.Add(time.Minute)) {
		t.Error("a repeated warning is new again")
	}
	b.SetConditions(now)
	c := meta.FindStatusCondition(b.Status.Conditions, HostBuildsBounded)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != BuildsUnbounded || !strings.Contains(c.Message, "systemd") || c.ObservedGeneration != 2 {
		t.Fatalf("BuildsBounded is %+v", c)
	}
	if !meta.IsStatusConditionTrue(b.Status.Conditions, HostReady) {
		t.Error("the warning took the host out of service")
	}
	if b.SetBuildsBounded("", now) || meta.FindStatusCondition(b.Status.Conditions, HostBuildsBounded) != nil {
		t.Error("the condition stayed after a check without warning")
	}
}
