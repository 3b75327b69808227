# crust — run `make help` for the targets. Every target does its own set-up on a fresh Debian machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO      ?= go
# Every Go build of the tree, its tools' included, is static and path-free, as the images' are: one build
# configuration, so that a package compiled once serves the tests, the lint, the tools, the binaries the
# tests build and the images (on a fresh machine, each other configuration compiled the dependencies again).
# GOFLAGS keeps what `go env GOFLAGS` holds already (once, when make runs make).
export CGO_ENABLED := 0
export GOFLAGS := $(strip -trimpath $(filter-out -trimpath,$(shell $(GO) env GOFLAGS)))
BIN     := $(CURDIR)/bin
OUT     := $(CURDIR)/_output
# The tools have go.mod files of their own, which -modfile names; workspace mode (go.work) refuses -modfile.
BUF     := GOWORK=off $(GO) tool -modfile=$(CURDIR)/tools/buf/go.mod buf
LINT    := GOWORK=off $(GO) tool -modfile=$(CURDIR)/tools/lint/go.mod golangci-lint
PROMTOOL := GOWORK=off GOFLAGS="$(GOFLAGS) -tags=remove_all_sd" $(GO) tool -modfile=$(CURDIR)/tools/promtool/go.mod promtool
# The Go modules, tied by go.work: the API module integrators import, crust, the two reference
# implementations, and the tests.
MODULES := api . examples/lvm-csi examples/microvm test
# Every package of every module, as go.work lets one command name them from the root.
ALLPKGS := ./... $(patsubst %,./%/...,$(filter-out .,$(MODULES)))
# -vet=off: make lint's govet runs every analyzer go test's vet step does, and CI runs it. With an empty
# build cache that step costs about 1.7 CPU-minutes for the root module alone, as it first analyses every
# package each test imports, the dependencies' included.
GOTEST  ?= $(GO) test -count=1 -timeout 40m -vet=off
GUEST   := $(OUT)/guest
# The one version of crust: the file VERSION, which deploy/'s image tags and the chart name (a test,
# hack/release, holds them and this Makefile to it); vX.Y.Z for a release, vX.Y.Z-dev between releases.
# The binaries are stamped with it into api/version (an unstamped build says "devel" and its VCS
# revision), a -dev version with the commit after a "+" (v0.2.0-dev+a8400b2, "-dirty" with changes), so
# that two builds between releases tell apart. Override with `make build VERSION=v0.2.0`.
VERSION ?= $(strip $(file <$(CURDIR)/VERSION))
BUILD_VERSION ?= $(if $(findstring -dev,$(VERSION)),$(VERSION)+$(shell git describe --always --dirty 2>/dev/null || echo unknown),$(VERSION))
GOLDFLAGS := -X crust.dev/crust/api/version.version=$(BUILD_VERSION)
# The VM tests find the guest kernel and initramfs here.
export CRUST_GUEST_ASSETS := $(GUEST)
# Debian packages the tests and the demo use (installed only when missing); the second line is the
# real-cluster tier's: etcd, containerd, runc and the CNI plugins run the test node. A program a test runs
# comes from one of these, from a package of Debian's priority required or important, or from what runs
# make test at all (git, make, Go); hack/guest/fetch-kernel.sh installs the few it needs itself. file
# (ctrdtest) and iptables (the cluster tier's leftovers check) are named, not left to come with others.
DEB_PKGS := e2fsprogs xfsprogs btrfs-progs lvm2 util-linux kmod cpio busybox-static qemu-system-x86 fio cryptsetup-bin file \
	etcd-server containerd runc containernetworking-plugins openssl bc curl iproute2 iptables

.PHONY: version
version: ## Print the version (the file VERSION) and, on a second line, the one the binaries are stamped with
	@echo $(VERSION)
	@echo $(BUILD_VERSION)

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps
deps: ## Install the Debian packages the tests need (as root; skipped when present), and download every module an integrator's go mod tidy of the API module reads
	@# A containerd or runc that did not come from Debian (containerd.io, a release tarball) is used as it
	@# is: installing Debian's package would replace or shadow it.
	@missing=$$(for p in $(DEB_PKGS); do \
		case $$p in containerd|runc) command -v $$p >/dev/null && continue;; esac; \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@# Every module an integrator's `go mod tidy` reads for a module that imports the API module, at the
	@# versions the API module names (lower than the workspace's), for test/api, which tidies and builds
	@# such a driver module with the module proxy turned off. A tidy reads more than a build: the modules of
	@# the tests of dependencies too (grpc's tests import OpenTelemetry and gonum), which `go mod download`
	@# leaves out. `go mod tidy -diff` reads them all and writes nothing; it fails when the API module's
	@# go.mod or go.sum is not tidy, as a published module's must be.
	@cd api && GOWORK=off $(GO) mod tidy -diff >/dev/null || { \
		echo "make deps: the API module is not tidy (its diff: cd api && GOWORK=off go mod tidy -diff); run cd api && GOWORK=off go mod tidy" >&2; exit 1; }

