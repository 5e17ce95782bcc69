package hostops

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf16"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/remote"
)

// Per-task users on Windows (OpenSSH for Windows, an Administrators account as admin user) and
// macOS (root or passwordless sudo). The rules are Linux's: the user is created, never
// repaired; the record names it first; nothing the admin writes goes through a path the build
// user could have planted; the host only receives the public key.

// OS is the operating system a platform's hosts run (see config.Platform.OS): "windows",
// "darwin" or "linux".
func OS(platform string) string { return config.Platform(platform).OS() }

// windowsUserRE: Windows limits local account names to 20 characters, so Windows build users
// carry 12 hex digits of the TaskRun's UID: UIDs are random, and a collision would need two
// live tasks on one host sharing 48 random bits; the create-only rule turns even that into a
// failed attempt, never a shared user.
var windowsUserRE = regexp.MustCompile(`^u-[0-9a-f]{12}-[0-9]{1,4}$`)

// UserNameFor is the build user of one attempt at a TaskRun on a host of platform: UserName,
// shortened to what Windows allows on windows/*.
func UserNameFor(platform, uid string, attempt int) string {
	name := UserName(uid, attempt)
	if OS(platform) == "windows" {
		return name[:14] + name[strings.LastIndex(name, "-"):]
	}
	return name
}

// CreateUserOn creates the user on a host of platform, with the OS's own tools.
func CreateUserOn(ctx context.Context, t remote.Target, platform string, u NewUser) (string, error) {
	switch OS(platform) {
	case "windows":
		return createWindowsUser(ctx, t, u)
	case "darwin":
		return createDarwinUser(ctx, t, u)
	}
	return CreateUser(ctx, t, u)
}

// CleanOn removes a build user from a host of platform; a user already gone is success.
func CleanOn(ctx context.Context, t remote.Target, platform, user string) error {
	switch OS(platform) {
	case "windows":
		return removeWindowsUser(ctx, t, user)
	case "darwin":
		return removeDarwinUser(ctx, t, user)
	}
	return Clean(ctx, t, user)
}

// CheckOn tells whether a host of platform answers and has minFree bytes free for builds.
func CheckOn(ctx context.Context, t remote.Target, platform string, minFree uint64) (healthy bool, reason, warning string) {
	if OS(platform) == "windows" {
		healthy, reason = CheckWindows(ctx, t, minFree)
		return healthy, reason, ""
	}
	rep := Update(ctx, UpdateRequest{Target: t, MinFreeBytes: minFree})
	if OS(platform) == "darwin" {
		// berth sets no limits on macOS users at all, slice or not: the warning is Linux's.
		rep.Warning = ""
	}
	return rep.Healthy, rep.Reason, rep.Warning
}

// --- Windows ---

// powershell is the command line that runs script in Windows PowerShell without any shell
// parsing its text: -EncodedCommand takes it as base64 of UTF-16LE, whatever the admin
// account's default shell (cmd.exe or PowerShell) is.
func powershell(script string) string {
	return "powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -EncodedCommand " + utf16Base64(script)
}

// windowsBootstrap is the whole command line of a build user's creation and removal: those
// scripts, encoded, would pass the 8191 characters cmd.exe (OpenSSH for Windows' default
// shell) takes on a line, so each comes on standard input, as base64 of UTF-16LE on the first
// line (ASCII, so no console code page can change a character of it), and runs as a script
// block, whose exit status is PowerShell's. What follows that line is left to the script.
const windowsBootstrap = "$s = [Console]::In.ReadLine()\n& ([ScriptBlock]::Create([Text.Encoding]::Unicode.GetString([Convert]::FromBase64String($s))))\n"

// runWindowsScript runs script through windowsBootstrap, with stdin after it.
func runWindowsScript(ctx context.Context, t remote.Target, what, script string, stdin []byte) ([]byte, error) {
	input := append([]byte(utf16Base64(script)+"\n"), stdin...)
	return run(ctx, t, what, powershell(windowsBootstrap), input)
}

