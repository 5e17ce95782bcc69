package hosts

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
)

// maxWhat bounds what a host says a build user left, as kept on its BuildHost record: it is
// also the note of an Event, which events.k8s.io/v1 limits to 1 kB.
const maxWhat = 1024

// cleaned is told that a build user is gone from its host: what was told of what the user
// left there goes, and a host kept out until its users were removed may take builds again.
func (h *staticHosts) cleaned(ctx context.Context, d berthv1.Debt) {
	if h.cleans.settled(d.Host, d.BuildUser) {
		h.dropLeftover(ctx, d.Host, d.BuildUser)
	}
	h.cleansDone(ctx, d.Host)
}

// cleanFailed weighs one failed clean of rec's debt d: a failure the host is to blame for
// quarantines it (see cleanVerdicts.failed); one a build user is to blame for is told on the
// host's record and nowhere costs more than the user's own slot. failures is the record's
// count of failed passes in a row; retry is when its cleans are tried again.
func (h *staticHosts) cleanFailed(ctx context.Context, rec *berthv1.Allocation, d berthv1.Debt, err error, failures int, retry time.Duration) {
	fault, left := judgeClean(err)
	seen := cleanFailure{namespace: rec.Spec.TaskRun.Namespace, taskRun: rec.Spec.TaskRun.Key(), fault: fault, failures: failures}
	if left != nil {
		seen.what = bounded(left.What)
	}
	broken := h.cleans.failed(d.Host, d.BuildUser, seen, h.quarantineAfter)
	switch {
	case left != nil:
		h.noteLeftover(ctx, rec, d, seen, retry)
	case broken && fault == faultHost:
		h.quarantineForCleans(ctx, d.Host, fmt.Sprintf("berth cannot log in to it: %v", err))
	case broken:
		h.quarantineForCleans(ctx, d.Host, fmt.Sprintf("cleans of build users of different namespaces (%s) fail there, last: removing build user %s: %v",
			strings.Join(h.cleans.unclearNamespaces(d.Host), ", "), d.BuildUser, err))
	}
}

// noteLeftover tells, on the host's record and in an Event on it, what a build user left that
// its clean cannot remove. The host stays in service.
func (h *staticHosts) noteLeftover(ctx context.Context, rec *berthv1.Allocation, d berthv1.Debt, f cleanFailure, retry time.Duration) {
	bh, err := h.edit(ctx, d.Host, func(bh *berthv1.BuildHost) bool {
		entry := berthv1.Leftover{BuildUser: d.BuildUser, TaskRun: f.taskRun, What: f.what, Failures: f.failures, LastFailure: metav1.NewTime(h.now())}
		i := slices.IndexFunc(bh.Status.Leftovers, func(l berthv1.Leftover) bool { return l.BuildUser == d.BuildUser })
		if i < 0 {
			bh.Status.Leftovers = append(bh.Status.Leftovers, entry)
		} else {
			bh.Status.Leftovers[i] = entry
		}
		return true
	})
	if err != nil {
		logf.FromContext(ctx).Error(err, "recording what a build user left", "host", d.Host, "user", d.BuildUser)
		return
	}
	h.event(ctx, bh, corev1.EventTypeWarning, "BuildUserLeftovers", "Clean",
		"build user %s of %s left %s, which its clean cannot remove; the user's slot stays owed (and counts against namespace %s) and its clean is retried in %s; the host stays in service",
		d.BuildUser, f.taskRun, f.what, rec.Spec.TaskRun.Namespace, retry)
}

// dropLeftover takes a build user that is gone off its host's record.
func (h *staticHosts) dropLeftover(ctx context.Context, host, user string) {
	_, err := h.edit(ctx, host, func(bh *berthv1.BuildHost) bool {
		n := len(bh.Status.Leftovers)
		bh.Status.Leftovers = slices.DeleteFunc(bh.Status.Leftovers, func(l berthv1.Leftover) bool { return l.BuildUser == user })
		return len(bh.Status.Leftovers) != n
	})
	if err != nil {
		logf.FromContext(ctx).Error(err, "clearing what a removed build user left", "host", host, "user", user)
	}
}

// edit changes the status of the host's record with edit (which reports whether it changed
// anything), on a fresh read, retried on conflict: the host checks and the VM fleet write it
// too. A static host's record is made on first sight; a host with neither record nor config is
// skipped.
func (h *staticHosts) edit(ctx context.Context, host string, edit func(*berthv1.BuildHost) bool) (*berthv1.BuildHost, error) {
	var bh *berthv1.BuildHost
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var err error
		if bh, err = h.recordOf(ctx, h.apiReader, host); err != nil {
			return err
		}
		if bh == nil {
			return fmt.Errorf("host %s has no record and is not configured", host)
		}
		if !edit(bh) {
			return nil
		}
		return h.writeStatus(ctx, bh)
	})
	return bh, err
}

// bounded cuts what a host reported to maxWhat bytes, on a rune boundary.
func bounded(what string) string {
	if len(what) <= maxWhat {
		return what
	}
	cut := maxWhat - len("...")
	for cut > 0 && !utf8.RuneStart(what[cut]) {
		cut--
	}
	return what[:cut] + "..."
}