.PHONY: build
build: ## Build every binary of every module into bin/
	$(GO) build -ldflags "$(GOLDFLAGS)" -o $(BIN)/ ./cmd/... ./examples/lvm-csi/cmd/... ./examples/microvm/cmd/... ./test/cluster/cmd/...

# The repository and tag of crust's images, as deploy/ names them (crustd's DaemonSet is the reference).
IMAGE_REPO ?= $(shell sed -n 's|^ *image: *\(.*\)/crustd:.*|\1|p' deploy/crustd/daemonset.yaml)
IMAGE_TAG  ?= $(shell sed -n 's|^ *image: *.*/crustd:\(.*\)|\1|p' deploy/crustd/daemonset.yaml)

.PHONY: images
images: ## Build crust's own images (crustd, the CSI proxy, the reference driver) as deploy/ names them, into _output/images; builds no Kubernetes
	$(GO) run ./hack/images -out $(OUT)/images -repo $(IMAGE_REPO) -tag $(IMAGE_TAG) -version $(BUILD_VERSION) \
		crustd crust-csi-proxy crust-lvm-csi

# What `make release` writes, and for which platforms. The proxy's and the example driver's images carry
# mount tools: this machine's for its own architecture, and for the other one those of Debian's packages
# for it (RELEASE_DEBS and what they depend on), unpacked into a sysroot (hack/images/sysroot.sh).
RELEASE_DIR := $(OUT)/release
RELEASE_PLATFORMS := linux/amd64,linux/arm64
RELEASE_FOREIGN = $(filter-out $(shell $(GO) env GOARCH),amd64 arm64)
RELEASE_SYSROOT = $(OUT)/sysroot-$(RELEASE_FOREIGN)
RELEASE_DEBS := mount util-linux e2fsprogs xfsprogs lvm2

.PHONY: release
release: ## Write the release of VERSION into _output/release: image index archives for amd64 and arm64, the packaged chart, an SBOM and SHA256SUMS; not part of make test
	@# A release version (no -dev) is stamped without the commit, so it must be built from a clean tree.
	@case "$(VERSION)" in *-dev*) ;; *) git diff --quiet HEAD -- || { echo "release $(VERSION): the tree has uncommitted changes; commit them or use a -dev VERSION" >&2; exit 1; } ;; esac
	rm -rf $(RELEASE_DIR)
	hack/images/sysroot.sh $(RELEASE_FOREIGN) $(RELEASE_SYSROOT) $(RELEASE_DEBS)
	$(GO) run ./hack/images -out $(RELEASE_DIR) -repo $(IMAGE_REPO) -tag $(VERSION) -version $(BUILD_VERSION) \
		-platforms $(RELEASE_PLATFORMS) -sysroot $(RELEASE_FOREIGN)=$(RELEASE_SYSROOT) crustd crust-csi-proxy crust-lvm-csi
	cd deploy/helm && GOWORK=off $(GO) run ./cmd/chart-package -out $(RELEASE_DIR) -version $(patsubst v%,%,$(VERSION)) crust
	$(GO) run ./hack/release -dir $(RELEASE_DIR) -packages $(RELEASE_FOREIGN)=$(RELEASE_SYSROOT).apt/files.list
	cd $(RELEASE_DIR) && sha256sum -c --quiet SHA256SUMS && ls -l

.PHONY: test-images
test-images: ## Build every image the cluster tier runs: crust's, the test registrar, the CSI sidecars (Kubernetes built from source), busybox, pause, the storage e2e suite's; and e2e.test
	hack/cluster/build.sh --e2e
	$(GO) run ./hack/images -out $(OUT)/images -k8s-bin $(OUT)/k8s/bin -version $(BUILD_VERSION)

.PHONY: cluster-up
cluster-up: deps test-images guest ## Start a real single-node Kubernetes with crust deployed from deploy/ and crust-microvm as a containerd runtime; prints the kubeconfig's path
	hack/cluster/up.sh

.PHONY: cluster-down
cluster-down: ## Remove everything cluster-up made: processes, mounts, loop devices, the bridge, cgroups, sysctls
	hack/cluster/down.sh

.PHONY: guest
guest: deps ## Fetch the guest kernel (Debian's cloud kernel) and build the guest initramfs, cached in _output/guest
	hack/guest/fetch-kernel.sh $(GUEST)
	CGO_ENABLED=0 $(GO) build -ldflags "$(GOLDFLAGS)" -o $(GUEST)/crust-guest ./examples/microvm/cmd/crust-guest
	$(GO) run ./examples/microvm/hack/mkinitramfs -assets $(GUEST) -flavour cloud -agent $(GUEST)/crust-guest

