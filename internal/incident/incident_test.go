package incident

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/remote"
)

// secretish is what no tenant-facing text may carry, whichever failure it words: the details
// the failures below are built from.
var secretish = []string{
	"arn:aws", "123456789012", "Encoded authorization", "berth-admin", "10.0.7.12", "SHA256:",
	"crn:v1", "workspace", "/var/lib", "sudo:", "iam.cloud.ibm.com",
}

func TestProvisioningTellsTheKindOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"unreachable", fmt.Errorf("job: %w", &remote.UnreachableError{Host: "10.0.7.12:22", Err: io.EOF}), "could not be reached"},
		{"host key changed", &remote.HostKeyChangedError{Host: "10.0.7.12", Expected: "SHA256:abc", Presented: "SHA256:def", Pinned: true}, "host key"},
		{"script failed", &remote.RemoteError{Host: "10.0.7.12", Command: "create build user", ExitCode: 1, Stderr: "sudo: /var/lib/berth/uids: no space left"}, "failed on the host"},
		{"admin login refused", fmt.Errorf("job: %w", &remote.LoginError{Host: "10.0.7.12", User: "berth-admin", Err: errors.New("ssh: unable to authenticate, attempted methods [none publickey], no supported methods remain")}), "refused berth's admin login"},
		{"anything else", errors.New("reading the admin key of host h (secret berth-admin-key): sudo: denied"), "could not create the build user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Provisioning(tc.err)
			if !strings.Contains(got, tc.want) {
				t.Errorf("%q does not say %q", got, tc.want)
			}
			for _, s := range secretish {
				if strings.Contains(got, s) {
					t.Errorf("%q carries %q from the failure %q", got, s, tc.err)
				}
			}
		})
	}
}

func TestCloudTellsKindAndWhatToDo(t *testing.T) {
	for _, tc := range []struct {
		kind     cloud.Kind
		what     string
		next     string
		noRetrys bool // a retry cannot help: the text must not send the tenant to retry
	}{
		{cloud.Auth, "credentials or permissions", "platform team", true},
		{cloud.BadConfig, "settings", "platform team", true},
		{cloud.Quota, "quota", "retry later", false},
		{cloud.Capacity, "capacity", "retry later", false},
		{cloud.Throttled, "throttled", "retry later", false},
		{cloud.Transient, "failed or could not be reached", "retry later", false},
		{cloud.NotFound, "lost track", "retry later", false},
	} {
		what, next := Cloud(tc.kind)
		if !strings.Contains(what, tc.what) || !strings.Contains(what, tc.kind.String()) {
			t.Errorf("%s: what %q, want it to say %q and the kind's name", tc.kind, what, tc.what)
		}
		if !strings.Contains(next, tc.next) {
			t.Errorf("%s: next %q, want it to say %q", tc.kind, next, tc.next)
		}
		if tc.noRetrys && strings.Contains(next, "retry later") {
			t.Errorf("%s: next %q sends the tenant to retry a refusal for good", tc.kind, next)
		}
	}
}

func TestRefs(t *testing.T) {
	shape := regexp.MustCompile(`^ref-[0-9a-f]{10}$`)
	seen := map[Ref]bool{}
	for range 1000 {
		r := NewRef()
		if !shape.MatchString(string(r)) {
			t.Fatalf("ref %q is not ref- and 10 hex digits", r)
		}
		if seen[r] {
			t.Fatalf("ref %s made twice in 1000", r)
		}
		seen[r] = true
	}
	r := NewRef()
	if w := r.Where("berth-system"); !strings.Contains(w, string(r)) || !strings.Contains(w, "berth-system") {
		t.Errorf("Where %q names neither the ref nor the namespace", w)
	}
}

func TestNoteFitsTheEventsAPI(t *testing.T) {
	for _, tc := range []struct {
		name string
		text string
	}{
		{"short", "host h: unreachable"},
		{"exactly the limit", strings.Repeat("a", NoteLimit)},
		{"an EC2 refusal", "giving up (ref-0123456789): EC2 answered UnauthorizedOperation: " + strings.Repeat("Zm9vYmFy", 300)},
		{"runes across the cut", strings.Repeat("é", NoteLimit)},
	} {
		got := Note(tc.text)
		if len(got) > NoteLimit || !utf8.ValidString(got) {
			t.Errorf("%s: a note of %d bytes (valid UTF-8: %v)", tc.name, len(got), utf8.ValidString(got))
		}
		if len(tc.text) <= NoteLimit && got != tc.text {
			t.Errorf("%s: a note that fits was changed", tc.name)
		}
		if len(tc.text) > NoteLimit && (!strings.HasSuffix(got, clipped) || !strings.HasPrefix(tc.text, strings.TrimSuffix(got, clipped))) {
			t.Errorf("%s: %q is not the text's start and the mark of a cut", tc.name, got)
		}
	}
}
