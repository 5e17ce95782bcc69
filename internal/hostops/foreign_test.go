package hostops

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// windowsScript returns the script a Windows command runs and the standard input left to it:
// the command line must be berth's bootstrap, and the script the first line of its input.
func windowsScript(t *testing.T, c sshfake.Command) (script string, rest []byte) {
	t.Helper()
	if got := decodePowerShell(t, c.Line); got != windowsBootstrap {
		t.Fatalf("the command line runs %q, not berth's bootstrap", got)
	}
	first, rest, ok := bytes.Cut(c.Stdin, []byte("\n"))
	if !ok {
		t.Fatalf("no script line on stdin: %.120q", c.Stdin)
	}
	line := "powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -EncodedCommand " + string(first)
	return decodePowerShell(t, line), rest
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
	if len(cmds) != 1 {
		t.Fatalf("want one command, got %d", len(cmds))
	}
	// cmd.exe, the default shell of OpenSSH for Windows, refuses lines over 8191 characters.
	if n := len(cmds[0].Line); n > 8191 {
		t.Errorf("the command line is %d characters; cmd.exe takes at most 8191", n)
	}
	script, rest := windowsScript(t, cmds[0])
	if string(rest) != string(k.authorized) {
		t.Fatalf("stdin after the script is %q, want the public key", rest)
	}
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
	script, _ := windowsScript(t, host.Commands()[0])
	for _, want := range []string{"$u = '" + user + "'", "Stop-Process", "Remove-LocalUser -Name $u", "Win32_UserProfile",
		"Get-LocalUser -Name $u -ErrorAction SilentlyContinue", "rmdir /s /q",
		"$dirs += $userProfile.LocalPath", "Remove-CimInstance", `ProfileList\$sid`} {
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
	// The UID comes from berth's range: its first ID and how many build users it holds.
	if !strings.HasPrefix(create.Line, "sudo -n sh -c ") || !strings.HasSuffix(create.Line, " berth "+user+" /usr/bin/xcodebuild 'team/mac x' 1879048192 1024") {
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

// indexes returns where each of wants first occurs in script, failing the test for any absent.
func indexes(t *testing.T, script string, wants ...string) []int {
	t.Helper()
	at := make([]int, len(wants))
	for i, want := range wants {
		if at[i] = strings.Index(script, want); at[i] < 0 {
			t.Errorf("the script lacks %q", want)
		}
	}
	return at
}

// inOrder fails the test unless the positions at ascend: the steps run in that order.
func inOrder(t *testing.T, what string, at []int) {
	t.Helper()
	for i := 1; i < len(at); i++ {
		if at[i-1] < 0 || at[i] < 0 || at[i-1] > at[i] {
			t.Errorf("%s: the steps are not in order (positions %v)", what, at)
			return
		}
	}
}

// TestWindowsCleanEndsRespawningProcessesOrBlamesThem: a build leaves a process that starts
// another as soon as it is stopped. The clean disables the account first, so nothing logs on
// as the user again, searches for the SID's processes until a search finds none (a bounded
// number of times), and looks once more before the account is deleted. When the host answers
// that processes still run, the clean fails on the user's leftover, which costs only its slot,
// and the account is not deleted (a process under a deleted SID would be no one's to find).
func TestWindowsCleanEndsRespawningProcessesOrBlamesThem(t *testing.T) {
	user := UserNameFor("windows/amd64", "5a0d7f3b-8e2c-4b6d-9f1a-7c9e3d6b2f45", 1)
	host, target := fakeHost(t, "Administrator", func(sshfake.Command) sshfake.Reply {
		return sshfake.Reply{Stderr: "leftover: 3 process(es) of its account still run, e.g. pid 5120 (respawn.exe)\r\n", Exit: exitLeftover}
	})
	err := CleanOn(context.Background(), target, "windows/amd64", user)
	var left *LeftoverError
	if !errors.As(err, &left) {
		t.Fatalf("processes left after the loop gave %v; want a *LeftoverError, which judges the user and not the host", err)
	}
	if left.User != user || !strings.Contains(left.What, "3 process(es) of its account still run, e.g. pid 5120") {
		t.Errorf("the verdict %+v does not say which processes remain", left)
	}
	script, _ := windowsScript(t, host.Commands()[0])
	at := indexes(t, script,
		"Disable-LocalUser -Name $u",
		"for ($round = 0; $round -lt 100; $round++)",
		"if ($found.Count -eq 0) { break }",
		"Stop-Process -Id $p.ProcessId -Force",
		"$running = @(Get-BuildProcesses)",
		"exit 18",
		"Remove-LocalUser -Name $u")
	inOrder(t, "disable, end processes until none, look again, fail or delete", at)
	// Processes are matched by SID, which outlives the account's name; once the account is gone
	// the SID comes only from a record an administrator wrote, naming a local account.
	indexes(t, script, "-MethodName GetOwnerSid", "$o.Sid -eq $sid", "-contains $recordOwner", "'^sid S-1-5-21-[0-9]+-[0-9]+-[0-9]+-[0-9]+$'")
}

// TestWindowsCleanTakesBackWhatTheUserLockedUp: the build user had full control of its build
// directory and profile, permissions included, and took Administrators and SYSTEM off a
// subfolder, so rmdir /s fails. The clean takes ownership of every real directory of the tree
// and resets its ACL, never entering a junction (which could lead to the system's own files)
// and never touching a file's ACL (a hard link would carry it elsewhere), then removes the tree
// again. What still does not go is the user's leftover, named, not a failure of the host.
func TestWindowsCleanTakesBackWhatTheUserLockedUp(t *testing.T) {
	user := UserNameFor("windows/amd64", "6b1e8a4c-9f3d-4c7e-8a2b-8d0f4e7c3a99", 1)
	host, target := fakeHost(t, "Administrator", func(sshfake.Command) sshfake.Reply {
		return sshfake.Reply{Stderr: `leftover: C:\berth\` + user + " remains, though its ownership and ACLs were taken back\r\n", Exit: exitLeftover}
	})
	err := CleanOn(context.Background(), target, "windows/amd64", user)
	var left *LeftoverError
	if !errors.As(err, &left) || !strings.Contains(left.What, `C:\berth\`+user+" remains") {
		t.Fatalf("a directory that would not go gave %v; want a *LeftoverError naming it", err)
	}
	script, _ := windowsScript(t, host.Commands()[0])
	at := indexes(t, script,
		"& cmd.exe /d /c rmdir /s /q $dir",
		"-band [IO.FileAttributes]::ReparsePoint) { return }",
		"& takeown.exe /f $d /a",
		"& icacls.exe $d /reset /q",
		"Get-ChildItem -LiteralPath $d -Force -Directory",
		"Where-Object { -not ($_.Attributes -band [IO.FileAttributes]::ReparsePoint) }")
	inOrder(t, "try, then take back each real directory and try again", at)
	indexes(t, script, "foreach ($dir in $dirs) {\n  Remove-Tree $dir", "$dirs += $userProfile.LocalPath")
	for _, banned := range []string{"/r ", "/t ", " /r\n", " /t\n", "Remove-Item"} {
		if strings.Contains(script, banned) {
			t.Errorf("the clean uses %q: a recursive takeown or icacls, or Remove-Item, may follow a junction the user planted", banned)
		}
	}
}

// TestWindowsCreateRefusesASquattedDirectory: C:\berth inherited C:\'s ACL, which lets any user
// create entries, so a build user could make the directory of a later build user. The creation
// makes C:\berth berth's own before anything else (SYSTEM and Administrators only, inheriting
// nothing; a C:\berth an administrator did not make is refused), refuses any directory of the
// new user that already exists, and keeps whom the user serves out of the account's
// description, which every user of the host may read.
func TestWindowsCreateRefusesASquattedDirectory(t *testing.T) {
	user := UserNameFor("windows/amd64", "7c2f9b5d-0a4e-4d8f-9b3c-9e1a5f8d4b11", 1)
	answer := sshfake.Reply{Stderr: `C:\berth\` + user + " exists, but berth has made no user " + user + ": planted, or left by a clean that failed\r\n", Exit: exitPlanted}
	host, target := fakeHost(t, "Administrator", func(sshfake.Command) sshfake.Reply { return answer })
	k := newBuilt(t, user)
	_, err := CreateUserOn(context.Background(), target, "windows/amd64", NewUser{Name: user, AuthorizedKey: k.authorized, Owner: "team-a/build-1 uid"})
	if err == nil || errors.Is(err, ErrUserExists) || !strings.Contains(err.Error(), "exists though berth never made that user") {
		t.Fatalf("a squatted directory gave %v; want a refusal that says the directory is not berth's", err)
	}
	answer = sshfake.Reply{Stderr: `C:\berth belongs to S-1-5-21-1-2-3-1004, not to an administrator` + "\r\n", Exit: exitRootNotBerths}
	if _, err := CreateUserOn(context.Background(), target, "windows/amd64", NewUser{Name: user, AuthorizedKey: k.authorized}); err == nil ||
		!strings.Contains(err.Error(), "the build directory root is not berth's own") {
		t.Fatalf("a C:\\berth made by a user gave %v; want a refusal", err)
	}

	script, _ := windowsScript(t, host.Commands()[0])
	at := indexes(t, script,
		"$root = Join-Path $env:SystemDrive 'berth'",
		"if ($trusted -notcontains $rootOwner) {",
		"& icacls.exe $root /inheritance:r /grant:r '*S-1-5-18:(OI)(CI)F' '*S-1-5-32-544:(OI)(CI)F'",
		"& icacls.exe $root /remove ('*' + $sid)",
		"foreach ($p in @($build, $record, $keys)) {",
		"exit 20",
		"New-LocalUser",
		"New-Item -ItemType Directory -Path $build")
	inOrder(t, "C:\\berth made berth's, squats refused, then the user made", at)
	if !strings.Contains(script, "-Description 'berth build user'\n") || strings.Contains(script, "'berth build user ' + $owner") {
		t.Error("the account's description, which every user of the host may read, names the owner")
	}
	indexes(t, script, "$record = Join-Path $root ($u + '.owner')", "Set-Content -LiteralPath $record -Value @(('owner ' + $owner)")
}

// TestMacOSUIDsComeFromBerthsRangeAndOnlyClean runs the UID-picking part of the macOS creation
// under /bin/sh, with dscl, ps and find standing in for the host's: a UID is never one past the
// highest in use, never one another account or claim holds, never one whose earlier user left a
// process or a file behind, and a freed UID comes back only after the whole range has.
func TestMacOSUIDsComeFromBerthsRangeAndOnlyClean(t *testing.T) {
	forPOSIXShells(t, macOSUIDsComeFromBerthsRangeAndOnlyClean)
}

// forPOSIXShells runs test under each POSIX shell here: dash as /bin/sh, and bash in POSIX
// mode, which is what macOS's /bin/sh is.
func forPOSIXShells(t *testing.T, test func(t *testing.T, shell ...string)) {
	shells := [][]string{{"/bin/sh"}}
	if bash, err := exec.LookPath("bash"); err == nil {
		shells = append(shells, []string{bash, "--posix"})
	}
	for _, shell := range shells {
		t.Run(filepath.Base(shell[0]), func(t *testing.T) { test(t, shell...) })
	}
}

func macOSUIDsComeFromBerthsRangeAndOnlyClean(t *testing.T, shell ...string) {
	dir := t.TempDir()
	const first = 1879048192 // config.DefaultUIDRange.First
	slice := func(i int) int { return first + i*65536 }
	stub := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, "bin", name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Slice 0 belongs to an account, slice 2's UID owns a file in /Users/Shared, slice 3's
	// runs a process.
	stub("dscl", fmt.Sprintf("echo 'root 0'; echo 'admin 501'; echo 'u-other 1879048192'; echo 'nobody -2'\n"))
	stub("find", fmt.Sprintf(`for a; do [ "$prev" = -uid ] && [ "$a" = %d ] && echo /Users/Shared/planted; prev=$a; done; exit 0`+"\n", slice(2)))
	stub("ps", fmt.Sprintf("echo '0 0 0'; echo '%d %d %d'\n", slice(3), slice(3), slice(3)))
	ledger := filepath.Join(dir, "uids")
	if err := os.MkdirAll(filepath.Join(ledger, fmt.Sprint(slice(1))), 0o755); err != nil { // claimed
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ledger, fmt.Sprint(slice(1)), "ids"), []byte(fmt.Sprintf("%d %d\n", slice(1), slice(1))), 0o644); err != nil {
		t.Fatal(err)
	}
	claim := func(user string) (uid, stderr string) {
		t.Helper()
		cmd := exec.Command(shell[0], append(shell[1:], "-c", "set -eu\nuser=$1 first=$2 slices=$3 ledger=$4 shared=$5\n"+darwinClaimUID+`printf '%s\n' "$uid"`,
			"sh", user, fmt.Sprint(first), "6", ledger, "/tmp /Users/Shared")...)
		cmd.Env = append(os.Environ(), "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH"))
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("claiming a UID for %s: %v: %s", user, err, errOut.String())
		}
		return strings.TrimSpace(out.String()), errOut.String()
	}
	uid, stderr := claim("u-a")
	if uid != fmt.Sprint(slice(4)) {
		t.Fatalf("got UID %s, want %d: slices 0-3 are an account's, claimed, owning a file and running a process", uid, slice(4))
	}
	for _, skipped := range []string{fmt.Sprintf("UID %d is unused, but something of it is left on the host (/Users/Shared/planted)", slice(2)),
		fmt.Sprintf("UID %d is unused, but something of it is left on the host (a process)", slice(3))} {
		if !strings.Contains(stderr, skipped) {
			t.Errorf("stderr %q does not say %q", stderr, skipped)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ledger, uid, "user")); err != nil || string(b) != "u-a\n" {
		t.Errorf("the claim of %s names %q (%v), want u-a", uid, b, err)
	}
	for _, skipped := range []int{2, 3} {
		if _, err := os.Stat(filepath.Join(ledger, fmt.Sprint(slice(skipped)))); !os.IsNotExist(err) {
			t.Errorf("the skipped UID %d stays claimed (%v): nothing would ever free it", slice(skipped), err)
		}
	}
	// u-a's clean verified it and freed its UID: the next user gets the one after, not u-a's.
	if err := os.RemoveAll(filepath.Join(ledger, uid)); err != nil {
		t.Fatal(err)
	}
	if uid, _ := claim("u-b"); uid != fmt.Sprint(slice(5)) {
		t.Fatalf("after freeing %d the next user got %s, want %d: a freed UID waits for the range to come round", slice(4), uid, slice(5))
	}
	if uid, _ := claim("u-c"); uid != fmt.Sprint(slice(4)) {
		t.Fatalf("with the range gone round the next user got %s, want %d", uid, slice(4))
	}
}

// TestMacOSCleanRemovesSharedPathsAndChecksEveryRemoval runs the macOS removal under /bin/sh
// with dscl, ps, launchctl and crontab standing in for the host's, against shared directories
// in a temporary directory: what the user's UID left in the shared temporary places goes, and a
// path rm could not remove fails the clean with its name, before the account is deleted.
func TestMacOSCleanRemovesSharedPathsAndChecksEveryRemoval(t *testing.T) {
	forPOSIXShells(t, macOSCleanRemovesSharedPathsAndChecksEveryRemoval)
}

func macOSCleanRemovesSharedPathsAndChecksEveryRemoval(t *testing.T, shell ...string) {
	// The build user's UID owns what the test plants: the test's own UID, or one the test
	// hands the files to where it runs as root (the script refuses to clean UID 0).
	buildUID := os.Getuid()
	if buildUID == 0 {
		buildUID = 4242
	}
	user := UserName("8d3a0c6e-1b5f-4e9a-8c4d-0f2b6e9c5d78", 1)
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	shared := []string{filepath.Join(dir, "private-tmp"), filepath.Join(dir, "Users-Shared"), filepath.Join(dir, "var-folders")}
	spools := filepath.Join(dir, "spool")
	for _, d := range append([]string{bin, spools}, shared...) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(dir, "log")
	for name, body := range map[string]string{
		// The user exists, with the test's own UID, so what the test makes is the user's.
		"dscl": fmt.Sprintf(`echo "dscl $*" >> %s
case "$*" in
". -read /Users/%s") exit 0 ;;
". -read /Users/%s UniqueID") echo "UniqueID: %d" ;;
". -read /Groups/"*) exit 56 ;;
esac
exit 0
`, log, user, user, buildUID),
		"ps":        "exit 0\n", // no process of the user runs (and none of the test's is ever signalled)
		"launchctl": "exit 0\n",
		"crontab":   "exit 0\n",
		// rm cannot remove what lies under a directory named stuck (on a host: a file the
		// user made immutable, a mount in its way); everything else it removes.
		"rm": fmt.Sprintf(`opts= status=0 paths=false
for a; do
	if ! $paths; then case "$a" in --) paths=true; continue ;; -*) opts="$opts $a"; continue ;; esac; paths=true; fi
	case "$a" in
	*stuck*) if [ -e %s ]; then echo "rm: $a: Operation not permitted" >&2; status=1; continue; fi ;;
	esac
	/bin/rm $opts -- "$a" || status=1
done
exit $status
`, filepath.Join(dir, "stuck-on")),
	} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script := strings.NewReplacer(darwinShared, strings.Join(shared, " "), darwinSpools, spools).Replace(darwinRemoveScript)
	if script == darwinRemoveScript {
		t.Fatal("the removal does not take its shared places from darwinShared")
	}
	remove := func() (int, string) {
		cmd := exec.Command(shell[0], append(shell[1:], "-c", script, "sh", user)...)
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), string(out)
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	plant := func(path string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("planted for the next tenant"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tmpFile := filepath.Join(shared[0], "hook.sh")
	sharedFile := filepath.Join(shared[1], "Library", "x.plist")
	cache := filepath.Join(shared[2], "zz", "abc", "T", "cache.db")
	locked := filepath.Join(shared[1], "stuck", "inner")
	for _, p := range []string{tmpFile, sharedFile, cache, filepath.Join(locked, "f")} {
		plant(p)
	}
	if buildUID != os.Getuid() {
		for _, p := range []string{tmpFile, filepath.Dir(tmpFile), sharedFile, filepath.Dir(sharedFile), cache, filepath.Dir(cache),
			filepath.Dir(filepath.Dir(cache)), filepath.Dir(filepath.Dir(filepath.Dir(cache))), filepath.Join(locked, "f"), locked, filepath.Dir(locked)} {
			if strings.HasPrefix(p, shared[0]+"/") || strings.HasPrefix(p, shared[1]+"/") || strings.HasPrefix(p, shared[2]+"/") {
				if err := os.Lchown(p, buildUID, buildUID); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// Another user's file in the same place stays.
	others := filepath.Join(shared[0], "another-users")
	if buildUID != os.Getuid() {
		plant(others)
	}
	stuckOn := filepath.Join(dir, "stuck-on")
	if err := os.WriteFile(stuckOn, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	code, out := remove()
	if code != exitLeftover || !strings.Contains(out, "leftover: 1 paths of its UID remain, e.g. "+filepath.Join(shared[1], "stuck")) {
		t.Fatalf("a path that would not go gave exit %d: %s; want exit 18 naming it", code, out)
	}
	for _, p := range []string{tmpFile, sharedFile, filepath.Join(shared[2], "zz")} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after the clean (%v)", p, err)
		}
	}
	if _, err := os.Stat(others); buildUID != os.Getuid() && err != nil {
		t.Errorf("another user's file went with the build user's: %v", err)
	}
	if b, _ := os.ReadFile(log); strings.Contains(string(b), "-delete") {
		t.Error("the account was deleted though the clean found what its UID left")
	}

	// Once the path goes, the clean succeeds and only then deletes the account.
	if err := os.Remove(stuckOn); err != nil {
		t.Fatal(err)
	}
	if code, out := remove(); code != 0 {
		t.Fatalf("the second clean exited %d: %s", code, out)
	}
	if b, _ := os.ReadFile(log); !strings.Contains(string(b), "dscl . -delete /Users/"+user) {
		t.Errorf("the account was not deleted after a clean that left nothing: %s", b)
	}
}

// TestMacOSCleanFailureIsTheUsersLeftover: the host's answer that something of the user's UID
// is left is the user's leftover, as on Linux, not a failure of the host.
func TestMacOSCleanFailureIsTheUsersLeftover(t *testing.T) {
	user := UserName("9e4b1d7f-2c6a-4f0b-9d5e-1a3c7f0d6e89", 1)
	_, target := fakeHost(t, "admin", func(sshfake.Command) sshfake.Reply {
		return sshfake.Reply{Stderr: "leftover: 1 paths of its UID remain, e.g. /Users/Shared/x\n", Exit: exitLeftover}
	})
	err := CleanOn(context.Background(), target, "darwin/arm64", user)
	var left *LeftoverError
	if !errors.As(err, &left) || left.What != "1 paths of its UID remain, e.g. /Users/Shared/x" {
		t.Fatalf("got %v, want a *LeftoverError naming /Users/Shared/x", err)
	}
}
