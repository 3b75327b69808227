#!/usr/bin/env bash
# make ci-fresh: run .ci/run as CI runs it on a new machine, and say how long it took.
#
# CI runs `bash .ci/run` in a clean clone of main, with shared/ copied beside it, as root, with CI=true and
# no standard input. On a machine that ran the project before, Go's module and build caches, tools that
# `go install` left in GOPATH/bin and settings that `go env -w` wrote all hide a step that only a new
# machine misses. Here the clone gets Go caches, a GOPATH, an XDG cache directory (golangci-lint's and
# buf's caches) and a Go environment file of its own, all new and empty, and no GO*, CGO_*, CRUST_* or
# make variable of the caller's. Everything is removed afterwards; the logs are kept in
# _output/ci-fresh/.
#
# What it cannot make new: Debian's packages. Whatever this machine has installed stays installed, so a
# package that a test uses and `make deps` does not install is not found missing here.
#
# Environment: REV (default HEAD) is the commit to run; KEEP=1 keeps the clone and its caches.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=hack/cluster/lib.sh
. "$ROOT/hack/cluster/lib.sh"
REV=$(git -C "$ROOT" rev-parse --verify "${REV:-HEAD}^{commit}")

# The cluster tier takes fixed ports, a bridge and a volume group: one cluster at a time on a machine.
if ip link show "$BRIDGE" >/dev/null 2>&1 || [ -d "$RUN" ]; then
	echo "ci-fresh: a test cluster is up (bridge $BRIDGE or $RUN exists); run make cluster-down first" >&2
	exit 1
fi
if ss -Hltn "sport = :$ETCD_PORT" | grep -q .; then
	echo "ci-fresh: port $ETCD_PORT, the test cluster's etcd's, is taken: is another test cluster or CI run up?" >&2
	exit 1
fi
if ! git -C "$ROOT" diff --quiet HEAD --; then
	echo "ci-fresh: note: uncommitted changes are not part of the run; it runs commit $(git -C "$ROOT" rev-parse --short "$REV")" >&2
fi

dir=$(mktemp -d /var/tmp/crust-ci-fresh.XXXXXX)
logs=$ROOT/_output/ci-fresh
mkdir -p "$logs"
cleanup() {
	local rc=$?
	# A cluster the run left up holds mounts under the clone: take it down before anything is removed.
	if [ -d "$dir/main/_output/k8s/run" ]; then
		(cd "$dir/main" && env -u MAKEFLAGS -u MAKELEVEL make --no-print-directory cluster-down) || true
	fi
	cp "$dir"/main/_output/*.log "$logs/" 2>/dev/null || true
	if [ "${KEEP:-}" = 1 ]; then
		echo "ci-fresh: kept $dir" >&2
	else
		# The module cache is written read-only.
		chmod -R u+w "$dir" 2>/dev/null || true
		rm -rf --one-file-system "$dir"
	fi
	exit "$rc"
}
trap cleanup EXIT

git clone -q --no-checkout "$ROOT" "$dir/main"
git -C "$dir/main" checkout -q -B main "$REV"
cp -r "$ROOT/../shared" "$dir/shared" 2>/dev/null && chmod -R a-w "$dir/shared" ||
	echo "ci-fresh: no ../shared beside the checkout; tests that read it will skip or fail" >&2
mkdir -p "$dir/gopath" "$dir/gocache" "$dir/xdg-cache" "$dir/xdg-config"
: >"$dir/goenv"

# The caller's environment, less Go's, make's and crust's variables and with this machine's GOPATH/bin
# off PATH; then the new caches.
unset_vars=$(compgen -e | grep -E '^(GO|CGO_|CRUST_|MAKE|MFLAGS)' || true)
path=$(tr : '\n' <<<"$PATH" | grep -v -x -F "$(go env GOPATH)/bin" | paste -sd:)
echo "ci-fresh: .ci/run on $(git -C "$ROOT" rev-parse --short "$REV") in $dir, with empty Go caches (Debian's packages are this machine's)"
start=$(date +%s)
rc=0
# shellcheck disable=SC2086 # one word per variable
(cd "$dir/main" && env $(printf -- '-u %s ' $unset_vars) PATH="$dir/gopath/bin:$path" CI=true \
	GOENV="$dir/goenv" GOPATH="$dir/gopath" GOMODCACHE="$dir/gopath/pkg/mod" GOCACHE="$dir/gocache" \
	XDG_CACHE_HOME="$dir/xdg-cache" XDG_CONFIG_HOME="$dir/xdg-config" \
	bash .ci/run </dev/null) || rc=$?
secs=$(($(date +%s) - start))
verdict=passed
[ "$rc" = 0 ] || verdict="failed (exit $rc)"
echo "ci-fresh: .ci/run $verdict in $((secs / 60)) min $((secs % 60)) s on a new Go environment (CI's bound: 90 min; a new machine's budget: 60)" | tee "$logs/result"
exit "$rc"
