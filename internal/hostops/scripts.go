package hostops

// The scripts berth runs on hosts, as root. They are fixed text: every value (user name,
// limits, sudo rule, owner) arrives as a positional parameter quoted by remote.Script, and
// key material arrives on standard input, so nothing from a TaskRun is ever parsed as shell.

// provisionScript creates or refreshes build user $1: key from stdin into authorized_keys,
// build directory, process and CPU-time limits, and the sudo rule $4 (validated by visudo
// before it is installed). It prints the user's home.
//
//	$1 user  $2 max processes  $3 max CPU minutes  $4 sudo commands ("" for none)  $5 owner
const provisionScript = `set -eu
user=$1 nproc=$2 cpu=$3 sudo_cmds=$4 owner=$5
case "$user" in u-*) ;; *) echo "refusing to provision $user: not a berth build user" >&2; exit 2 ;; esac
if ! id -u "$user" >/dev/null 2>&1; then
	useradd --create-home --shell /bin/bash --comment "berth build user" "$user"
fi
# useradd locks the password (!); sshd without PAM refuses locked accounts even for keys.
# '*' allows no password either, but is not "locked".
usermod -p '*' "$user"
home=$(getent passwd "$user" | cut -d: -f6)
group=$(id -gn "$user")
install -d -m 700 -o "$user" -g "$group" "$home/.ssh"
umask 077
cat > "$home/.ssh/authorized_keys.new"
chown "$user:$group" "$home/.ssh/authorized_keys.new"
mv -f "$home/.ssh/authorized_keys.new" "$home/.ssh/authorized_keys"
umask 022
install -d -m 755 -o "$user" -g "$group" "$home/build"
mkdir -p /var/lib/berth/users /etc/security/limits.d
printf '%s\n' "$owner" > "/var/lib/berth/users/$user"
printf '%s hard nproc %s\n%s hard cpu %s\n' "$user" "$nproc" "$user" "$cpu" > "/etc/security/limits.d/berth-$user.conf"
rm -f "/etc/sudoers.d/berth-$user"
if [ -n "$sudo_cmds" ]; then
	mkdir -p /etc/sudoers.d
	rule=$(mktemp)
	printf '%s ALL=(root) NOPASSWD: %s\n' "$user" "$sudo_cmds" > "$rule"
	if ! visudo -cqf "$rule" >&2; then rm -f "$rule"; echo "visudo rejected the sudo rule for $user" >&2; exit 3; fi
	chmod 440 "$rule"
	mv -f "$rule" "/etc/sudoers.d/berth-$user"
fi
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl set-property --runtime "user-$(id -u "$user").slice" "TasksMax=$nproc" >/dev/null 2>&1 || true
fi
printf '%s\n' "$home"
`

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
rm -f "/var/lib/berth/users/$user"
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
