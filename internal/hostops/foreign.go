package hostops

import (
	"context"
	"encoding/base64"
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
func CheckOn(ctx context.Context, t remote.Target, platform string, minFree uint64) (healthy bool, reason string) {
	if OS(platform) == "windows" {
		return CheckWindows(ctx, t, minFree)
	}
	rep := Update(ctx, UpdateRequest{Target: t, MinFreeBytes: minFree})
	return rep.Healthy, rep.Reason
}

// --- Windows ---

// powershell is the command line that runs script in Windows PowerShell without any shell
// parsing its text: -EncodedCommand takes it as base64 of UTF-16LE, whatever the admin
// account's default shell (cmd.exe or PowerShell) is.
func powershell(script string) string {
	units := utf16.Encode([]rune(script))
	raw := make([]byte, 2*len(units))
	for i, u := range units {
		raw[2*i], raw[2*i+1] = byte(u), byte(u>>8)
	}
	return "powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -EncodedCommand " + base64.StdEncoding.EncodeToString(raw)
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
	// anyone on the host may read it. -EncodedCommand leaves stdin to the script. OpenSSH
	// Users exists where sshd_config allows only its members and administrators in.
	script := windowsPrelude + fmt.Sprintf(`$u = %s
$key = [Console]::In.ReadToEnd().Trim()
if ($key -notmatch '^[A-Za-z0-9@.-]+ [A-Za-z0-9+/=]+( [ -~]*)?$') { [Console]::Error.WriteLine("no authorized_keys line on stdin"); exit 2 }
$owner = %s
if (Get-LocalUser -Name $u -ErrorAction SilentlyContinue) { [Console]::Error.WriteLine("build user $u exists already; berth never reuses a build user"); exit 17 }
$build = Join-Path $env:SystemDrive "berth\$u"
$keys = Join-Path "%s" $u
if ((Test-Path -LiteralPath $build) -or (Test-Path -LiteralPath $keys)) { [Console]::Error.WriteLine("the directories of $u exist already"); exit 17 }
$cfg = Join-Path $env:ProgramData 'ssh\sshd_config'
$shared = (Test-Path -LiteralPath $cfg) -and (Select-String -LiteralPath $cfg -SimpleMatch -Quiet -Pattern %s)
$bytes = New-Object byte[] 24
[Security.Cryptography.RandomNumberGenerator]::Create().GetBytes($bytes)
$password = ConvertTo-SecureString ([Convert]::ToBase64String($bytes) + 'aA1!') -AsPlainText -Force
$account = New-LocalUser -Name $u -Password $password -PasswordNeverExpires -UserMayNotChangePassword -AccountNeverExpires -Description ('berth build user ' + $owner)
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
`, psQuote(u.Name), psQuote(u.Owner), windowsKeyDir, psQuote(windowsSSHDLine), windowsCreateProfile)
	out, err := run(ctx, t, "creating build user "+u.Name, powershell(script), authorized)
	if err != nil {
		return "", userExists(t, u.Name, err)
	}
	dir := strings.TrimSpace(string(out))
	if !strings.Contains(dir, `\berth\`+u.Name) {
		return "", fmt.Errorf("on host %s, creating build user %s printed no build directory: %q", t.Address, u.Name, truncate(dir))
	}
	return dir, nil
}

func removeWindowsUser(ctx context.Context, t remote.Target, user string) error {
	if !windowsUserRE.MatchString(user) {
		return fmt.Errorf("%q is not a berth build user name for Windows; refusing to remove it", truncate(user))
	}
	// rmdir /s removes a junction the build user planted, not what it points to (Remove-Item
	// -Recurse of Windows PowerShell 5.1 may follow it).
	script := windowsPrelude + fmt.Sprintf(`$u = %s
Get-CimInstance Win32_Process | ForEach-Object {
  $o = Invoke-CimMethod -InputObject $_ -MethodName GetOwner -ErrorAction SilentlyContinue
  if ($o.User -eq $u) { Stop-Process -Id $_.ProcessId -Force -ErrorAction SilentlyContinue }
}
$account = Get-LocalUser -Name $u -ErrorAction SilentlyContinue
$dirs = @((Join-Path $env:SystemDrive "berth\$u"), (Join-Path "%s" $u))
if ($account) {
  $sid = $account.SID.Value
  $userProfile = Get-CimInstance Win32_UserProfile | Where-Object { $_.SID -eq $sid }
  Remove-LocalUser -Name $u
  if ($userProfile) {
    # The user's own files go first, by rmdir; then the profile's registration.
    $dirs += $userProfile.LocalPath
    if (Test-Path -LiteralPath $userProfile.LocalPath) { & cmd.exe /d /c rmdir /s /q $userProfile.LocalPath }
    $userProfile | Remove-CimInstance -ErrorAction SilentlyContinue
    [Microsoft.Win32.Registry]::LocalMachine.DeleteSubKeyTree("SOFTWARE\Microsoft\Windows NT\CurrentVersion\ProfileList\$sid", $false)
  }
}
foreach ($dir in $dirs) {
  if (Test-Path -LiteralPath $dir) { & cmd.exe /d /c rmdir /s /q $dir }
  if (Test-Path -LiteralPath $dir) { throw "could not remove $dir" }
}
`, psQuote(user), windowsKeyDir)
	_, err := run(ctx, t, "removing build user "+user, powershell(script), nil)
	return err
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

// darwinCreateScript creates build user $1 (which must not exist) with the key on stdin, as
// provisionScript does on Linux, with macOS's tools. It prints the home.
//
//	$1 user  $2 sudo commands ("" for none)  $3 owner
const darwinCreateScript = `set -eu
user=$1 sudo_cmds=$2 owner=$3
case "$user" in u-*) ;; *) echo "refusing to provision $user: not a berth build user" >&2; exit 2 ;; esac
home=/Users/$user
if dscl . -read "/Users/$user" >/dev/null 2>&1 || [ -e "$home" ] || [ -L "$home" ]; then
	echo "build user $user or its home exists already; berth never reuses a build user" >&2
	exit 17
fi
` + sudoRuleChecked + `
# The UID is one past the highest in use, picked and taken under a lock (shlock frees one left
# by a process that died), so two creations at once never share one.
lock=/var/run/berth-users.lock
command -v shlock >/dev/null 2>&1 || { echo "shlock not found: this host does not look like macOS" >&2; exit 3; }
# Bounded: a lock held for a minute is a stuck host, not a busy one.
tries=0
until shlock -f "$lock" -p $$; do
	tries=$((tries + 1))
	[ $tries -lt 300 ] || { echo "could not take $lock within a minute" >&2; exit 3; }
	sleep 0.2
done
trap 'rm -f "$lock"' EXIT
uid=$(dscl . -list /Users UniqueID | awk '$2 > max { max = $2 } END { print (max < 600 ? 600 : max + 1) }')
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
rm -f "$lock"
trap - EXIT
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

// darwinRemoveScript removes build user $1; a user already gone is success.
const darwinRemoveScript = `set -u
user=$1
case "$user" in u-*) ;; *) echo "refusing to remove $user: not a berth build user" >&2; exit 2 ;; esac
rm -f "/etc/sudoers.d/berth-$user" "/etc/sudoers.d/.berth-$user.new"
i=0
while pkill -KILL -u "$user" 2>/dev/null && [ $i -lt 50 ]; do i=$((i+1)); sleep 0.1; done
if dscl . -read /Groups/com.apple.access_ssh >/dev/null 2>&1; then
	dseditgroup -o edit -d "$user" -t user com.apple.access_ssh >/dev/null 2>&1 || true
fi
if dscl . -read "/Users/$user" >/dev/null 2>&1; then
	dscl . -delete "/Users/$user" >&2 || { echo "could not remove user $user" >&2; exit 1; }
fi
rm -rf -- "/Users/$user"
rm -f "/var/db/berth/users/$user"
`

func createDarwinUser(ctx context.Context, t remote.Target, u NewUser) (string, error) {
	authorized, err := u.check()
	if err != nil {
		return "", err
	}
	return createAsRoot(ctx, t, u.Name, authorized, darwinCreateScript, u.Name, strings.Join(u.SudoCommands, ", "), u.Owner)
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
	return err
}