// utf16Base64 is s as UTF-16LE, in base64: what PowerShell's -EncodedCommand takes.
func utf16Base64(s string) string {
	units := utf16.Encode([]rune(s))
	raw := make([]byte, 2*len(units))
	for i, u := range units {
		raw[2*i], raw[2*i+1] = byte(u), byte(u>>8)
	}
	return base64.StdEncoding.EncodeToString(raw)
}

// psQuote is a PowerShell single-quoted literal: nothing inside is expanded, and a quote is
// doubled. Values are also checked before they get here.
func psQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// windowsPrelude stops at the first error; every script starts with it. Accounts in icacls
// grants are named by SID (S-1-5-18 SYSTEM, S-1-5-32-544 Administrators): their names are
// translated on non-English Windows.
const windowsPrelude = "$ErrorActionPreference = 'Stop'\n$ProgressPreference = 'SilentlyContinue'\n"

// Where a Windows build user's key lives. Preferably under ProgramData\ssh, which only SYSTEM
// and Administrators may write, so sshd reads a file the build user cannot replace or
// redirect; that takes a Match block in the host's sshd_config (windowsSSHDLine). A host
// whose sshd_config has none (the Windows user-data production renders) reads every
// non-admin user's key from .ssh\authorized_keys in the user's profile, which a user that
// never logged on does not have: there berth creates the profile first, as the first logon
// would, and writes the key into a fresh .ssh only SYSTEM and Administrators may write.
const windowsKeyDir = `$env:ProgramData\ssh\berth`

// windowsSSHDLine is the line a host admin may add to sshd_config, in a "Match User u-*"
// block, to have build users' keys read from windowsKeyDir.
const windowsSSHDLine = "AuthorizedKeysFile __PROGRAMDATA__/ssh/berth/%u/authorized_keys"

// windowsCreateProfile declares userenv's CreateProfile, which makes a user's profile (its
// home, C:\Users\<user>) before the user's first logon.
const windowsCreateProfile = `Add-Type -TypeDefinition 'using System.Text; using System.Runtime.InteropServices; public static class BerthProfile { [DllImport("userenv.dll", CharSet = CharSet.Unicode)] public static extern int CreateProfile(string sid, string name, StringBuilder path, uint size); }'`

// Exit statuses of the Windows create script besides exitUserExists: exitPlanted, a directory
// of the user exists though berth has made no such user; exitRootNotBerths, %SystemDrive%\berth
// is not a plain directory an administrator made.
const (
	exitPlanted       = 20
	exitRootNotBerths = 21
)

// windowsRoot makes sure $root (%SystemDrive%\berth) is berth's own: a plain directory an
// administrator owns, whose ACL grants SYSTEM and Administrators full control and no one else
// anything, inheriting nothing. Inherited from C:\ (as earlier releases left it), it would let
// any user of the host create entries in it, and so plant the directory of a later build user.
// A directory there that an administrator did not make is refused: what else its maker left
// inside cannot be known. Build users reach their own directory below without reading $root,
// through the traverse-checking bypass Windows grants to Everyone by default.
const windowsRoot = `$root = Join-Path $env:SystemDrive 'berth'
$trusted = @('S-1-5-18', 'S-1-5-32-544', [Security.Principal.WindowsIdentity]::GetCurrent().User.Value)
if (-not (Test-Path -LiteralPath $root)) { New-Item -ItemType Directory -Path $root | Out-Null }
$item = Get-Item -LiteralPath $root -Force
if (-not $item.PSIsContainer -or ($item.Attributes -band [IO.FileAttributes]::ReparsePoint)) { [Console]::Error.WriteLine("$root is not a plain directory: berth did not make it; an operator must remove it"); exit 21 }
$acl = Get-Acl -LiteralPath $root
$rootOwner = $acl.GetOwner([Security.Principal.SecurityIdentifier]).Value
if ($trusted -notcontains $rootOwner) { [Console]::Error.WriteLine("$root belongs to $rootOwner, not to an administrator: berth did not make it; an operator must remove it"); exit 21 }
$others = @($acl.GetAccessRules($true, $true, [Security.Principal.SecurityIdentifier]) | ForEach-Object { $_.IdentityReference.Value } | Where-Object { $_ -ne 'S-1-5-18' -and $_ -ne 'S-1-5-32-544' } | Select-Object -Unique)
if ($others.Count -gt 0 -or -not $acl.AreAccessRulesProtected) {
  & icacls.exe $root /inheritance:r /grant:r '*S-1-5-18:(OI)(CI)F' '*S-1-5-32-544:(OI)(CI)F' | Out-Null
  if ($LASTEXITCODE -ne 0) { throw "icacls on $root failed" }
  foreach ($sid in $others) {
    & icacls.exe $root /remove ('*' + $sid) | Out-Null
    if ($LASTEXITCODE -ne 0) { throw "removing $sid from the ACL of $root failed" }
  }
}
`

