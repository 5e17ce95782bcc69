#!/usr/bin/env bash
# Builds kube-apiserver, etcd, kube-controller-manager and kubectl from the module proxy into
# bin/k8s/<k8s version>/, the directory envtest and `berth dev` read (kubectl is what the Tekton
# stand-in gives steps of the kubectl image). A warm cache is a no-op:
# each binary is rebuilt only when missing. Cold, on 2 cores, this takes ~6 minutes and ~2 GB
# of RAM.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/hack/tools"
k8s_version=$(sed -n 's/^\s*k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$tools/go.mod")
minor=$(echo "$k8s_version" | cut -d. -f2)
out="$root/bin/k8s/${k8s_version#v}"
mkdir -p "$out"
pkg=k8s.io/component-base/version
client=k8s.io/client-go/pkg/version
ldflags="-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
ldflags="$ldflags -X $client.gitVersion=$k8s_version -X $client.gitMajor=1 -X $client.gitMinor=$minor"
for bin in etcd kube-apiserver kube-controller-manager kubectl; do
  if [ -x "$out/$bin" ]; then
    continue
  fi
  echo "building $bin ($k8s_version) into $out" >&2
  (cd "$tools" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/$bin.tmp" "./cmd/$bin")
  mv "$out/$bin.tmp" "$out/$bin"
done
echo "$out"
