package hostops

// The scripts berth runs on hosts, as root. They are fixed text: every value (user name,
// limits, sudo rule, owner) arrives as a positional parameter quoted by remote.Script, and
// key material arrives on standard input, so nothing from a TaskRun is ever parsed as shell.

// provisionScript creates build user $1, which must not exist: its key (stdin) as the only
// authorized key, a build directory, its limits, and the sudo rule $4
// (checked by visudo before anything is made). It prints the user's home. Exit 17: the user,
// its group or its home exists already (berth never repairs a user; it makes a new one).
// Exit 19: no slice of the UID range is free.
//
// The user's IDs come from berth's range ($6 first ID, $7 slices of idsPerUser): its UID and
// GID are a slice's first ID, its subordinate UIDs and GIDs the rest of the slice, written by
// usermod (which takes shadow's own locks) with useradd's automatic allocation turned off.
// A slice is claimed by mkdir of /var/lib/berth/uids/<uid>, atomic against a concurrent
// provision, and stays claimed until a clean has verified that nothing of it is left. The
// search starts after the slice claimed last, so a freed slice waits for the whole range to
// come round before it is handed out again, and skips every slice a passwd, group, subuid or
// subgid entry or another claim touches.
//
// Link safety: every file root writes is either in a root-owned directory (/etc/sudoers.d,
// /etc/security/limits.d, /var/lib/berth, a private mktemp directory) or inside a home that
// this script has just created as root. The user is brand new and has never logged in, and
// the home and everything in it are handed to the user only by the last chown, which does not
// follow links (-h, not -R). So no path root touches can be a link the build user planted.
//
// Limits: $2 is the user's /etc/security/limits.d file, which pam_limits applies to every
// process of each SSH login of the user, with or without systemd. $3 are properties of the
// user's systemd slice, one a line, set where systemd runs; "CPUQuota=N" there is N percent of
// the host's CPUs, turned here into systemd's CPUQuota=, which counts 100% per CPU.
//
//	$1 user  $2 limits.d lines  $3 slice properties  $4 sudo commands ("" for none)  $5 owner
//	$6 first ID of the range  $7 slices in the range
const provisionScript = `set -eu
user=$1 limits=$2 slice_props=$3 sudo_cmds=$4 owner=$5 first=$6 slices=$7
case "$user" in u-*) ;; *) echo "refusing to provision $user: not a berth build user" >&2; exit 2 ;; esac
home=/home/$user
if getent passwd "$user" >/dev/null 2>&1 || getent group "$user" >/dev/null 2>&1 || [ -e "$home" ] || [ -L "$home" ]; then
	echo "build user $user or its home exists already; berth never reuses a build user" >&2
	exit 17
fi
` + sudoRuleChecked + claimSlice + `
mkdir -p /home
groupadd --gid "$uid" "$user"
# -l: lastlog and faillog are sparse files indexed by UID; berth's UIDs would make them huge.
useradd --uid "$uid" --gid "$uid" --no-log-init -K SUB_UID_COUNT=0 -K SUB_GID_COUNT=0 \
	--no-create-home --home-dir "$home" --shell /bin/bash --comment "berth build user" "$user"
for f in /etc/subuid /etc/subgid; do
	# Rootless tools read these as the user: they are world-readable, as shadow ships them.
	[ -e "$f" ] || { : > "$f"; chmod 644 "$f"; }
done
usermod --add-subuids "$((uid + 1))-$((uid + ` + idsPerUserText + ` - 1))" --add-subgids "$((uid + 1))-$((uid + ` + idsPerUserText + ` - 1))" "$user"
# useradd locks the password (!); sshd without PAM refuses locked accounts even for keys.
# '*' allows no password either, but is not "locked".
usermod -p '*' "$user"
mkdir -m 700 "$home"
mkdir -m 700 "$home/.ssh" "$home/build"
cat > "$home/.ssh/authorized_keys"
chmod 600 "$home/.ssh/authorized_keys"
mkdir -p /var/lib/berth/users /etc/security/limits.d
printf '%s\n' "$owner" > "/var/lib/berth/users/$user"
printf '%s' "$limits" > "/etc/security/limits.d/berth-$user.conf"
chmod 644 "/etc/security/limits.d/berth-$user.conf"
` + sudoRuleInstalled + `
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
` + sliceLimits + `fi
chown -h "$user:$user" "$home/.ssh/authorized_keys" "$home/.ssh" "$home/build" "$home"
printf '%s\n' "$home"
`

