#!/usr/bin/env bash
# make test once the Debian packages are there: crust's binaries, the guest and the Helm chart's test,
# then every package of every module, one package at a time, the cluster tier last, then the alert rules'
# tests. Called by the Makefile, which passes GO, GOTEST and MODULES.
#
# On a fresh machine the cluster tier's Kubernetes, sidecars and images, and promtool, are tens of
# CPU-minutes of compiling, while the rest leaves a core idle much of the time (downloads, one package at
# a time compiles one package at a time, a TCG guest keeps one core busy (the e2e tier's kill test runs
# two at once), and the cluster tier mostly waits on Kubernetes). So they are built in the background from
# the start, before crust's own builds, at the lowest CPU priorities, and the cluster tier and the alert
# rules' tests wait for them. The priorities hold because the builds stay in this session (a new session
# would get a scheduler group of its own). When everything is built already (a second run), the background
# jobs find nothing to do.
set -euo pipefail
: "${GO:?}" "${GOTEST:?}" "${MODULES:?}"
# Not named OUT: the scripts make test-images runs read OUT from the environment as their own.
logs=$(cd "$(dirname "$0")/.." && pwd)/_output
mkdir -p "$logs"
log=$logs/test-prebuild.log

# promtool is needed last, so it runs under SCHED_IDLE, below the cluster tier's build. The images (make
# test-images) need the Debian packages, which the Makefile installed before this.
# shellcheck source=hack/background.sh
. "$(dirname "$0")/background.sh"
bg_start "building the cluster tier's binaries and images" "$log" nice -n 19 "${MAKE:-make}" --no-print-directory test-images
bg_start "building promtool" "$logs/test-promtool.log" chrt --idle 0 "${MAKE:-make}" --no-print-directory promtool

"${MAKE:-make}" --no-print-directory build guest test-helm

for m in $MODULES; do
	echo "== test $m"
	# shellcheck disable=SC2046 # one word per package
	(cd "$m" && $GOTEST -p 1 $($GO list ./... | grep -v '/test/cluster$'))
done

echo "== waiting for the cluster tier's binaries and images (built in the background: $log)"
bg_wait "building the cluster tier's binaries and images"
echo "== test test/cluster"
# A test binary that ends without TestMain's teardown (go test's timeout panics) would leave the node
# running, and its ports would stop the next run on this machine: whatever it left is taken down.
if ! (cd test && $GOTEST -p 1 ./cluster); then
	"${MAKE:-make}" --no-print-directory cluster-down || true
	exit 1
fi
bg_wait "building promtool"
"${MAKE:-make}" --no-print-directory test-rules