func createWindowsUser(ctx context.Context, t remote.Target, u NewUser) (string, error) {
	if !windowsUserRE.MatchString(u.Name) {
		return "", fmt.Errorf("%q is not a berth build user name for Windows", truncate(u.Name))
	}
	if len(u.SudoCommands) > 0 {
		return "", fmt.Errorf("sudo-commands cannot be granted on Windows hosts; remove them from the platform's config")
	}
	authorized, err := u.checkInputs()
	if err != nil {
		return "", err
	}
	// The key comes on stdin: no key, not even a public one, is on a command line, where
	// anyone on the host may read it; it follows the script's own line. OpenSSH
	// Users exists where sshd_config allows only its members and administrators in. Whom the
	// user serves goes into $record, which inherits $root's administrators-only ACL, never
	// into the account's description, which every user of the host may list.
	script := windowsPrelude + fmt.Sprintf(`$u = %s
$key = [Console]::In.ReadToEnd().Trim()
if ($key -notmatch '^[A-Za-z0-9@.-]+ [A-Za-z0-9+/=]+( [ -~]*)?$') { [Console]::Error.WriteLine("no authorized_keys line on stdin"); exit 2 }
$owner = %s
if (Get-LocalUser -Name $u -ErrorAction SilentlyContinue) { [Console]::Error.WriteLine("build user $u exists already; berth never reuses a build user"); exit 17 }
%s$build = Join-Path $root $u
$record = Join-Path $root ($u + '.owner')
$keys = Join-Path "%s" $u
foreach ($p in @($build, $record, $keys)) {
  if (Test-Path -LiteralPath $p) { [Console]::Error.WriteLine("$p exists, but berth has made no user $u: planted, or left by a clean that failed; berth never uses what it did not make"); exit 20 }
}
$cfg = Join-Path $env:ProgramData 'ssh\sshd_config'
$shared = (Test-Path -LiteralPath $cfg) -and (Select-String -LiteralPath $cfg -SimpleMatch -Quiet -Pattern %s)
$bytes = New-Object byte[] 24
[Security.Cryptography.RandomNumberGenerator]::Create().GetBytes($bytes)
$password = ConvertTo-SecureString ([Convert]::ToBase64String($bytes) + 'aA1!') -AsPlainText -Force
$account = New-LocalUser -Name $u -Password $password -PasswordNeverExpires -UserMayNotChangePassword -AccountNeverExpires -Description 'berth build user'
Set-Content -LiteralPath $record -Value @(('owner ' + $owner), ('sid ' + $account.SID.Value)) -Encoding utf8
if (Get-LocalGroup -Name 'OpenSSH Users' -ErrorAction SilentlyContinue) { Add-LocalGroupMember -Group 'OpenSSH Users' -Member $u }
if (-not $shared) {
  %s
  $path = New-Object System.Text.StringBuilder 260
  $hr = [BerthProfile]::CreateProfile($account.SID.Value, $u, $path, 260)
  if ($hr -ne 0) { throw ('creating the profile of {0} failed: 0x{1:X8}' -f $u, $hr) }
  $keys = Join-Path $path.ToString() '.ssh'
}
New-Item -ItemType Directory -Path $keys | Out-Null
Set-Content -LiteralPath (Join-Path $keys 'authorized_keys') -Value $key -Encoding ascii
& icacls.exe $keys /inheritance:r /grant:r '*S-1-5-18:(OI)(CI)F' '*S-1-5-32-544:(OI)(CI)F' ($u + ':(OI)(CI)R') | Out-Null
if ($LASTEXITCODE -ne 0) { throw "icacls on $keys failed" }
New-Item -ItemType Directory -Path $build | Out-Null
& icacls.exe $build /inheritance:r /grant:r '*S-1-5-18:(OI)(CI)F' '*S-1-5-32-544:(OI)(CI)F' ($u + ':(OI)(CI)F') | Out-Null
if ($LASTEXITCODE -ne 0) { throw "icacls on $build failed" }
Write-Output $build
`, psQuote(u.Name), psQuote(u.Owner), windowsRoot, windowsKeyDir, psQuote(windowsSSHDLine), windowsCreateProfile)
	out, err := runWindowsScript(ctx, t, "creating build user "+u.Name, script, authorized)
	if err != nil {
		var remoteErr *remote.RemoteError
		if errors.As(err, &remoteErr) {
			switch remoteErr.ExitCode {
			case exitPlanted:
				return "", fmt.Errorf("on host %s, a directory of build user %s exists though berth never made that user (planted, or left by a failed clean); the user is not made: %w", t.Address, u.Name, err)
			case exitRootNotBerths:
				return "", fmt.Errorf("on host %s, the build directory root is not berth's own; an operator must remove it: %w", t.Address, err)
			}
		}
		return "", userExists(t, u.Name, err)
	}
	dir := strings.TrimSpace(string(out))
	if !strings.Contains(dir, `\berth\`+u.Name) {
		return "", fmt.Errorf("on host %s, creating build user %s printed no build directory: %q", t.Address, u.Name, truncate(dir))
	}
	return dir, nil
}

// windowsRemoveTree defines Remove-Tree, which removes a directory with rmdir /s: that removes
// a junction or link the user planted instead of following it (Remove-Item -Recurse of Windows
// PowerShell 5.1 may follow it). The user had full control of its directories, permissions
// included, so it may have taken Administrators and SYSTEM off some of them; then every real
// directory of the tree is taken back (takeown /a: an administrator may take ownership of
// anything) and its ACL reset to what it inherits, one directory at a time, and rmdir tries
// again. The walk never enters a reparse point and leaves files' ACLs alone (a hard link would
// carry the change to a file elsewhere): takeown /r and icacls /t are not used, as their
// documentation does not say whether they follow junctions.
const windowsRemoveTree = `function Remove-Tree([string]$dir) {
  if (-not (Test-Path -LiteralPath $dir)) { return }
  & cmd.exe /d /c rmdir /s /q $dir
  if (-not (Test-Path -LiteralPath $dir)) { return }
  if ((Get-Item -LiteralPath $dir -Force).Attributes -band [IO.FileAttributes]::ReparsePoint) { return }
  $pending = New-Object 'System.Collections.Generic.Stack[string]'
  $pending.Push($dir)
  while ($pending.Count -gt 0) {
    $d = $pending.Pop()
    & takeown.exe /f $d /a | Out-Null
    & icacls.exe $d /reset /q | Out-Null
    Get-ChildItem -LiteralPath $d -Force -Directory -ErrorAction SilentlyContinue |
      Where-Object { -not ($_.Attributes -band [IO.FileAttributes]::ReparsePoint) } |
      ForEach-Object { $pending.Push($_.FullName) }
  }
  & cmd.exe /d /c rmdir /s /q $dir
}
`

// removeWindowsUser removes a build user in Linux's order. Nothing new starts: the account is
// disabled, so it logs on nowhere (sshd, a scheduled task, a service run as the user). Every
// process of its SID ends, searched for again until none is found. Its directories go, taken
// back first where the user locked them. Only when nothing of it is left is the account
// deleted; otherwise the clean fails with exitLeftover and "leftover:" lines, the account stays
// (disabled) for the next clean to retry, and the failure judges the user, not the host. The
// SID comes from the account or, once the account is gone, from the admin-only record, so a
// process that outlived an earlier clean is still found.
func removeWindowsUser(ctx context.Context, t remote.Target, user string) error {
	if !windowsUserRE.MatchString(user) {
		return fmt.Errorf("%q is not a berth build user name for Windows; refusing to remove it", truncate(user))
	}
	script := windowsPrelude + fmt.Sprintf(`$u = %s
$root = Join-Path $env:SystemDrive 'berth'
$record = Join-Path $root ($u + '.owner')
$keys = Join-Path "%s" $u
$account = Get-LocalUser -Name $u -ErrorAction SilentlyContinue
$sid = $null
if ($account) { $sid = $account.SID.Value }
elseif (Test-Path -LiteralPath $record) {
  # Only a record an administrator wrote, naming a local account: one planted before $root
  # was berth's own must not turn the clean against another SID's processes.
  $recordOwner = (Get-Acl -LiteralPath $record).GetOwner([Security.Principal.SecurityIdentifier]).Value
  if (@('S-1-5-18', 'S-1-5-32-544', [Security.Principal.WindowsIdentity]::GetCurrent().User.Value) -contains $recordOwner) {
    $sid = @(Get-Content -LiteralPath $record | Where-Object { $_ -match '^sid S-1-5-21-[0-9]+-[0-9]+-[0-9]+-[0-9]+$' } | ForEach-Object { $_.Substring(4) })[0]
  }
}
if ($account) { Disable-LocalUser -Name $u }
%sfunction Get-BuildProcesses {
  if (-not $sid) { return }
  Get-CimInstance Win32_Process | Where-Object {
    $o = Invoke-CimMethod -InputObject $_ -MethodName GetOwnerSid -ErrorAction SilentlyContinue
    $o -and $o.Sid -eq $sid
  }
}
# Windows has no SIGSTOP to keep a process from starting another, so the search repeats until
# it finds nothing, at most 100 times (the Linux clean's bound); what still runs after that is
# the user's leftover, reported as such.
for ($round = 0; $round -lt 100; $round++) {
  $found = @(Get-BuildProcesses)
  if ($found.Count -eq 0) { break }
  foreach ($p in $found) { Stop-Process -Id $p.ProcessId -Force -ErrorAction SilentlyContinue }
  Start-Sleep -Milliseconds 100
}
$leftovers = New-Object 'System.Collections.Generic.List[string]'
$running = @(Get-BuildProcesses)
if ($running.Count -gt 0) { $leftovers.Add(('leftover: {0} process(es) of its account still run, e.g. pid {1} ({2})' -f $running.Count, $running[0].ProcessId, $running[0].Name)) }
$userProfile = $null
if ($sid) { $userProfile = Get-CimInstance Win32_UserProfile | Where-Object { $_.SID -eq $sid } | Select-Object -First 1 }
$dirs = @((Join-Path $root $u), $keys)
if ($userProfile) { $dirs += $userProfile.LocalPath }
foreach ($dir in $dirs) {
  Remove-Tree $dir
  if (Test-Path -LiteralPath $dir) { $leftovers.Add("leftover: $dir remains, though its ownership and ACLs were taken back") }
}
if ($leftovers.Count -gt 0) {
  foreach ($line in $leftovers) { [Console]::Error.WriteLine($line) }
  exit 18
}
if ($account) { Remove-LocalUser -Name $u }
if ($userProfile) {
  $userProfile | Remove-CimInstance -ErrorAction SilentlyContinue
  [Microsoft.Win32.Registry]::LocalMachine.DeleteSubKeyTree("SOFTWARE\Microsoft\Windows NT\CurrentVersion\ProfileList\$sid", $false)
}
if (Test-Path -LiteralPath $record) { [IO.File]::Delete($record) }
`, psQuote(user), windowsKeyDir, windowsRemoveTree)
	_, err := runWindowsScript(ctx, t, "removing build user "+user, script, nil)
	return leftover(t, user, err)
}

// CheckWindows reports whether a Windows host answers and has minFree bytes free on its
// system drive, where build directories live.
func CheckWindows(ctx context.Context, t remote.Target, minFree uint64) (bool, string) {
	out, err := run(ctx, t, "checking the host", powershell(windowsPrelude+
		"$d = Get-PSDrive -Name $env:SystemDrive.TrimEnd(':')\nWrite-Output (\"free {0}\" -f $d.Free)\n"), nil)
	if err != nil {
		return false, err.Error()
	}
	var free uint64
	if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "free %d", &free); err != nil {
		return false, fmt.Sprintf("host %s answered the disk check with %q", t.Address, truncate(string(out)))
	}
	if free < minFree {
		return false, fmt.Sprintf("%.1f GiB free on the system drive of host %s, %.1f GiB required", float64(free)/(1<<30), t.Address, float64(minFree)/(1<<30))
	}
	return true, ""
}

// --- macOS ---

// darwinShared are the places outside its home where a macOS user may write: the temporary
// directories (/tmp is a link to /private/tmp there, and links are never searched), the shared
// folder every user may write, and the per-user temporary and cache folders of
// /private/var/folders.
const darwinShared = "/tmp /private/tmp /private/var/tmp /Users/Shared /private/var/folders"

// darwinSpools are where macOS keeps a user's crontab, at jobs and mail, each a file of the
// user's UID directly inside.
const darwinSpools = "/usr/lib/cron/tabs /var/at/tabs /var/at/jobs /var/mail"

// darwinCreateScript creates build user $1 (which must not exist) with the key on stdin, as
// provisionScript does on Linux, with macOS's tools. It prints the home.
//
//	$1 user  $2 sudo commands ("" for none)  $3 owner  $4 first ID of the range  $5 slices
const darwinCreateScript = `set -eu
user=$1 sudo_cmds=$2 owner=$3 first=$4 slices=$5
case "$user" in u-*) ;; *) echo "refusing to provision $user: not a berth build user" >&2; exit 2 ;; esac
home=/Users/$user
if dscl . -read "/Users/$user" >/dev/null 2>&1 || [ -e "$home" ] || [ -L "$home" ]; then
	echo "build user $user or its home exists already; berth never reuses a build user" >&2
	exit 17
