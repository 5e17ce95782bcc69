#!/usr/bin/env bash
# Builds kube-apiserver, etcd, kube-controller-manager and kubectl (module hack/tools) and yq
# (module hack/tools/yq, apart so that its dependencies pin nothing of the others) from the
# module proxy into bin/k8s/<k8s version>/, the directory envtest and `berth dev` read (kubectl
# and yq are what the dev stack gives steps of the images that carry them). A warm cache is a
# no-op: each binary is rebuilt only when missing. Cold, on 2 cores, this takes ~6 minutes and
# ~2 GB of RAM.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/hack/tools"
k8s_version=$(sed -n 's/^\s*k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$tools/go.mod")
yq_version=$(sed -n 's/^\s*github.com\/mikefarah\/yq\/v4 \(v[0-9.]*\).*$/\1/p' "$tools/yq/go.mod")
minor=$(echo "$k8s_version" | cut -d. -f2)
out="$root/bin/k8s/${k8s_version#v}"
mkdir -p "$out"
pkg=k8s.io/component-base/version
client=k8s.io/client-go/pkg/version
ldflags="-X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
ldflags="$ldflags -X $client.gitVersion=$k8s_version -X $client.gitMajor=1 -X $client.gitMinor=$minor"

# build NAME VERSION MODULE PACKAGE [LDFLAGS] builds PACKAGE in the module directory MODULE
# into $out/NAME, unless it is there.
build() {
  local name=$1 version=$2 module=$3 package=$4 flags=${5:-}
  if [ -x "$out/$name" ]; then
    return
  fi
  echo "building $name ($version) into $out" >&2
  (cd "$module" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $flags" -o "$out/$name.tmp" "$package")
  mv "$out/$name.tmp" "$out/$name"
}

for bin in etcd kube-apiserver kube-controller-manager kubectl; do
  build "$bin" "$k8s_version" "$tools" "./cmd/$bin" "$ldflags"
done
build yq "$yq_version" "$tools/yq" github.com/mikefarah/yq/v4
echo "$out"
