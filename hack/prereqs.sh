#!/usr/bin/env bash
# Installs what berth's tests and dev stack need beyond Go: OpenSSH's server (the real sshd of
# the test hosts), sudo (hosts grant exact sudo rights), iproute2 and util-linux (network and
# mount namespaces), and for remote builds as the buildah-remote Tasks make them: rsync (both
# ends), jq and buildah (what a build task's steps call in the Tekton stand-in, as their image
# would have it; the stand-in brings its own /usr/bin/retry), curl (what the Tasks redeem their
# one-time key with), and uidmap (the test hosts' podman stand-in builds real images with
# buildah, rootless), and for berth's own image (make image, test/deploy): podman, runc
# (Debian's podman defaults to crun, which cannot run a container on a host with cgroups v1 and
# v2 mounted side by side) and ca-certificates (the CA bundle the image carries). As root it
# installs what is missing with apt; otherwise it says what is missing. With CI=true anything
# still missing is an error, so CI never skips those tests.
set -euo pipefail
need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v sudo >/dev/null || need+=(sudo)
command -v ip >/dev/null || need+=(iproute2)
command -v unshare >/dev/null || need+=(util-linux)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
command -v rsync >/dev/null || need+=(rsync)
command -v jq >/dev/null || need+=(jq)
[ -x /usr/bin/curl ] || need+=(curl)
command -v buildah >/dev/null || need+=(buildah)
command -v newuidmap >/dev/null || need+=(uidmap)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
[ -f /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  exit 0
fi
msg="missing ${need[*]}: install them (apt-get install ${need[*]}) or run make as root"
if [ "${CI:-}" = true ]; then
  echo "error: $msg" >&2
  exit 1
fi
echo "warning: $msg; tests that need real SSH hosts will be skipped" >&2
