#!/bin/bash
# The podman of berth's test hosts: a stand-in for the `podman run` that remote Tasks send a
# build host, as the task's build user. No image can be pulled here (no registry), so it does
# one of two things:
#
#   - `podman run <builder image> /scripts/script-build.sh`, what the buildah-remote Tasks
#     send: it checks that the invocation is the one the task makes, as the task's build user,
#     against the build directory the task synced, and then does the part of the image's work
#     that the task reads back: it builds a real image (Debian's buildah, rootless, FROM
#     scratch with the synced build context copied in), writes it as an OCI layout into the
#     shared volume with its path in container_path, and writes the IMAGE_URL, IMAGE_DIGEST
#     and IMAGE_REF results. The real script-build.sh is not run.
#   - `podman run <image> <command>...`, anything else (the steps `berth taskgen` moves to a
#     host): it runs the command in a container as rootless podman would, with the image's
#     files stood in by this host's own: its own user, mount, PID, UTS and IPC namespaces, the
#     build user as root and its /etc/subuid range as the other ids (rootless podman's
#     mapping); a root of its own with the host's /usr (and /bin, /lib..., /opt) read-only and
#     a copy of its /etc; empty /tmp, /run, /root, /home, /var/tmp; the -v mounts (read-only
#     with ro), --tmpfs and anonymous volumes; only the -e environment (and PATH, HOME,
#     HOSTNAME and container=podman, as podman sets them); the container id as hostname; the
#     --workdir, created if missing; --user as a uid[:gid] of the mapping. The container's exit
#     status is podman's. Each run is logged to podman-standin.log in the user's home.
#
# Anything else is an error that says what was wrong, with podman's exit status for its own
# errors (125).
#
# package sshhosts (podman.go) says how it gets onto a host; README's testing section says
# what it is for.
set -euo pipefail

me="podman stand-in of berth test host $(hostname 2>/dev/null || echo '?')"
fail() {
	printf '%s: %s\n' "$me" "$*" >&2
	exit 125
}

# container_script makes the container inside its new namespaces (as the mapped root) and
# runs the command in it. Paths travel as arguments, never inside the shell text; mount
# points are resolved inside the new root, so a link there cannot lead a mount out of it.
#   $1 root  $2 container id  $3 workdir  $4 uid:gid
#   then SOURCE TARGET MODE (rw, ro, or tmpfs with SOURCE tmpfs)... --  NAME=VALUE... --  COMMAND ARG...
read -r -d '' container_script <<'EOF' || true
set -eu
PATH=/usr/sbin:/usr/bin:/sbin:/bin
root=$1 cid=$2 workdir=$3 run_as=$4
shift 4
mount -t tmpfs -o mode=755 podman-standin "$root"
for d in usr bin sbin lib lib32 lib64 libx32 opt; do
	if [ -L "/$d" ]; then
		ln -s "$(readlink "/$d")" "$root/$d"
	elif [ -d "/$d" ]; then
		mkdir "$root/$d"
		mount --rbind "/$d" "$root/$d"
		mount -o remount,bind,ro "$root/$d"
	fi
done
mkdir -p "$root/etc" "$root/proc" "$root/dev" "$root/sys" "$root/tmp" "$root/var/tmp" "$root/run" "$root/root" "$root/home"
chmod 1777 "$root/tmp" "$root/var/tmp"
chmod 700 "$root/root"
cp -a /etc/. "$root/etc/" 2>/dev/null || true # what the build user may read of it
printf '%s\n' "$cid" >"$root/etc/hostname"
hostname "$cid"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
while [ "$1" != -- ]; do
	src=$1 dst=$2 mode=$3
	shift 3
	at=$root$(chroot "$root" readlink -m -- "$dst")
	if [ "$mode" = tmpfs ]; then
		mkdir -p "$at"
		mount -t tmpfs tmpfs "$at"
		continue
	fi
	if [ -d "$src" ]; then
		mkdir -p "$at"
	else
		mkdir -p "$(dirname "$at")"
		[ -e "$at" ] || : >"$at"
	fi
	mount --bind "$src" "$at"
	if [ "$mode" = ro ]; then mount -o remount,bind,ro "$at"; fi
