package hostops

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/dev/testground/sshfake"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/remote"
)

// A command line is public on a host: any user may read every process's arguments (ps, /proc).
// So no key, not even the public half, and no password may ever be on one. These tests record
// every command line berth sends while it creates and removes a build user: on Linux through a
// recording relay to a real sshd test host (the commands really run there), on Windows and
// macOS to the recording server.

// keyMaterial is what a command line carrying the user's key would contain: the key's base64
// blob, its type word, or a private key's armour.
func keyMaterial(authorized []byte) []string {
	fields := strings.Fields(string(authorized))
	return []string{fields[0] + " ", fields[1], "PRIVATE KEY"}
}

// checkLines fails for any recorded command line (as sent, and as PowerShell decodes it)
// carrying key material or a -password argument.
func checkLines(t *testing.T, cmds []sshfake.Command, authorized []byte, decode func(string) string) {
	t.Helper()
	if len(cmds) == 0 {
		t.Fatal("no command was recorded")
	}
	for _, c := range cmds {
		texts := []string{c.Line}
		if decode != nil {
			texts = append(texts, decode(c.Line))
		}
		for _, text := range texts {
			for _, k := range keyMaterial(authorized) {
				if strings.Contains(text, k) {
					t.Errorf("a command line carries key material %.30q: %.200q", k, text)
				}
			}
		}
		if strings.Contains(strings.ToLower(c.Line), "-password") {
			t.Errorf("a command line passes -password: %.300q", c.Line)
		}
	}
}

func TestNoKeyOrPasswordOnALinuxCommandLine(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[1]
	real := adminTarget(f, h)
	relay, target := fakeHost(t, "root", func(c sshfake.Command) sshfake.Reply {
		client, err := remote.Dial(context.Background(), real)
		if err != nil {
			return sshfake.Reply{Stderr: err.Error(), Exit: 255}
		}
		defer client.Close()
		out, err := client.Run(context.Background(), "relayed", c.Line, c.Stdin)
		var remoteErr *remote.RemoteError
		switch {
		case errors.As(err, &remoteErr):
			return sshfake.Reply{Stdout: string(out), Stderr: remoteErr.Stderr, Exit: uint32(remoteErr.ExitCode)}
		case err != nil:
			return sshfake.Reply{Stderr: err.Error(), Exit: 255}
		}
		return sshfake.Reply{Stdout: string(out)}
	})
	p := newBuilt(t, UserName("5a0d7f3b-8e2c-4b6d-9f1a-7c9e3d6b2f45", 1))
	if _, err := CreateUser(context.Background(), target, NewUser{Name: p.User, AuthorizedKey: p.authorized, Owner: "builds/cmdline x"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Clean(context.Background(), real, p.User) })
	// The key came on stdin, and it works: the user logs in with it.
	if out, err := asBuildUser(t, h, &p.built, "id -un"); err != nil || strings.TrimSpace(out) != p.User {
		t.Fatalf("the build user cannot log in with its key: %q %v", out, err)
	}
	if err := Clean(context.Background(), target, p.User); err != nil {
		t.Fatal(err)
	}
	cmds := relay.Commands()
	if !bytes.Equal(cmds[0].Stdin, p.authorized) {
		t.Errorf("the creation's stdin is %q, want the public key", cmds[0].Stdin)
	}
	checkLines(t, cmds, p.authorized, nil)
}

func TestNoKeyOrPasswordOnAWindowsCommandLine(t *testing.T) {
	user := UserNameFor("windows/amd64", "6b1e8a4c-9f3d-4c7e-8a2b-8d0f4e7c3a56", 1)
	host, target := fakeHost(t, "Administrator", func(sshfake.Command) sshfake.Reply {
		return sshfake.Reply{Stdout: `C:\berth\` + user + "\r\n"}
	})
	k := newBuilt(t, user)
	if _, err := CreateUserOn(context.Background(), target, "windows/amd64", NewUser{Name: user, AuthorizedKey: k.authorized}); err != nil {
		t.Fatal(err)
	}
	if err := CleanOn(context.Background(), target, "windows/amd64", user); err != nil {
		t.Fatal(err)
	}
	cmds := host.Commands()
	script, rest := windowsScript(t, cmds[0])
	if !bytes.Equal(rest, k.authorized) {
		t.Errorf("the creation's stdin after its script is %q, want the public key", rest)
	}
	checkLines(t, cmds, k.authorized, func(line string) string { return decodePowerShell(t, line) })
	// The password Windows requires is made on the host, inside PowerShell, and goes to
	// New-LocalUser in that process: it is on no command line and berth never knows it.
	if !strings.Contains(script, "RandomNumberGenerator") || !strings.Contains(script, "[Console]::In.ReadToEnd()") {
		t.Error("the creation does not make its password on the host, or does not read the key from stdin")
	}
}

func TestNoKeyOrPasswordOnAMacOSCommandLine(t *testing.T) {
	user := UserName("7c2f9b5d-0a4e-4d8f-9b3c-9e1a5f8d4b67", 1)
	host, target := fakeHost(t, "admin", func(c sshfake.Command) sshfake.Reply {
		if strings.Contains(c.Line, "NFSHomeDirectory") {
			return sshfake.Reply{Stdout: "/Users/" + user + "\n"}
		}
		return sshfake.Reply{}
	})
	k := newBuilt(t, user)
	if _, err := CreateUserOn(context.Background(), target, "darwin/arm64", NewUser{Name: user, AuthorizedKey: k.authorized}); err != nil {
		t.Fatal(err)
	}
	if err := CleanOn(context.Background(), target, "darwin/arm64", user); err != nil {
		t.Fatal(err)
	}
	cmds := host.Commands()
	if !bytes.Equal(cmds[0].Stdin, k.authorized) {
		t.Errorf("the creation's stdin is %q, want the public key", cmds[0].Stdin)
	}
	checkLines(t, cmds, k.authorized, nil)
	create := cmds[0].Line
	// No usable password: the crypt field matches none, and no authentication authority
	// (a shadow hash) is made that one could be checked against.
	for _, want := range []string{"Password", "UniqueID", `mkdir "$ledger/$b"`} {
		if !strings.Contains(create, want) {
			t.Errorf("the creation lacks %q", want)
		}
	}
	if !strings.Contains(darwinCreateScript, `dscl . -create "/Users/$user" Password '*'`) {
		t.Error("the creation does not set the crypt field that matches no password")
	}
	for _, banned := range []string{"sysadminctl -addUser", "AuthenticationAuthority", "passwd", "openssl rand"} {
		if strings.Contains(create, banned) {
			t.Errorf("the creation runs %q", banned)
		}
	}
	// Only where Remote Login is limited to chosen users does the user join the group sshd
	// checks; never unconditionally.
	if !strings.Contains(create, "if dscl . -read /Groups/com.apple.access_ssh") {
		t.Error("the creation joins com.apple.access_ssh whether or not Remote Login is limited")
	}
}
