package hostops

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/berth-ci/berth/internal/dev/testground/sshfake"
	"github.com/berth-ci/berth/internal/remote"
)

// No Windows or macOS host runs here, so these tests hold berth to what it sends such a host
// over SSH, against a server that records every command and answers as the host would. They
// prove the commands and their quoting, not what PowerShell or sysadminctl then do.

// fakeHost starts a recording server answering with reply, and a target for it.
func fakeHost(t *testing.T, user string, reply func(sshfake.Command) sshfake.Reply) (*sshfake.Server, remote.Target) {
	t.Helper()
	fleet, err := sshfake.StartFleet(1, reply)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	s := fleet.Servers[0]
	return s, remote.Target{Address: s.Address, User: user, Signer: fleet.AdminKey, HostKeys: remote.Pinned{Key: s.HostKey}}
}

// decodePowerShell returns the script of a powershell -EncodedCommand line.
func decodePowerShell(t *testing.T, line string) string {
	t.Helper()
	const prefix = "powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -EncodedCommand "
	if !strings.HasPrefix(line, prefix) || strings.ContainsAny(line[len(prefix):], " ;&|'\"") {
		t.Fatalf("not one encoded PowerShell command: %.120q", line)
	}
	raw, err := base64.StdEncoding.DecodeString(line[len(prefix):])
	if err != nil || len(raw)%2 != 0 {
		t.Fatalf("the encoded command is not base64 of UTF-16: %v", err)
	}
	units := make([]uint16, len(raw)/2)
	for i := range units {
		units[i] = uint16(raw[2*i]) | uint16(raw[2*i+1])<<8
	}
	return string(utf16.Decode(units))
}

func TestWindowsUserNamesFitWindows(t *testing.T) {
	uid := "0b5e2a8c-3f7d-4c1e-9a6b-2d4f8e1c7a90"
	a, b := UserNameFor("windows/amd64", uid, 1), UserNameFor("windows/amd64", uid, 12)
	if len(b) > 20 || !windowsUserRE.MatchString(a) || !windowsUserRE.MatchString(b) || a == b {
		t.Fatalf("Windows names %q %q", a, b)
	}
	if !strings.HasPrefix(a, "u-0b5e2a8c3f7d-") {
		t.Fatalf("%q does not carry the TaskRun's UID", a)
	}
	if UserNameFor("darwin/arm64", uid, 1) != UserName(uid, 1) || UserNameFor("linux/s390x", uid, 1) != UserName(uid, 1) {
		t.Fatal("macOS and Linux keep the long name")
	}
}