fi
` + sudoRuleChecked + `ledger=/var/db/berth/uids shared="` + darwinShared + `"
` + darwinClaimUID + `
# No password at all, so none is on any command line: the crypt field "*" matches no password,
# and with no authentication authority there is no shadow hash to check one against, so
# every password login is refused; sshd's key login checks only authorized_keys.
dscl . -create "/Users/$user"
dscl . -create "/Users/$user" UniqueID "$uid"
dscl . -create "/Users/$user" PrimaryGroupID 20
dscl . -create "/Users/$user" UserShell /bin/zsh
dscl . -create "/Users/$user" NFSHomeDirectory "$home"
dscl . -create "/Users/$user" RealName "berth build user"
dscl . -create "/Users/$user" Password '*'
# Remote Login limited to chosen users is the group com.apple.access_ssh, which sshd checks
# (absent when every user may log in): only then must the user join it to log in with its key.
if dscl . -read /Groups/com.apple.access_ssh >/dev/null 2>&1; then
	dseditgroup -o edit -a "$user" -t user com.apple.access_ssh
fi
mkdir -m 700 "$home"
mkdir -m 700 "$home/.ssh" "$home/build"
cat > "$home/.ssh/authorized_keys"
chmod 600 "$home/.ssh/authorized_keys"
mkdir -p /var/db/berth/users
printf '%s\n' "$owner" > "/var/db/berth/users/$user"
` + sudoRuleInstalled + `
chown -h "$user:staff" "$home/.ssh/authorized_keys" "$home/.ssh" "$home/build" "$home"
printf '%s\n' "$home"
`

// darwinClaimUID sets $uid to a UID of berth's range that it has claimed for $user in $ledger,
// or exits 19. The range is Linux's ($first, $slices slices of idsPerUser IDs); a macOS user
// has no subordinate IDs and takes its slice's first ID. As on Linux, a claim is mkdir of
// $ledger/<uid>, atomic against a concurrent creation, kept until a clean has verified that
// nothing of the UID is left, and the search starts after the slice claimed last, so a freed UID
// waits for the whole range to come round. A UID some account has is skipped, and so is one
// that still runs a process or owns a path in $shared or at the top of /Users: a UID is handed
// on only once verified clean, whatever happened to its last user.
const darwinClaimUID = ledgerStart + `free=$(
	{
		dscl . -list /Users UniqueID | awk '$2 ~ /^[0-9]+$/ {print $2, $2}'
		cat "$ledger"/*/ids 2>/dev/null
	} | ` + freeSlices + `
)
# leftOf UID prints what of UID is still on the host, if anything.
leftOf() {
	ps -axo uid=,ruid=,svuid= | awk -v u="$1" '$1 == u || $2 == u || $3 == u { print "a process"; exit }'
	for d in $shared; do
		[ -d "$d" ] && [ ! -L "$d" ] || continue
		find "$d" -xdev -mindepth 1 -uid "$1" -print 2>/dev/null | head -n 1
	done
	find /Users -xdev -mindepth 1 -maxdepth 1 -uid "$1" -print 2>/dev/null | head -n 1
}
uid=
for b in $free; do
	mkdir "$ledger/$b" 2>/dev/null || continue
	left=$(leftOf "$b" | head -n 1)
	if [ -n "$left" ]; then
		rmdir "$ledger/$b"
		echo "UID $b is unused, but something of it is left on the host ($left): skipped" >&2
		continue
	fi
	uid=$b
	break
done
if [ -z "$uid" ]; then
	echo "no free build UID: every one of the $slices UIDs of the range from $first is claimed, used or not clean" >&2
	exit 19
fi
printf '%s\n' "$user" > "$ledger/$uid/user"
printf '%s %s\n' "$uid" "$uid" > "$ledger/$uid/ids"
` + ledgerNext

// darwinRemoveScript removes build user $1 in cleanScript's order, with macOS's tools; a user
// already gone is success. Nothing new starts (no sudo rule, no shell, no ssh access, the home
// with its key renamed out of sshd's way); every process of its UID is stopped, then killed,
// until none is left, with its launchd domains first so no agent starts again; what its UID
// owns in the shared places and spools goes, and its home. Then the clean looks again: what is
// left makes it exit 18 with "leftover:" lines, and the user and its UID's claim stay, so a
// later clean can try again and no one gets the UID meanwhile. Only a clean UID is freed.
const darwinRemoveScript = `set -u
user=$1
case "$user" in u-*) ;; *) echo "refusing to remove $user: not a berth build user" >&2; exit 2 ;; esac
umask 077
rm -f "/etc/sudoers.d/berth-$user" "/etc/sudoers.d/.berth-$user.new" || { echo "could not remove the sudo rule of $user" >&2; exit 1; }
ledger=/var/db/berth/uids shared="` + darwinShared + `"
spooldirs="` + darwinSpools + `"
` + findClaim + `uid= exists=false
if dscl . -read "/Users/$user" >/dev/null 2>&1; then
	exists=true
	uid=$(dscl . -read "/Users/$user" UniqueID | awk '$1 == "UniqueID:" {print $2}')
	dscl . -create "/Users/$user" UserShell /usr/bin/false || { echo "could not take the shell of $user" >&2; exit 1; }
	if dscl . -read /Groups/com.apple.access_ssh >/dev/null 2>&1; then
		dseditgroup -o edit -d "$user" -t user com.apple.access_ssh >/dev/null 2>&1 || true
	fi
fi
if [ -z "$uid" ] && [ -n "$claim" ]; then
	set -- $(cat "$claim/ids" 2>/dev/null)
	uid=${1:-}
fi
case "$uid" in *[!0-9]*) echo "refusing to clean $user: unreadable UID $uid" >&2; exit 2 ;; 0) echo "refusing to clean $user: its UID is root's" >&2; exit 2 ;; esac
home=/Users/$user gone=/Users/.berth-removed-$user
homes="$home $gone"
if [ -d "$home" ] && [ ! -L "$home" ]; then
	rm -rf -- "$gone"
	mv -- "$home" "$gone" 2>/dev/null || rm -rf -- "$home"
fi
# summary and the checks of what is left are the same with or without a UID.
` + leftoverSummary + `homesLeft() { for h in $homes; do if [ -e "$h" ] || [ -L "$h" ]; then echo "$h"; fi; done | summary "home directories remain"; }
if [ -z "$uid" ]; then
	# Neither user nor claim: only what a creation cut short may have left by name.
	for h in $homes; do rm -rf -- "$h"; done
	left=$(homesLeft)
	[ -z "$left" ] || { printf '%s\n' "$left" >&2; exit 18; }
	rm -f "/var/db/berth/users/$user" || { echo "could not remove the record of $user" >&2; exit 1; }
	exit 0
fi
# procs prints "pid state name" for every process any of whose real, effective or saved UIDs is
# the user's.
procs() {
	ps -axo pid=,uid=,ruid=,svuid=,stat=,comm= | awk -v u="$uid" '$2 == u || $3 == u || $4 == u { print $1, substr($5, 1, 1), $6 }'
}
# launchd would start the user's agents again.
launchctl bootout "gui/$uid" >/dev/null 2>&1 || true
launchctl bootout "user/$uid" >/dev/null 2>&1 || true
` + stopAndKill + `# owned rm|print DIR [MAXDEPTH]: removes or prints the topmost paths under DIR its UID owns, on
# DIR's own filesystem, never following a link.
owned() {
	act=$1 d=$2 depth=${3:-}
	[ -d "$d" ] && [ ! -L "$d" ] || return 0
	if [ "$act" = rm ]; then
		find "$d" -xdev -mindepth 1 ${depth:+-maxdepth $depth} -uid "$uid" -prune -exec rm -rf -- {} +
	else
		find "$d" -xdev -mindepth 1 ${depth:+-maxdepth $depth} -uid "$uid" -prune -print
	fi
}
$exists && { crontab -r -u "$user" >/dev/null 2>&1 || true; }
for d in $shared; do owned rm "$d"; done
for d in $spooldirs; do owned rm "$d" 1; done
for h in $homes; do rm -rf -- "$h"; done
# Every removal above is judged here, by what is still there.
leftovers() {
	procs | awk '{ n++; if (n == 1) ex = "pid " $1 " (" $3 ", state " $2 ")" } END { if (n) printf "leftover: %d process(es) of its UID still run, e.g. %s\n", n, ex }'
	for d in $shared; do owned print "$d"; done | summary "paths of its UID remain"
	for d in $spooldirs; do owned print "$d" 1; done | summary "spool files of its UID remain"
	homesLeft
}
left=$(leftovers)
if [ -n "$left" ]; then
	printf '%s\n' "$left" >&2
	exit 18
fi
if $exists; then
	dscl . -delete "/Users/$user" >&2 || { echo "leftover: user $user: dscl . -delete failed" >&2; exit 18; }
fi
rm -f "/var/db/berth/users/$user" || { echo "could not remove the record of $user" >&2; exit 1; }
# The UID is free again only now that nothing of it is left.
if [ -n "$claim" ]; then rm -rf -- "$claim" || { echo "could not free $claim, the claim of UID $uid" >&2; exit 1; }; fi
`

func createDarwinUser(ctx context.Context, t remote.Target, u NewUser) (string, error) {
	authorized, err := u.check()
	if err != nil {
		return "", err
	}
	uids, err := u.uidRange()
	if err != nil {
		return "", err
	}
	return createAsRoot(ctx, t, u.Name, authorized, darwinCreateScript, u.Name, strings.Join(u.SudoCommands, ", "), u.Owner,
		fmt.Sprint(uids.First), fmt.Sprint(uids.Users()))
}

func removeDarwinUser(ctx context.Context, t remote.Target, user string) error {
	if !userNameRE.MatchString(user) {
		return fmt.Errorf("%q is not a berth build user name; refusing to remove it", truncate(user))
	}
	line, err := asRoot(t, darwinRemoveScript, user)
	if err != nil {
		return err
	}
	_, err = run(ctx, t, "removing build user "+user, line, nil)
	return leftover(t, user, err)
}
