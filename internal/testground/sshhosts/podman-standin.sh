#!/bin/bash
# The podman of berth's test hosts: a stand-in for `podman run <builder image>
# /scripts/script-build.sh`, the one podman command the buildah-remote Tasks send a build host.
# The builder image cannot be pulled here (no registry), so this checks that the invocation is
# the one the task makes, as the task's build user, against the build directory the task
# synced, and then does the part of the image's work that the task reads back: it builds a
# real image (Debian's buildah, rootless, FROM scratch with the synced build context copied
# in), writes it as an OCI layout into the shared volume with its path in container_path, and
# writes the IMAGE_URL, IMAGE_DIGEST and IMAGE_REF results. Anything else is an error that
# says what was wrong, with podman's exit status for its own errors (125).
#
# package sshhosts (podman.go) says how it gets onto a host; README's testing section says
# what it is for.
set -euo pipefail

me="podman stand-in of berth test host $(hostname 2>/dev/null || echo '?')"
fail() {
	printf '%s: %s\n' "$me" "$*" >&2
	exit 125
}

[ $# -gt 0 ] || fail "no arguments; this stand-in only knows 'podman run ... /scripts/script-build.sh', as buildah-remote sends it"
case $1 in
run) shift ;;
version | --version)
	echo "podman version 0.0.0 (berth test-host stand-in; builds with $(buildah --version 2>/dev/null || echo 'no buildah'))"
	exit 0
	;;
*) fail "'podman $1' is not supported; this stand-in only knows 'podman run ... /scripts/script-build.sh', as buildah-remote sends it" ;;
esac

uid=$(id -u)
user=$(id -un)
[ "$uid" != 0 ] || fail "called as root; the build runs as the task's own build user (ssh as the secret's host, podman without sudo)"

declare -A env=() binds=()
anonymous=() container_user='' entrypoint='' entrypoint_given=''
value() { [ $# -ge 2 ] || fail "$1 needs a value"; }
while [ $# -gt 0 ]; do
	case $1 in
	-e | --env) value "$@"; set -- "--env=$2" "${@:3}"; continue ;;
	-v | --volume) value "$@"; set -- "--volume=$2" "${@:3}"; continue ;;
	-u | --user) value "$@"; set -- "--user=$2" "${@:3}"; continue ;;
	--entrypoint) value "$@"; set -- "--entrypoint=$2" "${@:3}"; continue ;;
	--tmpfs | --mount | --device | --security-opt) value "$@"; shift 2; continue ;;
	--env=*)
		kv=${1#*=}
		[[ $kv == *=* ]] || fail "-e $kv: buildah-remote passes every variable as NAME=VALUE"
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
			binds[$dst]=$src
			;;
		*) fail "-v $spec: want SOURCE:TARGET[:OPTIONS] or an anonymous TARGET" ;;
		esac
		;;
	--user=*) container_user=${1#*=} ;;
	--entrypoint=*) entrypoint=${1#*=} entrypoint_given=1 ;;
	--tmpfs=* | --mount=* | --device=* | --security-opt=* | --rm | --privileged) ;;
	--) shift; break ;;
	-*) fail "unknown option $1; this stand-in knows the options buildah-remote passes (-e, -v, --tmpfs, --user, --rm, --entrypoint, --privileged, --mount, --device, --security-opt)" ;;
	*) break ;;
	esac
	shift
done
[ $# -ge 2 ] || fail "want an image and a command after the options, got: $*"
image=$1 command=$2
shift 2

[ "$container_user" = 0 ] || fail "--user=${container_user:-<none>}: script-build.sh needs --user=0 (root inside the container)"
[ -z "$entrypoint" ] || fail "--entrypoint=$entrypoint: the builder image must run /scripts/script-build.sh itself (no entrypoint, or --entrypoint='')"
[ "$command" = /scripts/script-build.sh ] || fail "command $command: buildah-remote runs /scripts/script-build.sh"
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
grep -qE "^($user|$uid):" /etc/subuid 2>/dev/null ||
	fail "$user has no range in /etc/subuid, and rootless podman needs one; useradd assigns one when /etc/subuid exists"
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
