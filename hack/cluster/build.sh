#!/usr/bin/env bash
# Builds the Kubernetes node and control-plane binaries, kubectl, agnhost (the e2e test image's binary)
# and the CSI sidecars from the Go module proxy into $OUT/bin (default _output/k8s/bin); with --e2e also
# e2e.test, Kubernetes' end-to-end suite with its External Storage specs alone, and ginkgo's command to run
# it. Each binary is built once: a binary that exists and whose version stamp matches is kept, so a second
# run is a no-op.
#
# Kubernetes' own go.mod pins every staging module at v0.0.0 and replaces it with ./staging, so it cannot
# be built with `go install`; a throwaway consumer module requires k8s.io/kubernetes and replaces each
# staging module with its published v0.X.Y.
#
# The sidecars are built in a second throwaway module, against the libraries Kubernetes is built with:
# their own releases pin other versions of Kubernetes' libraries (csi-provisioner v6.4.0 replaces them
# with v0.36.1), and building the sidecars' own versions was about a third of a fresh machine's cluster
# build (measured with v0.33's). That module replaces each module of Kubernetes' build with the version
# Kubernetes is built with, so that every package the sidecars share with Kubernetes compiles once; the
# modules only the sidecars use come at the sidecars' versions.
set -euo pipefail

# The release is the one whose libraries crust's own modules use (v0.37), and the sidecars are the releases
# made for it, so that a fresh machine compiles the libraries the two share once (k8s_module builds
# Kubernetes with crust's versions of them). With v1.34.4 and csi-provisioner v5.3.0, whose libraries were
# older, about 650 packages (client-go, apimachinery, api, grpc, protobuf and more) compiled at both
# versions, 6.2 CPU-minutes; but v1.37 is itself a larger build, and a fresh machine's whole CI used 89.1
# CPU-minutes with it against 90.7 with v1.34.4 (measured 2026-11-29). kubelet v1.35 and later start on
# this cgroup v1 host only with failCgroupV1: false, which up.sh sets.
K8S_VERSION=${K8S_VERSION:-v1.37.2}
PROVISIONER_VERSION=${PROVISIONER_VERSION:-v6.4.0}
RESIZER_VERSION=${RESIZER_VERSION:-v2.3.0}
PROVISIONER_PKG=github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner
RESIZER_PKG=github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$(cd "$here/../.." && pwd)/_output/k8s}
BIN=$OUT/bin
SRC=$OUT/src
# GOWORK=off: these are modules of their own under _output, not members of crust's go.work.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod GOWORK=off
mkdir -p "$BIN" "$SRC"

stamp() { echo "$BIN/.$1.version"; }
fresh() { [ -x "$BIN/$1" ] && [ "$(cat "$(stamp "$1")" 2>/dev/null)" = "$2" ]; }
mark() { echo "$2" >"$(stamp "$1")"; }

# downloaded FIELD MODULE@VERSION: downloads the module and prints the path its `go mod download -json`
# names under FIELD (Dir: the source; GoMod: its go.mod).
downloaded() {
	go mod download -json "$2" | sed -n "s/.*\"$1\": \"\(.*\)\".*/\1/p"
}

