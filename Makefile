# berth — see README.md. `make run` brings up the local stack; `make test` runs every test.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
# The controller's stack tests (a real control plane, real sshd hosts, root) sit behind the
# stack build tag, so `go test ./internal/controller/...` alone runs only its unit tests.
TAGS ?= stack

# Packages whose tests are cheap enough to also run under the race detector.
RACE_PKGS ?= ./internal/allocation/... ./internal/controller/... ./internal/config/... ./internal/hostconfig/... ./internal/remote/... ./internal/hostops/... ./internal/dev/testground/tektonstandin/... ./internal/dev/testground/sshhosts/... ./internal/dev/testground/vmcloud/... ./internal/cloud/...

.PHONY: all build test testbin prereqs run vet fuzz bench clean generate

all: build

## VERSION: what this checkout is, from `git describe --tags --always --dirty`. The repository has
## no tag yet, so an untagged build is its short commit (2fc4508), with -dirty when tracked files
## have uncommitted changes. COMMIT is the full `git rev-parse HEAD`. Both reach the binaries
## through LDFLAGS (`berth version`, the first log line, the berth_build_info metric).
## Each is read once per make (git describe at every use could name two versions in one release).
ifeq ($(origin VERSION),undefined)
VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
endif
ifeq ($(origin COMMIT),undefined)
COMMIT := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
endif
VERSION_PKG := github.com/berth-ci/berth/internal/version
LDFLAGS := -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).commit=$(COMMIT)

## build: bin/berth, the production binary, and bin/berth-dev, berth plus dev and bench (the
## test ground, the dev stack and the local-vm provider are linked only into berth-dev)
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/berth ./cmd/berth
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/berth-dev ./cmd/berth-dev

## kubectl-berth: `kubectl berth status` — bin/kubectl-berth, a link to bin/berth (kubectl runs
## any kubectl-<name> on PATH as `kubectl <name>`): export PATH=$$PWD/bin:$$PATH
.PHONY: kubectl-berth
kubectl-berth: build
	ln -sf berth bin/kubectl-berth

## image: the image IMG with podman: a static ./cmd/berth and Debian's CA bundle, FROM scratch
## (Containerfile; nothing is pulled), tagged with the version. config/manager and config/tasks
## name its repository untagged; the release (make release) or an overlay pins it.
IMG ?= ghcr.io/berth-ci/berth:$(VERSION)
.PHONY: image
image: prereqs
	@IMG=$(IMG) LDFLAGS="$(LDFLAGS)" hack/image.sh >/dev/null
	@echo "built $(IMG)"

## release: this version's install file and image into DIST: berth-<version>.oci.tar, the image
## as an OCI archive; berth-<version>.yaml, config/release in one file with every image pinned
## as <repository>:<version>@<the archive's manifest digest> (hack/release); and
## berth-<version>-cluster-tasks.yaml, the tenants' ephemeral-cluster Tasks pinned to that image;
## berth-<version>-konflux.yaml, config/konflux (the Konflux layout) pinned likewise.
## Publish the image with `podman push $(IMG)` from the same machine (docs/install.md#release).
DIST ?= dist
.PHONY: release
release: image
	@mkdir -p $(DIST)
	@rm -f $(DIST)/berth-$(VERSION).oci.tar
	@podman save --quiet --format oci-archive --output $(DIST)/berth-$(VERSION).oci.tar $(IMG)
	@$(GO) run ./hack/release --image $(IMG) --archive $(DIST)/berth-$(VERSION).oci.tar --output $(DIST)/berth-$(VERSION).yaml --cluster-tasks-output $(DIST)/berth-$(VERSION)-cluster-tasks.yaml --konflux-output $(DIST)/berth-$(VERSION)-konflux.yaml

## generate: deep-copy code and CRDs of berth's records (api/v1alpha1 → config/crd/bases)
CONTROLLER_GEN ?= $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.20.1
generate:
	$(CONTROLLER_GEN) object paths=./api/... crd:crdVersions=v1 output:crd:artifacts:config=config/crd/bases

## testbin: build kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kubectl, yq,
## Tekton's controller and webhook, and kwok into bin/k8s/<version> (each only when missing)
testbin:
	@hack/testbin.sh >/dev/null

prereqs:
	@hack/prereqs.sh

vet:
	$(GO) vet -tags $(TAGS) ./...
	@test -z "$$(gofmt -l api cmd internal test 2>/dev/null)" || { echo "gofmt needed:"; gofmt -l api cmd internal test; exit 1; }

## test: every test, on a real control plane and real SSH hosts, among them the quick bench
## (internal/dev/bench TestQuickBench: each scenario at scale 0.05, failing only on correctness),
## whose figures are printed at the end
QUICK_BENCH_REPORT := $(CURDIR)/.berth/quick-bench.txt
## Tests that run berth or berth-dev as a program link bin/'s, built once here (BERTH_BIN_DIR).
test: prereqs testbin vet build
	@mkdir -p .berth && rm -f $(QUICK_BENCH_REPORT)
	BERTH_BIN_DIR=$(CURDIR)/bin QUICK_BENCH_REPORT=$(QUICK_BENCH_REPORT) $(GO) test -tags $(TAGS) -count=1 -timeout 30m ./...
	$(GO) test -count=1 -race $(RACE_PKGS)
	@cat $(QUICK_BENCH_REPORT)

## fuzz: each fuzz target for FUZZTIME (make test replays only their seed corpora)
FUZZTIME ?= 2m
FUZZ_TARGETS ?= ./internal/config:FuzzParse ./internal/config:FuzzSudoCommands ./internal/remote:FuzzQuote
fuzz:
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "fuzzing $$name in $$pkg for $(FUZZTIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; done

## bench: the Go benchmarks (ledger hand-over; slot freed → next waiter on the real stack), then
## the load harness on its scenarios: static, idle-cluster, large (100,000 unrelated TaskRuns,
## 10,000 tasks), dynamic (a VM per task) and dynamic-pool (shared VMs), the last two on the
## local VM cloud's real SSH hosts. BENCH_SCALE shrinks the scenarios; BENCH_ARGS passes more
## flags to `berth-dev bench` (--baseline "<other controller>", --floor, --json, --chaos N,
## --plot, --pprof, --sweep).
BENCHTIME ?= 50x
BENCH_SCALE ?= 1
BENCH_ARGS ?=
bench: prereqs testbin build
	$(GO) test -run '^$$' -bench . -benchmem ./internal/allocation/
	$(GO) test -tags $(TAGS) -run '^$$' -bench . -benchtime $(BENCHTIME) ./internal/controller/taskrun/ 2>/dev/null | grep -E '^(Benchmark|ok|FAIL)'
	bin/berth-dev bench --scenario static --scale $(BENCH_SCALE) $(BENCH_ARGS)
	bin/berth-dev bench --scenario idle-cluster --scale $(BENCH_SCALE) $(BENCH_ARGS)
	bin/berth-dev bench --scenario large --scale $(BENCH_SCALE) $(BENCH_ARGS)
	bin/berth-dev bench --scenario dynamic --scale $(BENCH_SCALE) $(BENCH_ARGS)
	bin/berth-dev bench --scenario dynamic-pool --scale $(BENCH_SCALE) $(BENCH_ARGS)

## run: the local stack (control plane, SSH hosts, Tekton stand-in) until Ctrl-C; steps of
## berth's image run bin/berth
run: prereqs testbin build
	bin/berth-dev dev $(ARGS)

clean:
	rm -rf bin/berth bin/berth-dev .berth
