#!/bin/sh
# `kubectl crust inject` as a Helm post-renderer: the chart's rendered manifests on stdin, the same with
# crust-csi-proxy added on stdout. Its arguments are inject's (kubectl-crust inject --help), of which a
# release needs one: --namespace=NS, the release's namespace, given to the objects that name none.
# CRUST_INJECT names the kubectl-crust binary when it is not on PATH.
set -eu
bin=${CRUST_INJECT:-kubectl-crust}
if ! command -v "$bin" >/dev/null 2>&1; then
	echo "crust-inject: $bin not found: put kubectl-crust on PATH (make build; cp bin/kubectl-crust /usr/local/bin/) or name it in CRUST_INJECT" >&2
	exit 127
fi
exec "$bin" inject "$@"