// sliceLimits gives the slice of the user of $uid the properties $slice_props, one a line,
// where systemd runs (provisionScript checks that). "CPUQuota=N" there is N percent of the
// host's CPUs: systemd's CPUQuota= counts 100% per CPU, so it becomes N times the CPUs online.
const sliceLimits = `# The UID had users before: what their slices were given must not carry over to this one
# (a TasksMax the config no longer sets, say). revert drops set-property's drop-ins.
systemctl revert "user-$uid.slice" >/dev/null 2>&1 || true
if [ -n "$slice_props" ]; then
	ncpu=$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc 2>/dev/null || echo 1)
	set -f
	IFS='
'
	set -- $slice_props
	IFS=' 	
'
	set +f
	n=$#
	while [ "$n" -gt 0 ]; do
		prop=$1
		shift
		case "$prop" in CPUQuota=*) prop="CPUQuota=$((${prop#CPUQuota=} * ncpu))%" ;; esac
		set -- "$@" "$prop"
		n=$((n - 1))
	done
	systemctl set-property --runtime "user-$uid.slice" "$@" >/dev/null 2>&1 ||
		echo "berth: could not set $* on user-$uid.slice; the build's processes are limited, the build as a whole is not" >&2
fi
`

// claimSlice sets $uid to the first ID of a slice of berth's range it has claimed for $user,
// or exits 19. A claim is the directory /var/lib/berth/uids/<uid> holding "user" (the name)
// and "ids" (the slice, "lo hi"), both written before the user exists, so that a clean finds
// the slice even of a provision cut short.
const claimSlice = `ledger=/var/lib/berth/uids
` + ledgerStart + `free=$(
	{
		getent passwd | awk -F: '$3 ~ /^[0-9]+$/ {print $3, $3}'
		getent group | awk -F: '$3 ~ /^[0-9]+$/ {print $3, $3}'
		for f in /etc/subuid /etc/subgid; do
			[ -f "$f" ] && awk -F: '$2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ {printf "%s %.0f\n", $2, $2 + $3 - 1}' "$f"
		done
		cat "$ledger"/*/ids 2>/dev/null
	} | ` + freeSlices + `
)
uid=
for b in $free; do
	if mkdir "$ledger/$b" 2>/dev/null; then uid=$b; break; fi
done
if [ -z "$uid" ]; then
	echo "no free build UID: every one of the $slices slices of the range from $first is claimed or used by the host" >&2
	exit 19
fi
printf '%s\n' "$user" > "$ledger/$uid/user"
printf '%s %s\n' "$uid" "$((uid + ` + idsPerUserText + ` - 1))" > "$ledger/$uid/ids"
` + ledgerNext

// findClaim sets $claim to the ledger's entry ($ledger/<uid>) that names $user, "" when none
// does: the UID a clean must verify and free.
const findClaim = `claim=
for d in "$ledger"/*; do
	[ -f "$d/user" ] || continue
	owner=
	read -r owner < "$d/user" || true
	if [ "$owner" = "$user" ]; then claim=$d; break; fi
done
`

// ledgerStart and ledgerNext open and close a claim in the ledger of build UIDs ($ledger): the
// search starts after the slice claimed last (the number in $ledger.next), so a freed slice waits
// for the whole range to come round, and the claim of $uid moves that number on.
const (
	ledgerStart = `mkdir -p "$ledger"
start=0
[ -f "$ledger.next" ] && read -r start < "$ledger.next" || true
case "$start" in ''|*[!0-9]*) start=0 ;; esac
`
	ledgerNext = `printf '%s\n' "$(( (uid - first) / ` + idsPerUserText + ` + 1 ))" > "$ledger.next.$$" && mv -f "$ledger.next.$$" "$ledger.next"
`
)

// freeSlices reads "lo hi" lines of IDs in use on stdin and prints the first ID of every slice
// of the range ($first, $slices slices) that none of them touches, starting after slice $start
// and going round.
const freeSlices = `awk -v first="$first" -v n="$slices" -v start="$start" -v size=` + idsPerUserText + ` '
		NF == 2 { lo[++m] = $1 + 0; hi[m] = $2 + 0 }
		END {
			for (k = 0; k < n; k++) {
				i = (start + k) % n; b = first + i * size; e = b + size - 1; ok = 1
				for (j = 1; j <= m && ok; j++) if (lo[j] <= e && hi[j] >= b) ok = 0
				if (ok) printf "%.0f\n", b
			}
		}'`

// idsPerUserText is config.IDsPerBuildUser as the scripts' text needs it.
const idsPerUserText = "65536"

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

