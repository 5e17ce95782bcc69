package v1alpha1

import (
	"strings"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The types of a BuildHost's conditions.
const (
	// HostReady is True while the host takes new tasks: neither drained nor quarantined, and
	// for a VM, up and not retired. Its reason says what keeps it out otherwise.
	HostReady = "Ready"
	// HostQuarantined is True while berth keeps the host out of service for its own checks or
	// cleanups; its reason is one of the Quarantine... causes, its message the quarantine
	// reason (status.quarantineReason).
	HostQuarantined = "Quarantined"
	// HostDraining is True while an operator has drained the host (spec.drained): tasks on it
	// finish; it takes no new one.
	HostDraining = "Draining"
	// HostBuildsBounded is False (reason NoSystemd) while the host's check finds no systemd:
	// its builds take their per-process limits but no slice bounds each build as a whole. The
	// condition is there only then: it warns, and keeps the host from no task.
	HostBuildsBounded = "BuildsBounded"
)

// BuildsUnbounded is the reason of a False HostBuildsBounded.
const BuildsUnbounded = "NoSystemd"

// SetBuildsBounded records a check's warning that builds on the host are not bounded as a
// whole (warning != ""), or that they are (warning == "": the condition goes). It tells
// whether the warning is new.
func (b *BuildHost) SetBuildsBounded(warning string, now time.Time) (appeared bool) {
	if warning == "" {
		meta.RemoveStatusCondition(&b.Status.Conditions, HostBuildsBounded)
		return false
	}
	appeared = meta.FindStatusCondition(b.Status.Conditions, HostBuildsBounded) == nil
	meta.SetStatusCondition(&b.Status.Conditions, metav1.Condition{Type: HostBuildsBounded, Status: metav1.ConditionFalse,
		Reason: BuildsUnbounded, Message: bounded(warning), ObservedGeneration: b.Generation, LastTransitionTime: metav1.NewTime(now)})
	return appeared
}

// Why berth quarantined a host: the reason of its Quarantined condition.
const (
	// QuarantineCheckFailed: the host failed its health check.
	QuarantineCheckFailed = "CheckFailed"
	// QuarantineCleansFailing: removing build users from the host keeps failing in a way that
	// shows the host broken.
	QuarantineCleansFailing = "CleansFailing"
	// QuarantineCleansPending: the host passes its check again, but build users are still to be
	// removed before it takes builds.
	QuarantineCleansPending = "CleansPending"
	// QuarantineUnexplained: a record quarantined before berth kept the cause.
	QuarantineUnexplained = "Quarantined"
)

// Quarantine takes the host out of service until a check passes: cause is one of the
// Quarantine... reasons, message what the operator reads. SetConditions, at the status write,
// does the rest.
func (b *BuildHost) Quarantine(cause, message string, now time.Time) {
	b.Status.Quarantined, b.Status.QuarantineReason = true, message
	meta.SetStatusCondition(&b.Status.Conditions, metav1.Condition{Type: HostQuarantined, Status: metav1.ConditionTrue,
		Reason: cause, Message: bounded(message), ObservedGeneration: b.Generation, LastTransitionTime: metav1.NewTime(now)})
}

// SetConditions brings the conditions and ObservedGeneration in line with the record's spec
// and the rest of its status. Every write of a BuildHost's status calls it, so that the
// conditions never say other than the fields do. now stamps a condition whose status changes.
func (b *BuildHost) SetConditions(now time.Time) {
	at := metav1.NewTime(now)
	gen := b.Generation
	set := func(typ string, status bool, reason, message string) {
		s := metav1.ConditionFalse
		if status {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&b.Status.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: bounded(message),
			ObservedGeneration: gen, LastTransitionTime: at})
	}
	st := &b.Status
	st.ObservedGeneration = gen

	if st.Quarantined {
		cause := QuarantineUnexplained
		if c := meta.FindStatusCondition(st.Conditions, HostQuarantined); c != nil && c.Status == metav1.ConditionTrue && c.Reason != "" {
			cause = c.Reason
		}
		set(HostQuarantined, true, cause, st.QuarantineReason)
	} else {
		set(HostQuarantined, false, "NotQuarantined", "")
	}

	if b.Spec.Drained {
		set(HostDraining, true, "Drained", "an operator drained the host: tasks on it finish; it takes no new one")
	} else {
		set(HostDraining, false, "NotDrained", "")
	}

	reason, message := b.notReady()
	set(HostReady, reason == "", orElse(reason, "TakesTasks"), message)
}

// notReady is why the host takes no new task, "" when it takes them.
func (b *BuildHost) notReady() (reason, message string) {
	if in := b.Spec.Instance; in != nil {
		phase, detail := InstanceLaunching, ""
		if st := b.Status.Instance; st != nil {
			detail = st.Message
			if st.Phase != "" {
				phase = st.Phase
			}
		}
		switch {
		case phase == InstanceTerminating:
			return string(phase), orElse(detail, "the VM is being terminated: "+in.Retire)
		case phase != InstanceReady:
			return string(phase), orElse(detail, "the VM is "+strings.ToLower(string(phase)))
		case in.Retire != "":
			return "Retired", "the VM takes no new tasks: " + in.Retire
		}
	}
	switch {
	case b.Status.Quarantined:
		return "Quarantined", b.Status.QuarantineReason
	case b.Spec.Drained:
		return "Drained", "an operator drained the host"
	}
	return "", ""
}

func orElse(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// maxMessage is the longest message the apiserver takes in a condition; a longer one would
// fail every status write of the record.
const maxMessage = 32768

// bounded cuts a message to maxMessage bytes, on a rune boundary.
func bounded(message string) string {
	if len(message) <= maxMessage {
		return message
	}
	cut := maxMessage - len("...")
	for cut > 0 && !utf8.RuneStart(message[cut]) {
		cut--
	}
	return message[:cut] + "..."
}