.PHONY: generate
generate: ## Regenerate the Go code from proto/ (buf, pinned local plugins)
	$(BUF) generate
	$(BUF) generate --template buf.gen.agent.yaml

# check-generated generates into a temporary directory: checking never rewrites the tree it checks.
.PHONY: check-generated
check-generated: ## Fail when the committed generated code differs from a fresh generation; changes nothing
	@BUF='$(BUF)' hack/check-generated.sh api/crust examples/microvm/agentproto/agentv1

# The API as the previous release shipped it (api/releases/VERSION.binpb: its buf image), which make lint holds the
# API to with buf breaking; a release adds its own there.
API_PREVIOUS := v0.1.0

.PHONY: lint
lint: ## buf lint, format and breaking (against the previous release), and golangci-lint of every module (its govet runs every analyzer go vet runs)
	$(BUF) lint
	$(BUF) format --diff --exit-code
	$(BUF) breaking api/proto --against api/releases/$(API_PREVIOUS).binpb
	@set -e; for m in $(MODULES); do echo "== lint $$m"; (cd $$m && $(LINT) run ./...); done
	@echo "== lint deploy/helm"; cd deploy/helm && GOWORK=off $(LINT) run ./...

.PHONY: promtool
promtool: ## Build promtool (pinned in tools/promtool), which test-rules runs
	$(PROMTOOL) --version >/dev/null

.PHONY: test-rules
test-rules: ## promtool test rules on the shipped alerts (deploy/monitoring)
	@mkdir -p _output/monitoring
	$(GO) run ./hack/promrules deploy/monitoring/prometheusrule.yaml _output/monitoring/rules.yaml
	cp deploy/monitoring/rules.test.yaml _output/monitoring/
	$(PROMTOOL) check rules _output/monitoring/rules.yaml
	$(PROMTOOL) test rules _output/monitoring/rules.test.yaml

# deploy/helm is a Go module of its own, outside go.work, so that Helm's and kustomize's dependencies stay
# out of crust's module (it also pins a helm command: deploy/helm/README.md).
.PHONY: test-helm
test-helm: ## The Helm chart (deploy/helm) renders what deploy/ does, and its post-renderers (Helm 3's and Helm 4's plugin) what kubectl crust inject does; seconds once built
	cd deploy/helm && GOWORK=off $(GOTEST) ./...

.PHONY: test
test: deps ## Run every test tier (unit, root on loop devices, e2e, csi-sanity, the real cluster), the alert rules' tests and the Helm chart's; does its own set-up
	@# One package at a time: the VM, LVM and csi-sanity tiers each want both cores, and csi-sanity's
	@# per-call deadlines are not made for a machine shared with a booting guest. What the cluster tier
	@# and test-rules need is built meanwhile in the background, at the lowest priority, from before the
	@# build, guest and test-helm targets run (hack/test.sh).
	@GO="$(GO)" GOTEST="$(GOTEST)" MODULES="$(MODULES)" hack/test.sh

# The test tiers. `make test` runs them all at once (one `go test ./...`); each also runs alone. A tier is
# a set of packages, and the unit tier is every package but the tier packages, run where no test can be
# root: its test binaries run in a new user namespace as uid and gid 1000 (unshare --map-user), so every
# test that needs root (loop devices, LVM, mkfs, mounts, QEMU) skips itself, as on a developer's machine.
TIER_E2E     := ./test/e2e ./examples/microvm/vm
TIER_SANITY  := ./test/csisanity ./test/csiproxy
TIER_CLUSTER := ./test/cluster
TIER_PKGS     = $$($(GO) list $(ALLPKGS) | grep -v -E '/test/(e2e|csisanity|csiproxy|cluster|bench)$$|/examples/microvm/vm$$')

.PHONY: test-unit
test-unit: ## Unit tier: no root, no VM, no loop devices (test binaries run unprivileged); under a minute
	$(GOTEST) -short -exec 'unshare --map-user=1000 --map-group=1000' $(TIER_PKGS)

.PHONY: test-root
test-root: deps ## Root tier: the unit tier's packages as root, with loop devices, LVM, mkfs and mounts
	$(GOTEST) -p 1 $(TIER_PKGS)

.PHONY: test-e2e
test-e2e: deps guest ## E2E tier: the real binaries, and QEMU guests booted from _output/guest (root)
	$(GOTEST) -p 1 $(TIER_E2E)

# containerd 2.x, built from the Go module proxy (Debian 12 ships 1.6), for the shim's e2e tests: the task
# API v2 the shim speaks is what containerd 1.6, 1.7 and 2.x all take. CI runs the shim against Debian's.
CONTAINERD2_VERSION ?= v2.2.9
CONTAINERD2 := $(OUT)/containerd2