done
shift
envs=()
while [ "$1" != -- ]; do
	envs+=("$1")
	shift
done
shift
uid=${run_as%%:*} gid=${run_as#*:}
as=()
[ "$uid:$gid" = 0:0 ] || as=(setpriv --reuid="$uid" --regid="$gid" --keep-groups --)
# podman makes the working directory as root, then starts the command as the user.
exec chroot "$root" /bin/sh -c 'mkdir -p -- "$1" && cd -- "$1" && shift && exec "$@"' \
	container "$workdir" env -i "${envs[@]}" "${as[@]}" "$@"
EOF

[ $# -gt 0 ] || fail "no arguments; this stand-in only knows 'podman run', as remote Tasks send it"
case $1 in
run) shift ;;
version | --version)
	echo "podman version 0.0.0 (berth test-host stand-in; builds with $(buildah --version 2>/dev/null || echo 'no buildah'))"
	exit 0
	;;
*) fail "'podman $1' is not supported; this stand-in only knows 'podman run', as remote Tasks send it" ;;
esac

uid=$(id -u)
user=$(id -un)
[ "$uid" != 0 ] || fail "called as root; the build runs as the task's own build user (ssh as the secret's host, podman without sudo)"

declare -A env=() binds=() readonly_binds=()
env_order=() bind_order=() anonymous=() tmpfs=() unsupported=()
container_user='' entrypoint='' workdir=''
value() { [ $# -ge 2 ] || fail "$1 needs a value"; }
while [ $# -gt 0 ]; do
	case $1 in
	-e | --env) value "$@"; set -- "--env=$2" "${@:3}"; continue ;;
	-v | --volume) value "$@"; set -- "--volume=$2" "${@:3}"; continue ;;
	-u | --user) value "$@"; set -- "--user=$2" "${@:3}"; continue ;;
	-w | --workdir) value "$@"; set -- "--workdir=$2" "${@:3}"; continue ;;
	--entrypoint | --tmpfs | --mount | --device | --security-opt) value "$@"; set -- "$1=$2" "${@:3}"; continue ;;
	--env=*)
		kv=${1#*=}
		[[ $kv == *=* ]] || fail "-e $kv: remote Tasks pass every variable as NAME=VALUE"
		[ -n "${env[${kv%%=*}]+set}" ] || env_order+=("${kv%%=*}")
		env[${kv%%=*}]=${kv#*=}
		;;
	--volume=*)
		spec=${1#*=}
		IFS=: read -r -a part <<<"$spec"
		case ${#part[@]} in
		1) anonymous+=("${part[0]}") ;;
		2 | 3)
			src=${part[0]%/} dst=${part[1]%/}
			[[ $src == /* && $dst == /* ]] || fail "-v $spec: source and target must be absolute paths"
			[ -e "$src" ] || fail "-v $spec: statfs $src: no such file or directory (was it synced to the host before podman ran?)"
			[ -n "${binds[$dst]+set}" ] || bind_order+=("$dst")
			binds[$dst]=$src
			IFS=, read -r -a opts <<<"${part[2]:-}"
			for opt in "${opts[@]}"; do
				case $opt in
				ro) readonly_binds[$dst]=1 ;;
				rw | z | Z) ;;
				*) fail "-v $spec: option $opt is not supported by this stand-in (ro, rw, z, Z are)" ;;
				esac
			done
			;;
		*) fail "-v $spec: want SOURCE:TARGET[:OPTIONS] or an anonymous TARGET" ;;
		esac
		;;
	--user=*) container_user=${1#*=} ;;
	--workdir=*) workdir=${1#*=} ;;
	--entrypoint=*) entrypoint=${1#*=} ;;
	--tmpfs=*) tmpfs+=("${1#*=}") ;;
	--mount=* | --device=* | --security-opt=* | --privileged) unsupported+=("${1%%=*}") ;;
	--rm) ;;
	--) shift; break ;;
	-*) fail "unknown option $1; this stand-in knows the options remote Tasks pass (-e, -v, -w, --tmpfs, --user, --rm, --entrypoint, --privileged, --mount, --device, --security-opt)" ;;
	*) break ;;
	esac
	shift
done
[ $# -ge 1 ] || fail "want an image after the options"
[ $# -ge 2 ] || fail "no command after image $1: this stand-in cannot know an image's own command; name it"
image=$1 command=$2
shift 2

grep -qE "^($user|$uid):" /etc/subuid 2>/dev/null ||
	fail "$user has no range in /etc/subuid, and rootless podman needs one; useradd assigns one when /etc/subuid exists"
[ -z "$entrypoint" ] || fail "--entrypoint=$entrypoint: the command after the image runs itself (no entrypoint, or --entrypoint='')"

if [ "$command" != /scripts/script-build.sh ]; then
	# A container of the host's own files: see the top of this file.
	[ ${#unsupported[@]} -eq 0 ] || fail "${unsupported[*]}: not supported by this stand-in's containers (it runs rootless containers with podman's defaults)"
	case $container_user in
	'' | root) run_as=0:0 ;;
	*)
		[[ $container_user =~ ^[0-9]+(:[0-9]+)?$ ]] ||
			fail "--user=$container_user: this stand-in takes a numeric uid[:gid] only (it has no image /etc/passwd to look names up in)"
		run_as=$container_user
		[[ $run_as == *:* ]] || run_as=$run_as:$run_as
		;;
	esac
	home=/root
	[ "${run_as%%:*}" = 0 ] || home=/
	cid=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
	state=$(mktemp -d "${TMPDIR:-/tmp}/podman-standin.XXXXXX")
	trap 'rm -rf "$state" 2>/dev/null || unshare --user --map-root-user --map-auto rm -rf "$state"' EXIT
	mkdir "$state/root" "$state/volumes"
	# Mounts go on parents first, as podman sorts them, so none hides another.
	mounts=()
	while IFS=$'\t' read -r _ kind dst; do
		case $kind in
		bind)
			mode=rw
			[ -z "${readonly_binds[$dst]:-}" ] || mode=ro
			mounts+=("${binds[$dst]}" "$dst" "$mode")
			;;
		volume) mounts+=("$(mktemp -d "$state/volumes/v.XXXXXX")" "$dst" rw) ;;
		tmpfs) mounts+=(tmpfs "$dst" tmpfs) ;;
		esac
	done < <(
		{
			for dst in "${bind_order[@]}"; do printf '%s\tbind\t%s\n' "$(tr -cd / <<<"$dst" | wc -c)" "$dst"; done
			for dst in "${anonymous[@]}"; do printf '%s\tvolume\t%s\n' "$(tr -cd / <<<"$dst" | wc -c)" "$dst"; done
			for dst in "${tmpfs[@]}"; do printf '%s\ttmpfs\t%s\n' "$(tr -cd / <<<"$dst" | wc -c)" "$dst"; done
		} | sort -s -n -k1,1
	)
	environment=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOSTNAME="$cid" container=podman HOME="$home")
	for name in "${env_order[@]}"; do
		environment+=("$name=${env[$name]}")
	done
	printf 'ran %s %s as %s (uid %s) in container %s\n' "$image" "$command${*:+ $*}" "$user" "$uid" "$cid" >>"$HOME/podman-standin.log"
	status=0
	unshare --user --map-root-user --map-auto --mount --pid --uts --ipc --fork --kill-child -- \
		bash -c "$container_script" podman-standin-container "$state/root" "$cid" "${workdir:-/}" "$run_as" \
		"${mounts[@]}" -- "${environment[@]}" -- "$command" "$@" || status=$?
	exit "$status"
fi

# buildah-remote's script-build.sh: see the top of this file.
[ "$container_user" = 0 ] || fail "--user=${container_user:-<none>}: script-build.sh needs --user=0 (root inside the container)"
for target in /scripts /shared /tekton/results; do
	[ -n "${binds[$target]:-}" ] || fail "no -v ...:$target mount; buildah-remote mounts scripts, shared and results from its build directory"
done
[[ " ${anonymous[*]} " == *" /var/lib/containers "* ]] || fail "no anonymous -v /var/lib/containers; the builder keeps its image store there"
build_dir=${binds[/scripts]%/scripts}
[ "$build_dir" != "${binds[/scripts]}" ] || fail "the /scripts mount comes from ${binds[/scripts]}, not from <user-dir>/scripts"
workspace=''
for target in "${!binds[@]}"; do
	src=${binds[$target]}
	[[ $src == "$build_dir"/* ]] || fail "-v $src:$target is outside the build directory $build_dir"
	[ "$src" != "$build_dir/workspaces/source" ] || workspace=$src
done
[ -n "$workspace" ] || fail "no -v $build_dir/workspaces/source:<workspace path> mount; the sources are synced there"
[ "$(stat -c %u "$build_dir")" = "$uid" ] || fail "the build directory $build_dir belongs to uid $(stat -c %u "$build_dir"), not to $user ($uid)"
script=$build_dir/scripts/script-build.sh
[ -x "$script" ] || fail "$script is missing or not executable; buildah-remote syncs scripts/ before it runs podman"
[ "$(head -c 2 "$script")" = '#!' ] || fail "$script has no #! line"
for name in IMAGE SOURCE_CODE_DIR CONTEXT DOCKERFILE; do
	[ -n "${env[$name]+set}" ] || fail "no -e $name=...; script-build.sh reads it"
done
command -v buildah >/dev/null || fail "buildah is not installed on this machine; make prereqs installs it"

# Where script-build.sh looks for the Containerfile, relative to the workspace.
src_dir=${env[SOURCE_CODE_DIR]} context=${env[CONTEXT]} dockerfile=${env[DOCKERFILE]}
if [ -e "$workspace/$src_dir/$context/$dockerfile" ]; then
	containerfile=$src_dir/$context/$dockerfile
elif [ -e "$workspace/$src_dir/$dockerfile" ]; then
	containerfile=$src_dir/$dockerfile
else
	echo "Cannot find Dockerfile $dockerfile" >&2
	exit 1
fi
containerfile=$(realpath -m --relative-to="$workspace" "$workspace/$containerfile")

work=$(mktemp -d)
store=(--storage-driver vfs --root "$work/storage" --runroot "$work/run")
# vfs layers may hold files of the user namespace's other ids, which only buildah unshare can
# remove.
trap 'buildah unshare rm -rf "$work" >/dev/null 2>&1 || rm -rf "$work"' EXIT
printf 'FROM scratch\nCOPY . /src/\n' >"$work/Containerfile"
tag=${env[IMAGE]}
export BUILDAH_ISOLATION=chroot
buildah "${store[@]}" bud --quiet --pull=never -f "$work/Containerfile" -t "$tag" \
	--label "io.berth.podman-standin.user=$user" \
	--label "io.berth.podman-standin.uid=$uid" \
	--label "io.berth.podman-standin.builder-image=$image" \
	--label "io.berth.podman-standin.containerfile=$containerfile" \
	"$workspace/$src_dir/$context" >/dev/null

# Where buildah-remote's script-build.sh leaves the image for the task to pull back.
name=${tag##*/}
name=${name//:/-}.oci
shared=${binds[/shared]} results=${binds[/tekton/results]}
rm -rf "${shared:?}/$name"
buildah "${store[@]}" push --quiet --digestfile "$work/digest" "$tag" "oci:$shared/$name:$tag" >/dev/null
printf '/shared/%s\n' "$name" >"$shared/container_path"
digest=$(cat "$work/digest")
printf '%s' "$tag" >"$results/IMAGE_URL"
printf '%s' "$digest" >"$results/IMAGE_DIGEST"
printf '%s@%s' "$tag" "$digest" >"$results/IMAGE_REF"

summary="built $tag@$digest from $containerfile as $user (uid $uid) in place of $image $command${*:+ $*}"
printf '%s\n' "$summary" >>"$build_dir/podman-standin.log"
printf '%s: %s\n' "$me" "$summary" >&2