// cleanScript removes build user $1 and everything of its IDs: its own UID and GID and its
// subordinate ranges (from passwd, /etc/subuid, /etc/subgid and berth's claim of its slice). A
// user already gone is success, so a repeated clean is harmless. Exit 18: something of its
// IDs would not go; each "leftover: ..." line on stderr says what. Then the user stays (locked,
// keyless) and its slice stays claimed, so a later clean can try again and no one else gets
// its IDs meanwhile.
//
// The order matters. First nothing new may start: the sudo rule goes, the account is locked
// and expired, and the home, where its key lies, is renamed out of sshd's way (a rename in
// root-owned /home follows no link). Then every process of its IDs is stopped and killed,
// whatever its user namespace or ancestry, until none is left. Only then are its files
// removed, when nothing of the user can plant a link behind root's back: find never follows
// a link and never leaves the filesystem it searches (-xdev), and rm -rf removes a link, not
// what it points to. What the user owned is found by numeric ID in the places a user may
// write outside its home, never by a walk of the whole filesystem.
const cleanScript = `set -u
user=$1
case "$user" in u-*) ;; *) echo "refusing to remove $user: not a berth build user" >&2; exit 2 ;; esac
umask 077
rm -f "/etc/sudoers.d/berth-$user" "/etc/sudoers.d/.berth-$user.new" "/etc/security/limits.d/berth-$user.conf"
ledger=/var/lib/berth/uids
` + findClaim + `homes="/home/$user"
uids= gids= uid= exists=false
if uid=$(id -u "$user" 2>/dev/null); then
	exists=true
	usermod --lock --expiredate 1 "$user" >/dev/null 2>&1 || echo "could not lock $user" >&2
	home=$(getent passwd "$user" | cut -d: -f6)
	case "$home" in /home/"$user") ;; /?*/"$user") homes="$homes $home" ;; esac
	uids="$uid $uid"
	# The primary group is the user's only if it is its private group: a shared one (users)
	# is not the user's to clean.
	[ "$(id -gn "$user")" = "$user" ] && gids="$(id -g "$user") $(id -g "$user")"
	for f in /etc/subuid /etc/subgid; do
		[ -f "$f" ] || continue
		r=$(awk -F: -v n="$user" -v u="$uid" '($1 == n || $1 == u) && $2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ && $3 > 0 {printf "%s %.0f ", $2, $2 + $3 - 1}' "$f")
		case "$f" in */subuid) uids="$uids $r" ;; *) gids="$gids $r" ;; esac
	done
else
	uid=
fi
if [ -n "$claim" ]; then
	r=$(cat "$claim/ids" 2>/dev/null)
	uids="$uids $r" gids="$gids $r"
	[ -n "$uid" ] || { set -- $r; uid=${1:-}; }
fi
for v in $uids $gids $uid; do
	case "$v" in ''|*[!0-9]*) echo "refusing to clean $user: unreadable ID $v" >&2; exit 2 ;; 0) echo "refusing to clean $user: its IDs include root's" >&2; exit 2 ;; esac
done
for h in $homes; do
	if [ -d "$h" ] && [ ! -L "$h" ]; then
		gone="${h%/*}/.berth-removed-${h##*/}"
		rm -rf -- "$gone"
		mv -T -- "$h" "$gone" 2>/dev/null || rm -rf -- "$h"
		homes="$homes $gone"
	fi
done
if [ -z "$uids$gids" ]; then
	# Neither user nor claim: only what a provision cut short may have left by name.
	for h in $homes; do rm -rf -- "$h"; done
	rm -f "/var/lib/berth/users/$user"
	exit 0
fi
` + cleanProcesses + cleanFiles + `
left=$(leftovers)
if [ -n "$left" ]; then
	printf '%s\n' "$left" >&2
	exit 18
fi
if $exists; then
	# userdel drops the subordinate ranges too, but not every shadow version does.
	for f in /etc/subuid /etc/subgid; do
		[ -f "$f" ] || continue
		awk -F: -v n="$user" -v u="$uid" '($1 == n || $1 == u) && $2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ && $3 > 0 {printf "%s-%.0f\n", $2, $2 + $3 - 1}' "$f" |
		while read -r range; do
			case "$f" in */subuid) usermod --del-subuids "$range" "$user" ;; *) usermod --del-subgids "$range" "$user" ;; esac
		done
	done
	if ! userdel "$user"; then
		echo "leftover: user $user: userdel failed" >&2
		exit 18
	fi
fi
if getent group "$user" >/dev/null 2>&1; then groupdel "$user" || { echo "leftover: group $user: groupdel failed" >&2; exit 18; }; fi
rm -f "/var/lib/berth/users/$user"
# The slice is free again only now that nothing of it is left.
[ -z "$claim" ] || rm -rf -- "$claim"
`