.PHONY: test-containerd2
test-containerd2: deps guest ## The microVM shim's e2e tests against containerd 2.x (CONTAINERD2_VERSION, built once into _output/containerd2; root; not in CI)
	GOBIN=$(CONTAINERD2) $(GO) install github.com/containerd/containerd/v2/cmd/containerd@$(CONTAINERD2_VERSION) github.com/containerd/containerd/v2/cmd/ctr@$(CONTAINERD2_VERSION)
	CRUST_CONTAINERD_DIR=$(CONTAINERD2) $(GOTEST) -p 1 -v -run '^TestMicroVMShim' ./test/e2e

.PHONY: test-sanity
test-sanity: deps ## csi-sanity tier: the reference driver, crustd and the CSI proxy under csi-sanity (root)
	$(GOTEST) -p 1 $(TIER_SANITY)

.PHONY: test-cluster
test-cluster: ## Cluster tier: a real single-node Kubernetes with crust deployed by make cluster-up (root; takes the machine)
	$(GOTEST) -p 1 $(TIER_CLUSTER)

.PHONY: conformance
conformance: deps ## Kubernetes' storage e2e suite, every External Storage spec of e2e.test, against the example driver behind the proxy on ext4 and xfs, on three ginkgo processes (root; takes the machine; the cluster tier runs CI's subset)
	CRUST_CONFORMANCE=all $(GOTEST) -p 1 -timeout 5h -v -run '^TestExternalStorage$$' $(TIER_CLUSTER)

# Ops per VM benchmark (test/bench): each op takes seconds under TCG, so they run a fixed count (5 keeps
# make bench within 15 minutes on 2 cores; the data path's round alone takes about a minute).
BENCH_OPS ?= 5
# Rounds per control-path benchmark (test/bench/control): each round measures crust and its floor side by side.
BENCH_ROUNDS ?= 9

# The control suite runs first: its ext4 figures compare fsyncs, and the other suites leave that disk busy
# with their own writes for a while (pair-vs-durable-floor read 3.0 after the unit benchmarks, 2.0 alone).
.PHONY: bench
bench: deps build guest ## Run the benchmarks into bench/results/*.json and print one table of every figure with its target; BENCH_OPS=N ops per VM benchmark
	hack/guest/fetch-kernel.sh --with-9p $(GUEST)
	$(GO) run ./examples/microvm/hack/mkinitramfs -assets $(GUEST) -flavour generic -agent $(GUEST)/crust-guest
	mkdir -p bench/results
	CRUST_BENCH_RESULTS=$(CURDIR)/bench/results $(GOTEST) -run='^$$' -bench=. -benchtime=$(BENCH_ROUNDS)x ./test/bench/control
	CRUST_BENCH_RESULTS=$(CURDIR)/bench/results $(GOTEST) -run='^$$' -bench=. -benchtime=$(BENCH_OPS)x ./test/bench
	CRUST_BENCH_RESULTS=$(CURDIR)/bench/results $(GOTEST) -run='^$$' -bench=. -benchmem $$($(GO) list $(ALLPKGS) | grep -v 'crust.dev/crust/test/')
	$(GO) run ./hack/benchtable bench/results

.PHONY: bench-table
bench-table: ## Print the table of the last make bench's figures (bench/results)
	$(GO) run ./hack/benchtable bench/results

.PHONY: bench-plot
bench-plot: ## Draw the data-path figures of the last make bench into docs/performance-datapath.svg
	$(GO) run ./hack/benchtable -plot datapath/ bench/results > docs/performance-datapath.svg

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 10s)
	@for pkg in $$($(GO) list $(ALLPKGS)); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			echo "== $$pkg $$f"; $(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$${FUZZTIME:-10s} $$pkg || exit 1; \
		done; \
	done

.PHONY: demo
demo: deps build guest ## Run the demo: a volume staged, mounted in a real microVM, measured and grown (root)
	BIN=$(BIN) bash hack/demo.sh

.PHONY: ci-fresh
ci-fresh: ## Run .ci/run as on a new machine: a clean clone of HEAD with empty Go module and build caches, GOPATH and Go settings; says how long it took. Debian's packages stay this machine's; not in CI (it downloads and compiles everything again)
	@hack/ci-fresh.sh

.PHONY: clean
clean: ## Remove build output
	rm -rf $(BIN) $(OUT)

.PHONY: diagrams
diagrams: ## Render docs/architecture.svg from docs/architecture.dot (Graphviz, installed when missing)
	@command -v dot >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends graphviz >/dev/null; }
	dot -Tsvg docs/architecture.dot -o docs/architecture.svg
