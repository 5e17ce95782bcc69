#!/usr/bin/env bash
# Builds kube-apiserver, etcd, kube-controller-manager, kube-scheduler and kubectl (module
# hack/tools), yq (module hack/tools/yq), Tekton Pipelines' controller and webhook (module
# hack/tools/tekton), kwok (module hack/tools/kwok) and Prometheus with promtool (module
# hack/tools/prometheus) from the module proxy into
# bin/k8s/<k8s version>/, the directory envtest and `berth dev` read. Each of the last three is a
# module of its own, so that its dependencies pin nothing of the others. kubectl and yq are what
# the dev stack gives steps of the images that carry them; kube-scheduler, Tekton and kwok are the
# real Tekton of the test ground (internal/dev/testground/realtekton). It also downloads the Go
# modules of cert-manager and the Prometheus Operator, whose CRDs the deploy test installs
# (hack/crd-modules.txt). A warm cache is a no-op:
# each binary is rebuilt only when missing. Cold, on 2 cores, this takes ~32 minutes (Tekton's
# two about 8 of them, Prometheus and promtool about 14, kwok about 3) and ~2 GB of RAM.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/hack/tools"
k8s_version=$(sed -n 's/^\s*k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$tools/go.mod")
yq_version=$(sed -n 's/^\s*github.com\/mikefarah\/yq\/v4 \(v[0-9.]*\).*$/\1/p' "$tools/yq/go.mod")
tekton_version=$(sed -n 's/^\s*github.com\/tektoncd\/pipeline \(v[0-9.]*\).*$/\1/p' "$tools/tekton/go.mod")
kwok_version=$(sed -n 's/^\s*sigs.k8s.io\/kwok \(v[0-9.]*\).*$/\1/p' "$tools/kwok/go.mod")
prometheus_version=$(sed -n 's/^\s*github.com\/prometheus\/prometheus \(v[0-9.]*\).*$/\1/p' "$tools/prometheus/go.mod")
minor=$(echo "$k8s_version" | cut -d. -f2)
out="$root/bin/k8s/${k8s_version#v}"
mkdir -p "$out"
pkg=k8s.io/component-base/version
client=k8s.io/client-go/pkg/version
ldflags="-X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
ldflags="$ldflags -X $client.gitVersion=$k8s_version -X $client.gitMajor=1 -X $client.gitMinor=$minor"

# build NAME VERSION MODULE PACKAGE [LDFLAGS] builds PACKAGE in the module directory MODULE
# into $out/NAME, statically, unless it is there. BUILD_ENV, when set, replaces the static
# build's environment and flags (see Prometheus below).
build() {
  local name=$1 version=$2 module=$3 package=$4 flags=${5:-}
  if [ -x "$out/$name" ]; then
    return
  fi
  echo "building $name ($version) into $out" >&2
  if [ -n "${BUILD_ENV:-}" ]; then
    (cd "$module" && go build -ldflags "-s -w $flags" -o "$out/$name.tmp" "$package")
  else
    (cd "$module" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $flags" -o "$out/$name.tmp" "$package")
  fi
  mv "$out/$name.tmp" "$out/$name"
}

for bin in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  build "$bin" "$k8s_version" "$tools" "./cmd/$bin" "$ldflags"
done
build yq "$yq_version" "$tools/yq" github.com/mikefarah/yq/v4
build tekton-controller "$tekton_version" "$tools/tekton" github.com/tektoncd/pipeline/cmd/controller
build tekton-webhook "$tekton_version" "$tools/tekton" github.com/tektoncd/pipeline/cmd/webhook
build kwok "$kwok_version" "$tools/kwok" sigs.k8s.io/kwok/cmd/kwok
# Prometheus' module is v0.x for Go's sake; v0.308 is Prometheus 3.8. Its web UI's assets are not
# in the module (the tests use only its HTTP API). They run only on the machine that builds
# them, so they are built with go's defaults, not statically.
BUILD_ENV=default build prometheus "$prometheus_version" "$tools/prometheus" github.com/prometheus/prometheus/cmd/prometheus
BUILD_ENV=default build promtool "$prometheus_version" "$tools/prometheus" github.com/prometheus/prometheus/cmd/promtool

# The modules whose CRDs the deploy test installs before the release file (hack/crd-modules.txt):
# only downloaded into the module cache, where the test finds them with go mod download -json.
while read -r module _; do
  case "$module" in '' | '#'*) continue ;; esac
  (cd "$root" && go mod download "$module")
done <"$root/hack/crd-modules.txt"
echo "$out"