# k8s_module: the directory of a throwaway consumer module that requires k8s.io/kubernetes, replaces each
# staging module it pins at v0.0.0 with its published v0.X.Y, and requires crust's version of every other
# module both require, so that where crust's is the newer, the package compiled for crust's tests serves
# Kubernetes too (made once).
k8s_module() {
	local mod=$SRC/kubernetes-$K8S_VERSION
	if [ ! -f "$mod/main.go" ]; then
		mkdir -p "$mod"
		local gomod ours
		gomod=$(downloaded GoMod "k8s.io/kubernetes@$K8S_VERSION")
		# The versions crust's workspace (go.work) builds with: "module version" lines.
		ours=$(cd "$here/../.." && env -u GOWORK GOFLAGS= go list -m -f '{{if not .Main}}{{.Path}} {{.Version}}{{end}}' all)
		{
			echo "module crust.dev/k8sbuild"
			echo
			echo "go 1.24"
			echo
			echo "require k8s.io/kubernetes $K8S_VERSION"
			echo
			# Every staging module kubernetes requires at v0.0.0, at its published version.
			grep -E '^\s+k8s\.io/\S+ v0\.0\.0$' "$gomod" | awk -v v="v0.${K8S_VERSION#v1.}" '{print "replace " $1 " => " $1 " " v}'
			# Crust's version of every other module kubernetes requires; the newer of the two wins.
			awk 'NR == FNR { ours[$1] = $2; next } /^\t/ && $2 ~ /^v/ && $2 != "v0.0.0" && ($1 in ours) { print "require " $1 " " ours[$1] }' \
				<(echo "$ours") "$gomod"
		} >"$mod/go.mod"
		printf 'package main\n\nimport _ "k8s.io/kubernetes/cmd/kubelet/app"\n\nfunc main() {}\n' >"$mod/main.go"
		# A failed tidy is not fatal (the builds, with -mod=mod, resolve what they need), but it is said.
		(cd "$mod" && go mod tidy >"$mod/tidy.log" 2>&1) ||
			echo "k8s_module: go mod tidy failed (its output: $mod/tidy.log); the builds resolve what they need themselves" >&2
	fi
	echo "$mod"
}

k8s_ldflags() {
	local minor=${K8S_VERSION#v1.}
	minor=${minor%%.*}
	echo "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
}

build_kubernetes() {
	local cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl) c need=0
	for c in "${cmds[@]}"; do fresh "$c" "$K8S_VERSION" || need=1; done
	[ "$need" = 1 ] || return 0
	echo "building Kubernetes $K8S_VERSION (about 9 minutes on 2 cores with empty caches)"
	local mod pkgs=()
	mod=$(k8s_module)
	for c in "${cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
	(cd "$mod" && go build -trimpath -ldflags "$(k8s_ldflags)" -o "$BIN/" "${pkgs[@]}")
	for c in "${cmds[@]}"; do mark "$c" "$K8S_VERSION"; done
}

# build_agnhost: Kubernetes' e2e test image's binary, from the same release, stamped with the version
# its source names (test/images/agnhost/VERSION), which is the tag e2e.test expects of the image.
build_agnhost() {
	local version
	version=$(cat "$(downloaded Dir "k8s.io/kubernetes@$K8S_VERSION")/test/images/agnhost/VERSION")
	fresh agnhost "$version" && return 0
	echo "building agnhost $version"
	(cd "$(k8s_module)" && go build -trimpath -ldflags "-s -w" -o "$BIN/agnhost" k8s.io/kubernetes/test/images/agnhost)
	mark agnhost "$version"
}

# build_e2e_test: e2e.test, Kubernetes' end-to-end suite of the release with only its External Storage
# specs, all the cluster tier runs (testdata/e2estorage_test.go, built in Kubernetes' consumer module).
# Once Kubernetes is built, the release's own e2e.test cost about 4 CPU-minutes (measured alone on 2 cores,
# 2026-11-29): 3.6 to 4.0 for the 192 packages Kubernetes' binaries do not use, 0.3 for the link; one with
# the External Storage suite alone compiles 106 of them in 1.6.
build_e2e_test() {
	local src=$here/testdata/e2estorage_test.go stamp
	stamp="$K8S_VERSION storage $(sha256sum <"$src" | cut -c1-12)"
	fresh e2e.test "$stamp" && return 0
	echo "building e2e.test $K8S_VERSION (the External Storage suite)"
	local mod
	mod=$(k8s_module)
	mkdir -p "$mod/e2estorage"
	cp "$src" "$mod/e2estorage/e2e_test.go"
	(cd "$mod" && go test -c -trimpath -ldflags "$(k8s_ldflags)" -o "$BIN/e2e.test" ./e2estorage)
	mark e2e.test "$stamp"
}