func TestWindowsUserIsCreatedWithItsKeyWhereOnlyAdminsWrite(t *testing.T) {
	user := UserNameFor("windows/amd64", "0b5e2a8c-3f7d-4c1e-9a6b-2d4f8e1c7a90", 1)
	host, target := fakeHost(t, "Administrator", func(sshfake.Command) sshfake.Reply {
		return sshfake.Reply{Stdout: `C:\berth\` + user + "\r\n"}
	})
	k := newBuilt(t, user)
	dir, err := CreateUserOn(context.Background(), target, "windows/amd64", NewUser{Name: user, AuthorizedKey: k.authorized, Owner: "team/it's x"})
	if err != nil {
		t.Fatal(err)
	}
	if dir != `C:\berth\`+user {
		t.Fatalf("build dir %q", dir)
	}
	cmds := host.Commands()
	if len(cmds) != 1 || string(cmds[0].Stdin) != string(k.authorized) {
		t.Fatalf("want one command with the public key on stdin, got %d", len(cmds))
	}
	// cmd.exe, the default shell of OpenSSH for Windows, refuses lines over 8191 characters.
	if n := len(cmds[0].Line); n > 8191 {
		t.Errorf("the command line is %d characters; cmd.exe takes at most 8191", n)
	}
	script := decodePowerShell(t, cmds[0].Line)
	for _, want := range []string{
		"$u = '" + user + "'",
		"$key = [Console]::In.ReadToEnd().Trim()",
		"$owner = 'team/it''s x'", // a quote is doubled: it cannot end the literal
		"Get-LocalUser -Name $u", "exit 17",
		`$env:ProgramData\ssh\berth`, "AuthorizedKeysFile __PROGRAMDATA__/ssh/berth/%u/authorized_keys",
		"New-LocalUser -Name $u -Password $password",
		// without berth's Match block, the key goes to a profile made before the first logon
		"if (-not $shared)", "[BerthProfile]::CreateProfile($account.SID.Value, $u, $path, 260)", "$keys = Join-Path $path.ToString() '.ssh'",
		"Add-LocalGroupMember -Group 'OpenSSH Users' -Member $u",
		"icacls.exe $keys /inheritance:r /grant:r '*S-1-5-18:(OI)(CI)F' '*S-1-5-32-544:(OI)(CI)F' ($u + ':(OI)(CI)R')",
		"icacls.exe $build /inheritance:r",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("the script lacks %q", want)
		}
	}
	if strings.Contains(script, "PRIVATE KEY") || strings.Contains(script, "Administrators -Member") {
		t.Error("the script carries a private key, or adds the user to Administrators")
	}
}

func TestWindowsUserThatExistsIsNeverReused(t *testing.T) {
	user := UserNameFor("windows/amd64", "1c6f3b9d-4a8e-4d2f-8b7c-3e5a9f2d8b01", 1)
	_, target := fakeHost(t, "Administrator", func(sshfake.Command) sshfake.Reply {
		return sshfake.Reply{Stderr: "build user exists already", Exit: 17}
	})
	k := newBuilt(t, user)
	_, err := CreateUserOn(context.Background(), target, "windows/amd64", NewUser{Name: user, AuthorizedKey: k.authorized})
	if !errors.Is(err, ErrUserExists) {
		t.Fatalf("got %v, want ErrUserExists", err)
	}
}

func TestHostileInputsNeverReachAForeignHost(t *testing.T) {
	host, target := fakeHost(t, "Administrator", func(sshfake.Command) sshfake.Reply { return sshfake.Reply{} })
	win := UserNameFor("windows/amd64", "2d7a4c0e-5b9f-4e3a-9c8d-4f6b0a3e9c12", 1)
	mac := UserName("2d7a4c0e-5b9f-4e3a-9c8d-4f6b0a3e9c12", 1)
	k := newBuilt(t, win)
	for _, tc := range []struct {
		platform string
		u        NewUser
	}{
		{"windows/amd64", NewUser{Name: "u-x'; Remove-Item C:\\ -Recurse; '", AuthorizedKey: k.authorized}},
		{"windows/amd64", NewUser{Name: mac, AuthorizedKey: k.authorized}}, // too long for Windows
		{"windows/amd64", NewUser{Name: win, AuthorizedKey: []byte("ssh-ed25519 AAAA'; shutdown /s")}},
		{"windows/amd64", NewUser{Name: win, AuthorizedKey: k.authorized, Owner: "x\r\nexit 0"}},
		{"windows/amd64", NewUser{Name: win, AuthorizedKey: k.authorized, SudoCommands: []string{"/usr/bin/podman"}}},
		{"darwin/arm64", NewUser{Name: "admin", AuthorizedKey: k.authorized}},
		{"darwin/arm64", NewUser{Name: mac, AuthorizedKey: k.authorized, SudoCommands: []string{"ALL"}}},
	} {
		if _, err := CreateUserOn(context.Background(), target, tc.platform, tc.u); err == nil {
			t.Errorf("%s %+.60q was accepted", tc.platform, tc.u.Name)
		}
	}
	for _, bad := range []string{"Administrator", "u-x & del", "root"} {
		if err := CleanOn(context.Background(), target, "windows/amd64", bad); err == nil {
			t.Errorf("removing %q was accepted", bad)
		}
	}
	if n := len(host.Commands()); n != 0 {
		t.Fatalf("%d commands reached the host; hostile input must be refused before anything is sent", n)
	}
}

func TestWindowsUserRemoval(t *testing.T) {
	user := UserNameFor("windows/amd64", "3e8b5d1f-6c0a-4f4b-8d9e-5a7c1b4f0d23", 2)
	host, target := fakeHost(t, "Administrator", func(sshfake.Command) sshfake.Reply { return sshfake.Reply{} })
	if err := CleanOn(context.Background(), target, "windows/amd64", user); err != nil {
		t.Fatal(err)
	}
	script := decodePowerShell(t, host.Commands()[0].Line)
	for _, want := range []string{"$u = '" + user + "'", "Stop-Process", "Remove-LocalUser -Name $u", "Win32_UserProfile",
		"Get-LocalUser -Name $u -ErrorAction SilentlyContinue", "rmdir /s /q",
		"rmdir /s /q $userProfile.LocalPath", "Remove-CimInstance", `ProfileList\$sid`} {
		if !strings.Contains(script, want) {
			t.Errorf("the removal lacks %q", want)
		}
	}
	if strings.Contains(script, "Remove-Item") {
		t.Error("the removal uses Remove-Item, which may follow a junction the build user planted")
	}
}

func TestWindowsHostCheck(t *testing.T) {
	for _, tc := range []struct {
		reply   string
		healthy bool
		reason  string
	}{
		{"free 53687091200\r\n", true, ""},
		{"free 1073741824\r\n", false, "1.0 GiB free on the system drive"},
		{"nonsense", false, "answered the disk check"},
	} {
		_, target := fakeHost(t, "Administrator", func(sshfake.Command) sshfake.Reply { return sshfake.Reply{Stdout: tc.reply} })
		healthy, reason := CheckWindows(context.Background(), target, 10<<30)
		if healthy != tc.healthy || !strings.Contains(reason, tc.reason) {
			t.Errorf("%q: healthy=%v reason=%q", tc.reply, healthy, reason)
		}
	}
}

func TestMacOSUserIsCreatedAndRemovedWithItsOwnTools(t *testing.T) {
	user := UserName("4f9c6e2a-7d1b-4a5c-9e0f-6b8d2c5a1e34", 1)
	host, target := fakeHost(t, "admin", func(c sshfake.Command) sshfake.Reply {
		if strings.Contains(c.Line, "NFSHomeDirectory") {
			return sshfake.Reply{Stdout: "/Users/" + user + "\n"}
		}
		return sshfake.Reply{}
	})
	k := newBuilt(t, user)
	dir, err := CreateUserOn(context.Background(), target, "darwin/arm64", NewUser{Name: user, AuthorizedKey: k.authorized,
		Owner: "team/mac x", SudoCommands: []string{"/usr/bin/xcodebuild"}})
	if err != nil {
		t.Fatal(err)
	}
	if dir != "/Users/"+user+"/build" {
		t.Fatalf("build dir %q", dir)
	}
	if err := CleanOn(context.Background(), target, "darwin/arm64", user); err != nil {
		t.Fatal(err)
	}
	cmds := host.Commands()
	if len(cmds) != 2 {
		t.Fatalf("%d commands, want create and remove", len(cmds))
	}
	create, remove := cmds[0], cmds[1]
	// An admin that is not root goes through sudo; the values are arguments, never script text.
	if !strings.HasPrefix(create.Line, "sudo -n sh -c ") || !strings.HasSuffix(create.Line, " berth "+user+" /usr/bin/xcodebuild 'team/mac x'") {
		t.Errorf("create line %.200q", create.Line)
	}
	if string(create.Stdin) != string(k.authorized) {
		t.Errorf("stdin %q, want the public key", create.Stdin)
	}
	for _, want := range []string{"exit 17", "visudo -cqf", "chown -h", "mkdir -m 700"} {
		if !strings.Contains(create.Line, want) {
			t.Errorf("the create script lacks %q", want)
		}
	}
	if !strings.Contains(remove.Line, `dscl . -delete "/Users/$user"`) || !strings.HasSuffix(remove.Line, " berth "+user) {
		t.Errorf("remove line %.200q", remove.Line)
	}
}

// TestOSOfProductionPlatformNames: production names its Windows and EC2 Mac platforms with a
// size (windows-4xlarge/amd64, macos-mac2metal/arm64); their hosts get Windows's and macOS's
// tools, never Linux's.
func TestOSOfProductionPlatformNames(t *testing.T) {
	for platform, want := range map[string]string{
		"linux/arm64": "linux", "linux-mlarge/amd64": "linux", "linux-g6xlarge/amd64": "linux",
		"windows/amd64": "windows", "windows-4xlarge/amd64": "windows",
		"darwin/arm64": "darwin", "macos/arm64": "darwin", "macos-mac2metal/arm64": "darwin",
	} {
		if got := OS(platform); got != want {
			t.Errorf("OS(%s) = %s, want %s", platform, got, want)
		}
	}
	uid := "6b1e8a4c-9f3d-4c7e-8a2b-8d0f4e7c3a56"
	if got := UserNameFor("windows-4xlarge/amd64", uid, 1); got != UserNameFor("windows/amd64", uid, 1) || len(got) > 20 {
		t.Errorf("the build user of windows-4xlarge/amd64 is %q: not Windows's short name", got)
	}
}
