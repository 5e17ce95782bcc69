#!/usr/bin/env bash
# Builds berth's image $IMG with podman from the Containerfile: a static binary of ./cmd/berth
# (CGO_ENABLED=0, built with the local Go for GOARCH, default this machine's) and Debian's CA
# bundle, in an image FROM scratch. Nothing is pulled. The build context is a temporary
# directory holding just those two files, not the checkout (bin/ alone holds hundreds of MB).
# LDFLAGS, when set, is added to the Go linker's flags (make image passes the -X flags that
# stamp berth's version and commit: see the Makefile).
# Progress goes to stderr; stdout gets the image's ID, and only that.
set -euo pipefail
: "${IMG:?set IMG to the name of the image, e.g. IMG=ghcr.io/berth-ci/berth:2fc4508 (make image tags the version)}"
root=$(cd "$(dirname "$0")/.." && pwd)
ca=/etc/ssl/certs/ca-certificates.crt
missing=()
[ -f "$ca" ] || missing+=(ca-certificates)
command -v podman >/dev/null || missing+=(podman)
if [ ${#missing[@]} -gt 0 ]; then
  echo "error: missing ${missing[*]}: run make prereqs as root, or apt-get install ${missing[*]}" >&2
  exit 1
fi
arch=$(cd "$root" && go env GOARCH)
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
echo "building berth (linux/$arch, static)" >&2
(cd "$root" && CGO_ENABLED=0 GOOS=linux GOARCH="$arch" go build -trimpath -ldflags "-s -w ${LDFLAGS:-}" -o "$context/berth" ./cmd/berth)
cp "$ca" "$context/ca-certificates.crt"
echo "building image $IMG" >&2
# --layers=false: no intermediate images to pile up, as each build copies a new binary anyway.
podman build --pull=never --layers=false --os linux --arch "$arch" --file "$root/Containerfile" \
  --iidfile "$context/iid" --tag "$IMG" "$context" >&2
cat "$context/iid"
echo
