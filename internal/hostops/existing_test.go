package hostops

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/dev/testground/sshfake"
)

// TestExistingUsersAsksInOneSessionAndBelievesOnlyWhatItAsked: the names travel on standard
// input in one session (none on the command line, where every user of the host reads them);
// the host's answer counts only for names asked, and a name that is not a build user's is
// never sent.
func TestExistingUsersAsksInOneSessionAndBelievesOnlyWhatItAsked(t *testing.T) {
	upstream, legacy := UpstreamUserName("builds", "left-behind"), LegacyUserName("builds", "left-behind")
	answer := upstream + "\n"
	host, target := fakeHost(t, "root", func(sshfake.Command) sshfake.Reply { return sshfake.Reply{Stdout: answer} })
	got, err := ExistingUsers(context.Background(), target, []string{upstream, legacy})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{upstream}) {
		t.Errorf("existing users %v, want [%s]", got, upstream)
	}
	cmds := host.Commands()
	if len(cmds) != 1 {
		t.Fatalf("%d commands for two names, want 1", len(cmds))
	}
	if want := upstream + "\n" + legacy + "\n"; !bytes.Equal(cmds[0].Stdin, []byte(want)) {
		t.Errorf("stdin %q, want the names one a line", cmds[0].Stdin)
	}
	if strings.Contains(cmds[0].Line, upstream) || strings.Contains(cmds[0].Line, legacy) {
		t.Errorf("a name is on the command line: %q", cmds[0].Line)
	}

	answer = "root\n"
	if got, err := ExistingUsers(context.Background(), target, []string{upstream}); err == nil {
		t.Errorf("a host answering a user it was not asked about is believed: %v", got)
	}
	if _, err := ExistingUsers(context.Background(), target, []string{"root"}); err == nil {
		t.Error("asked a host about root, which is no build user")
	}
	if n := len(host.Commands()); n != 2 {
		t.Errorf("%d commands in all, want 2: a name that is no build user's must not be sent", n)
	}
}