# build_ginkgo: ginkgo's command, at the version the release's e2e.test is built with, to run the suite
# on several processes (make conformance).
build_ginkgo() {
	local version
	version=$(downloaded GoMod "k8s.io/kubernetes@$K8S_VERSION" | xargs sed -n 's#^[[:space:]]*github.com/onsi/ginkgo/v2 \(v[^ ]*\).*#\1#p')
	fresh ginkgo "$version" && return 0
	echo "building ginkgo $version"
	GOWORK=off GOBIN=$BIN go install "github.com/onsi/ginkgo/v2/ginkgo@$version"
	mark ginkgo "$version"
}

# sidecar_module: the directory of a throwaway module that requires the CSI sidecars, with every module
# of Kubernetes' build (k8s_module) replaced by the version Kubernetes is built with (made once).
sidecar_module() {
	local mod=$SRC/sidecars-$K8S_VERSION-$PROVISIONER_VERSION-$RESIZER_VERSION k8s
	if [ ! -f "$mod/go.mod" ]; then
		k8s=$(k8s_module)
		rm -rf "$mod.tmp"
		mkdir -p "$mod.tmp"
		{
			printf 'module crust.dev/sidecarbuild\n\ngo 1.24\n\n'
			(cd "$k8s" && go list -m -f '{{if not .Main}}replace {{.Path}} => {{with .Replace}}{{.Path}} {{.Version}}{{else}}{{.Path}} {{.Version}}{{end}}{{end}}' all)
		} >"$mod.tmp/go.mod"
		# go get names every module it adds; only a failure's output is shown.
		if ! (cd "$mod.tmp" && go get "$PROVISIONER_PKG@$PROVISIONER_VERSION" "$RESIZER_PKG@$RESIZER_VERSION" >get.log 2>&1); then
			cat "$mod.tmp/get.log" >&2
			echo "the sidecars' module could not be made ($mod.tmp)" >&2
			return 1
		fi
		mv "$mod.tmp" "$mod"
	fi
	echo "$mod"
}

# build_sidecars: csi-provisioner and csi-resizer of their releases, in sidecar_module, in one go build
# (each linked with its own version) so that what they share compiles once.
build_sidecars() {
	fresh csi-provisioner "$PROVISIONER_VERSION" && fresh csi-resizer "$RESIZER_VERSION" && return 0
	echo "building csi-provisioner $PROVISIONER_VERSION and csi-resizer $RESIZER_VERSION with Kubernetes $K8S_VERSION's libraries"
	local mod
	mod=$(sidecar_module)
	(cd "$mod" && go build -trimpath -o "$BIN/" \
		-ldflags "$PROVISIONER_PKG=-s -w -X main.version=$PROVISIONER_VERSION" \
		-ldflags "$RESIZER_PKG=-s -w -X main.version=$RESIZER_VERSION" "$PROVISIONER_PKG" "$RESIZER_PKG")
	mark csi-provisioner "$PROVISIONER_VERSION"
	mark csi-resizer "$RESIZER_VERSION"
}

# build_tests: agnhost and, with --e2e, e2e.test and ginkgo.
build_tests() {
	build_agnhost
	if [ "$e2e" = 1 ]; then
		build_e2e_test
		build_ginkgo
	fi
}

e2e=0
[ "${1:-}" = --e2e ] && e2e=1
build_kubernetes
# What is left shares little but what Kubernetes' build compiled, so the tests' binaries and the sidecars
# are built at once: while one waits on a package or links (one core), the other has the second core.
# Both use Kubernetes' consumer module, made here first so that they do not both make it.
k8s_module >/dev/null
build_tests &
tests=$!
build_sidecars &
sidecars=$!
failed=0
wait "$tests" || failed=1
wait "$sidecars" || failed=1
[ "$failed" = 0 ] || exit 1
echo "$BIN"