// cleanProcesses ends every process any of whose real, effective, saved or filesystem UIDs
// lies in $uids or GIDs in $gids, looking at every thread in /proc, whatever its user or PID
// namespace: a rootless container's process runs under a subordinate UID and has no ancestor
// of the user's own. Found processes are stopped before they are killed, and the search
// repeats until it finds none running, so that a fork bomb cannot outrun it.
const cleanProcesses = `# procs prints "pid state name" for every process of the user's IDs.
procs() {
	cat /proc/[0-9]*/task/[0-9]*/status 2>/dev/null | awk -v u="$uids" -v g="$gids" -v self="$$" '
		BEGIN { nu = split(u, U, " "); ng = split(g, G, " ") }
		function hit(v, A, n,   i) { for (i = 1; i < n; i += 2) if (v + 0 >= A[i] + 0 && v + 0 <= A[i + 1] + 0) return 1; return 0 }
		$1 == "Name:" { name = $2; st = ""; tgid = ""; mine = 0 }
		$1 == "State:" { st = $2 }
		$1 == "Tgid:" { tgid = $2 }
		$1 == "Uid:" { mine = hit($2, U, nu) || hit($3, U, nu) || hit($4, U, nu) || hit($5, U, nu) }
		$1 == "Gid:" {
			mine = mine || hit($2, G, ng) || hit($3, G, ng) || hit($4, G, ng) || hit($5, G, ng)
			if (mine && tgid != self && !(tgid in seen)) { seen[tgid] = 1; print tgid, st, name }
		}'
}
if [ -n "$uid" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	# Its processes also live in its slice, where a kill reaches them all at once; lingering
	# would start its user manager again.
	loginctl disable-linger "$user" >/dev/null 2>&1 || true
	rm -f "/var/lib/systemd/linger/$user"
	systemctl kill --signal=SIGKILL "user-$uid.slice" >/dev/null 2>&1 || true
	systemctl stop "user-$uid.slice" >/dev/null 2>&1 || true
	systemctl revert "user-$uid.slice" >/dev/null 2>&1 || true
fi
` + stopAndKill

// stopAndKill ends every process procs prints (pid, state, name, as Linux's and macOS's ps
// give them): it stops them until a search finds none running, then kills them all, and starts
// again, at most 100 rounds; what is left is the clean's leftover to report.
const stopAndKill = `round=0
while [ $round -lt 100 ]; do
	round=$((round + 1))
	# Stop what runs until a search finds nothing running: a stopped process cannot fork, and
	# a child forked before its parent stopped is found by the next search.
	i=0
	while [ $i -lt 20 ]; do
		i=$((i + 1))
		running=$(procs | awk '$2 != "T" && $2 != "t" && $2 != "Z" && $2 != "X" {print $1}')
		[ -n "$running" ] || break
		kill -STOP $running 2>/dev/null
	done
	all=$(procs | awk '$2 != "Z" && $2 != "X" {print $1}')
	[ -n "$all" ] || all=$(procs | awk '{print $1}')
	[ -n "$all" ] || break
	kill -KILL $all 2>/dev/null
	sleep 0.1
done
`

