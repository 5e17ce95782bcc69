package hostops

// The scripts berth runs on hosts, as root. They are fixed text: every value (user name,
// limits, sudo rule, owner) arrives as a positional parameter quoted by remote.Script, and
// key material arrives on standard input, so nothing from a TaskRun is ever parsed as shell.

// provisionScript creates build user $1, which must not exist: its key (stdin) as the only
// authorized key, a build directory, process and CPU-time limits, and the sudo rule $4
// (checked by visudo before anything is made). It prints the user's home. Exit 17: the user
// or its home exists already (berth never repairs a user; it makes a new one).
//
// Link safety: every file root writes is either in a root-owned directory (/etc/sudoers.d,
// /etc/security/limits.d, /var/lib/berth, a private mktemp directory) or inside a home that
// this script has just created as root. The user is brand new and has never logged in, and
// the home and everything in it are handed to the user only by the last chown, which does not
// follow links (-h, not -R). So no path root touches can be a link the build user planted.
//
//	$1 user  $2 max processes  $3 max CPU minutes  $4 sudo commands ("" for none)  $5 owner
const provisionScript = `set -eu
user=$1 nproc=$2 cpu=$3 sudo_cmds=$4 owner=$5
case "$user" in u-*) ;; *) echo "refusing to provision $user: not a berth build user" >&2; exit 2 ;; esac
home=/home/$user
if getent passwd "$user" >/dev/null 2>&1 || [ -e "$home" ] || [ -L "$home" ]; then
	echo "build user $user or its home exists already; berth never reuses a build user" >&2
	exit 17
fi
` + sudoRuleChecked + `
mkdir -p /home
useradd --no-create-home --home-dir "$home" --shell /bin/bash --comment "berth build user" "$user"
# useradd locks the password (!); sshd without PAM refuses locked accounts even for keys.
# '*' allows no password either, but is not "locked".
usermod -p '*' "$user"
group=$(id -gn "$user")
mkdir -m 700 "$home"
mkdir -m 700 "$home/.ssh" "$home/build"
cat > "$home/.ssh/authorized_keys"
chmod 600 "$home/.ssh/authorized_keys"
mkdir -p /var/lib/berth/users /etc/security/limits.d
printf '%s\n' "$owner" > "/var/lib/berth/users/$user"
printf '%s hard nproc %s\n%s hard cpu %s\n' "$user" "$nproc" "$user" "$cpu" > "/etc/security/limits.d/berth-$user.conf"
chmod 644 "/etc/security/limits.d/berth-$user.conf"
` + sudoRuleInstalled + `
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl set-property --runtime "user-$(id -u "$user").slice" "TasksMax=$nproc" >/dev/null 2>&1 || true
fi
chown -h "$user:$group" "$home/.ssh/authorized_keys" "$home/.ssh" "$home/build" "$home"
printf '%s\n' "$home"
`

// sudoRuleChecked writes the sudo rule of $user for $sudo_cmds into a private temp dir $work
// and has visudo check it, before anything else is made; sudoRuleInstalled puts it in force.
const (
	sudoRuleChecked = `umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "$sudo_cmds" ]; then
	printf '%s ALL=(root) NOPASSWD: %s\n' "$user" "$sudo_cmds" > "$work/sudoers"
	if ! visudo -cqf "$work/sudoers" >&2; then echo "visudo rejected the sudo rule for $user" >&2; exit 3; fi
fi
`
	sudoRuleInstalled = `if [ -n "$sudo_cmds" ]; then
	mkdir -p /etc/sudoers.d
	# A name with a dot is ignored by sudo until the rename makes the rule whole at once.
	cp "$work/sudoers" "/etc/sudoers.d/.berth-$user.new"
	chmod 440 "/etc/sudoers.d/.berth-$user.new"
	mv -f "/etc/sudoers.d/.berth-$user.new" "/etc/sudoers.d/berth-$user"
fi
`
)

// cleanScript removes build user $1: its processes, the user, its home, its sudo rule and
// limits. A user already gone is success.
const cleanScript = `set -u
user=$1
case "$user" in u-*) ;; *) echo "refusing to remove $user: not a berth build user" >&2; exit 2 ;; esac
rm -f "/etc/sudoers.d/berth-$user" "/etc/security/limits.d/berth-$user.conf"
if id -u "$user" >/dev/null 2>&1; then
	home=$(getent passwd "$user" | cut -d: -f6)
	# A build may fork faster than one kill: repeat until nothing of the user is left.
	i=0
	while pkill -KILL -u "$user" 2>/dev/null && [ $i -lt 50 ]; do i=$((i+1)); sleep 0.1; done
	if ! userdel --remove "$user" 2>/dev/null; then
		userdel "$user" || { echo "could not remove user $user" >&2; exit 1; }
	fi
	case "$home" in */"$user") rm -rf -- "$home" ;; esac
fi
# A provision cut short may have left the home without the user, or the user without the home.
rm -rf -- "/home/$user"
rm -f "/var/lib/berth/users/$user" "/etc/sudoers.d/.berth-$user.new"
`

// inspectScript reports the size and free space (in KiB) of the disk at $1 and every build user with when it was made and for
// which TaskRun, in lines of "key value...".
const inspectScript = `set -u
path=$1
# Kilobytes as df prints them: awk's arithmetic and printf %d overflow past 2 GiB on mawk.
df -Pk "$path" | awk 'NR==2 {print "disk", $2, $4}'
getent passwd | while IFS=: read -r name _ _ _ _ home _; do
	case "$name" in u-*) ;; *) continue ;; esac
	marker="/var/lib/berth/users/$name"
	if [ -f "$marker" ]; then
		printf 'user %s %s %s\n' "$name" "$(stat -c %Y "$marker")" "$(head -n1 "$marker")"
	else
		printf 'user %s %s\n' "$name" "$(stat -c %Y "$home" 2>/dev/null || echo 0)"
	fi
done
printf 'now %s\n' "$(date +%s)"
`
