package hosts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/remote"
)

// Errors as they reach payDebts from the SSH provisioner: wrapped once more on the way, as a
// layer between may do.
func TestACleanFailureIsJudgedByWhatItSays(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want cleanFault
		what string
	}{
		{"what the user left", fmt.Errorf("clean: %w", &hostops.LeftoverError{Host: "h1", User: "u-1", What: "process 4242 (sleep) of UID 231072"}), faultUser, "process 4242 (sleep) of UID 231072"},
		{"unreachable", fmt.Errorf("clean: %w", &remote.UnreachableError{Host: "h1", Err: io.EOF}), faultHost, ""},
		{"admin login refused", fmt.Errorf("clean: %w", &remote.LoginError{Host: "h1", User: "root", Err: errors.New("ssh: unable to authenticate")}), faultHost, ""},
		{"host key changed", &remote.HostKeyChangedError{Host: "h1", Expected: "SHA256:a", Presented: "SHA256:b"}, faultHost, ""},
		{"the script failed otherwise", &remote.RemoteError{Host: "h1", Command: "removing user u-1", ExitCode: 1, Stderr: "userdel: user u-1 is currently used by process 4242"}, faultUnclear, ""},
		{"cut short", fmt.Errorf("on host h1, removing user u-1: %w", context.DeadlineExceeded), faultUnclear, ""},
		{"a clean TaskRun that failed (text only)", errors.New(`clean TaskRun berth/clean-1: "step-clean" exited with code 1`), faultUnclear, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, left := judgeClean(tc.err)
			if got != tc.want {
				t.Fatalf("judged %s, want %s", got, tc.want)
			}
			if (left != nil) != (tc.what != "") || left != nil && left.What != tc.what {
				t.Fatalf("leftover %+v, want what %q", left, tc.what)
			}
		})
	}
}

// One tenant's users, however many and however often their cleans fail, never show the host
// broken; what shows it broken is a login that fails, or cleans of two namespaces' users
// failing with nothing to blame on either.
func TestOnlyFailuresThatNoTenantCausesQuarantineTheHost(t *testing.T) {
	const threshold = 3
	type fail struct {
		user, namespace string
		fault           cleanFault
		failures        int
	}
	for _, tc := range []struct {
		name  string
		fails []fail
		want  bool // after the last one
	}{
		{"one user's leftovers, forever", []fail{{"u-a", "t1", faultUser, 1}, {"u-a", "t1", faultUser, 50}}, false},
		{"leftovers of users of many namespaces", []fail{{"u-a", "t1", faultUser, 9}, {"u-b", "t2", faultUser, 9}, {"u-c", "t3", faultUser, 9}}, false},
		{"one namespace's users failing with no one to blame", []fail{{"u-a", "t1", faultUnclear, 9}, {"u-b", "t1", faultUnclear, 9}, {"u-c", "t1", faultUnclear, 9}}, false},
		{"two namespaces failing with no one to blame", []fail{{"u-a", "t1", faultUnclear, 3}, {"u-b", "t2", faultUnclear, 3}}, true},
		{"two namespaces, one not yet failed enough", []fail{{"u-a", "t1", faultUnclear, 3}, {"u-b", "t2", faultUnclear, 2}}, false},
		{"one namespace unclear, the other's own leftovers", []fail{{"u-a", "t1", faultUnclear, 5}, {"u-b", "t2", faultUser, 5}}, false},
		{"login refused, once", []fail{{"u-a", "t1", faultHost, 1}}, false},
		{"login refused, threshold times", []fail{{"u-a", "t1", faultHost, 3}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var v cleanVerdicts
			var broken bool
			for _, f := range tc.fails {
				broken = v.failed("h1", f.user, cleanFailure{namespace: f.namespace, fault: f.fault, failures: f.failures}, threshold)
			}
			if broken != tc.want {
				t.Fatalf("host judged broken=%v, want %v", broken, tc.want)
			}
			var off cleanVerdicts
			for _, f := range tc.fails {
				if off.failed("h1", f.user, cleanFailure{namespace: f.namespace, fault: f.fault, failures: f.failures}, 0) {
					t.Fatal("a threshold of 0 quarantined a host")
				}
			}
		})
	}
}

// A user whose clean passes is forgotten: its namespace no longer counts toward a quarantine,
// and it is no longer told as dirty. Another host's failures never count for this one.
func TestAPassingCleanClearsItsUser(t *testing.T) {
	var v cleanVerdicts
	v.failed("h1", "u-a", cleanFailure{namespace: "t1", fault: faultUnclear, failures: 3}, 3)
	v.failed("h2", "u-b", cleanFailure{namespace: "t2", fault: faultUnclear, failures: 3}, 3)
	if v.failed("h1", "u-c", cleanFailure{namespace: "t3", fault: faultUser, failures: 1}, 3) {
		t.Fatal("failures on another host, or a user's own leftovers, counted toward a quarantine")
	}
	if got := v.dirty("h1"); strings.Join(got, ",") != "u-c" {
		t.Fatalf("dirty users %v, want u-c", got)
	}
	if v.settled("h1", "u-a") {
		t.Fatal("u-a had left nothing, yet was told dirty")
	}
	if !v.settled("h1", "u-c") || len(v.dirty("h1")) != 0 {
		t.Fatal("u-c's passing clean did not clear it")
	}
	if v.failed("h1", "u-d", cleanFailure{namespace: "t2", fault: faultUnclear, failures: 3}, 3) {
		t.Fatal("a cleared namespace still counted toward a quarantine")
	}
	if !v.failed("h1", "u-e", cleanFailure{namespace: "t4", fault: faultUnclear, failures: 3}, 3) {
		t.Fatal("two namespaces failing with no one to blame did not show the host broken")
	}
}

func TestWhatAHostSaysIsBounded(t *testing.T) {
	long := strings.Repeat("é", maxWhat) // two bytes each: a cut may fall inside one
	got := bounded(long)
	if len(got) > maxWhat || !strings.HasSuffix(got, "...") || !strings.HasPrefix(got, "é") {
		t.Fatalf("bounded to %d bytes: %.20q...", len(got), got)
	}
	if !utf8.ValidString(got) || !strings.HasPrefix(long, strings.TrimSuffix(got, "...")) {
		t.Fatal("the cut split a character")
	}
	if bounded("short") != "short" {
		t.Fatal("a short text was changed")
	}
}