// cleanFiles removes what the user's IDs own outside its home: SysV IPC objects, cron and at
// jobs, mail, its runtime directory and what lies in the world-writable temporary
// directories, and the home itself. leftovers reports what is still there, for the exit 18.
const cleanFiles = `fexpr=
set -- $uids
while [ $# -ge 2 ]; do fexpr="$fexpr -o ( -uid +$(($1 - 1)) -uid -$(($2 + 1)) )"; shift 2; done
set -- $gids
while [ $# -ge 2 ]; do fexpr="$fexpr -o ( -gid +$(($1 - 1)) -gid -$(($2 + 1)) )"; shift 2; done
fexpr=${fexpr# -o }
tmpdirs="/tmp /var/tmp /dev/shm /dev/mqueue"
spooldirs="/var/mail /var/spool/mail /var/spool/cron /var/spool/cron/crontabs /var/spool/cron/tabs /var/spool/cron/atjobs /var/spool/atjobs /var/spool/at"
[ -n "$uid" ] && tmpdirs="$tmpdirs /run/user/$uid"
# owned rm|print DIR [MAXDEPTH]: removes or prints the topmost paths under DIR of the user's
# IDs, on DIR's own filesystem.
owned() {
	act=$1 d=$2 depth=${3:-}
	[ -d "$d" ] && [ ! -L "$d" ] || return 0
	set -f
	if [ "$act" = rm ]; then
		find "$d" -xdev -mindepth 1 ${depth:+-maxdepth $depth} \( $fexpr \) -prune -exec rm -rf -- {} +
	else
		find "$d" -xdev -mindepth 1 ${depth:+-maxdepth $depth} \( $fexpr \) -prune -print
	fi
	set +f
}
# ipc prints "kind id" for every SysV IPC object the user's IDs own or made.
ipc() {
	for kind in shm msg sem; do
		[ -r "/proc/sysvipc/$kind" ] || continue
		awk -v u="$uids" -v g="$gids" -v kind="$kind" '
			BEGIN { nu = split(u, U, " "); ng = split(g, G, " ") }
			function hit(v, A, n,   i) { for (i = 1; i < n; i += 2) if (v + 0 >= A[i] + 0 && v + 0 <= A[i + 1] + 0) return 1; return 0 }
			NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; id = col[kind "id"]; next }
			hit($col["uid"], U, nu) || hit($col["cuid"], U, nu) || hit($col["gid"], G, ng) || hit($col["cgid"], G, ng) { print kind, $id }' "/proc/sysvipc/$kind"
	done
}
ipc | while read -r kind id; do
	case "$kind" in shm) ipcrm -m "$id" ;; msg) ipcrm -q "$id" ;; sem) ipcrm -s "$id" ;; esac 2>/dev/null
done
if $exists && command -v crontab >/dev/null 2>&1; then crontab -r -u "$user" >/dev/null 2>&1 || true; fi
for d in /var/spool/cron/crontabs /var/spool/cron/tabs /var/spool/cron /var/mail /var/spool/mail; do
	rm -f "$d/$user"
done
if [ -n "$uid" ] && mountpoint -q "/run/user/$uid" 2>/dev/null; then umount "/run/user/$uid" 2>/dev/null || umount -l "/run/user/$uid" 2>/dev/null; fi
for d in $tmpdirs; do owned rm "$d"; done
for d in $spooldirs; do owned rm "$d" 1; done
for h in $homes; do rm -rf -- "$h"; done
# leftovers says what of the user is still there, one "leftover:" line each, a count and an
# example per kind and place, so the message stays short however much is left.
leftovers() {
	procs | awk '{ n++; if (n == 1) ex = "pid " $1 " (" $3 ", state " $2 ")" } END { if (n) printf "leftover: %d process(es) of its IDs still run, e.g. %s\n", n, ex }'
	for d in $tmpdirs; do owned print "$d"; done | summary "paths of its IDs remain"
	for d in $spooldirs; do owned print "$d" 1; done | summary "spool files of its IDs remain"
	ipc | summary "SysV IPC objects of its IDs remain"
	for h in $homes; do if [ -e "$h" ] || [ -L "$h" ]; then echo "$h"; fi; done | summary "home directories remain"
}
` + leftoverSummary

// leftoverSummary defines summary WHAT, which prints one leftover line for the lines on stdin,
// if any: how many and the first one.
const leftoverSummary = `# summary WHAT: one leftover line for the lines on stdin, if any: how many and the first one.
summary() {
	LC_ALL=C awk -v what="$1" '{ n++; if (n == 1) ex = $0 } END { if (n) { gsub(/[^[:print:]]/, "?", ex); printf "leftover: %d %s, e.g. %s\n", n, what, ex } }'
}
`

// inspectScript reports the size and free space (in KiB) of the disk at $1, every build user
// with when it was made and for which TaskRun, and every claimed UID whose user is gone, in
// lines of "key value...".
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
# Claims whose user is gone: a provision cut short or a clean that found leftovers.
for d in /var/lib/berth/uids/*; do
	[ -f "$d/user" ] || continue
	name=
	read -r name < "$d/user" || true
	[ -n "$name" ] || continue
	getent passwd "$name" >/dev/null 2>&1 && continue
	printf 'claim %s %s %s\n' "${d##*/}" "$name" "$(stat -c %Y "$d")"
done
printf 'now %s\n' "$(date +%s)"
# Where systemd runs, each build is bounded as a whole on its slice (provisionScript).
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then echo "systemd yes"; else echo "systemd no"; fi
`
