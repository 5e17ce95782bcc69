// Package incident words the failures a tenant is told about (the error key of its task's
// secret, Events on its TaskRun): the kind of failure and what to do next, never the failure's
// own text. A cloud's refusal names the IAM principal, the account and policy details; an SSH
// failure names admin users, addresses, key fingerprints and what a script printed. Those go
// to the operator only (Events on berth's own records, in berth's namespace, and the log),
// and a Ref joins the two: the tenant quotes it, the operator finds it.
package incident

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/remote"
)

// Ref names one failure (or one run of failures of a platform) on both sides: in what the
// tenant is told, and in the operator's log line and Event that carry the details. It is
// random, so it tells nothing about the failure itself.
type Ref string

// refBytes: 40 bits keep two live incidents apart with near certainty and stay short enough
// to read out over a chat.
const refBytes = 5

// NewRef makes a fresh reference, "ref-" and 10 hex digits.
func NewRef() Ref {
	b := make([]byte, refBytes)
	// crypto/rand.Read never fails on the platforms berth runs on (Go 1.24 documents that
	// it crashes the program instead).
	_, _ = rand.Read(b)
	return Ref("ref-" + hex.EncodeToString(b))
}

func (r Ref) String() string { return string(r) }

// Where tells the tenant what to hand the platform team and where they look it up.
func (r Ref) Where(namespace string) string {
	return fmt.Sprintf("quote reference %s to the platform team: berth's log and the Events in its namespace %s hold the details under it", r, namespace)
}

// Cloud words a cloud provider's failure of kind k for a tenant: what happened, in terms of
// the kind alone, and what to do next. The kind's own name stays in the text, so that a
// tenant and the operator speak of the same thing.
func Cloud(k cloud.Kind) (what, next string) {
	switch k {
	case cloud.Auth:
		return "the cloud refused berth's credentials or permissions (" + k.String() + ")",
			"re-running the task will not help until the platform team fixes the platform's cloud credentials or permissions"
	case cloud.BadConfig:
		return "the cloud rejected the platform's VM settings (" + k.String() + ")",
			"re-running the task will not help until the platform team fixes the platform's settings in berth's host configuration"
	case cloud.Quota:
		return "the cloud account has no quota left for more VMs (" + k.String() + ")",
			"retry later, or ask the platform team to raise the quota or lower the platform's max-instances"
	case cloud.Capacity:
		return "the cloud had no capacity for the platform's VM type (" + k.String() + ")",
			"retry later, or ask the platform team for another instance type or region"
	case cloud.Throttled:
		return "the cloud throttled berth's requests (" + k.String() + ")",
			"retry later"
	case cloud.NotFound:
		return "the cloud lost track of a VM berth launched (" + k.String() + ")",
			"retry later"
	}
	return "the cloud's API failed or could not be reached (" + k.String() + ")",
		"retry later"
}

// Provisioning words a failure to make a build user on a host for a tenant: how far berth
// got, never what the host or the SSH library said. It knows the SSH layer's failures; a
// caller that knows better (a user name already taken, say) words that itself.
func Provisioning(err error) string {
	var unreachable *remote.UnreachableError
	var failed *remote.RemoteError
	var login *remote.LoginError
	switch {
	case errors.As(err, &unreachable):
		return "the host could not be reached over SSH"
	case remote.IsHostKeyChanged(err):
		return "the host presented an SSH host key other than the one berth trusts, so berth did not log in"
	case errors.As(err, &failed):
		return "creating the build user failed on the host"
	case errors.As(err, &login):
		return "the host refused berth's admin login"
	}
	return "berth could not create the build user there"
}

// NoteLimit is the most bytes the apiserver takes in an Event's note through events.k8s.io/v1
// (NoteLengthLimit in k8s.io/kubernetes pkg/apis/core/validation/events.go): it refuses a
// longer one, and the Event is lost. A cloud's refusal with its encoded authorization message,
// or a script's output, can be longer.
const NoteLimit = 1024

// clipped ends a note cut to fit, pointing to the log line that carries it whole.
const clipped = " [cut; whole in berth's log]"

// Note fits text into an Event's note, cut at a rune boundary; the caller's log line keeps
// it whole.
func Note(text string) string {
	if len(text) <= NoteLimit {
		return text
	}
	cut := NoteLimit - len(clipped)
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut--
	}
	return text[:cut] + clipped
}
