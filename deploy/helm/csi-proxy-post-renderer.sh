#!/bin/sh
# A Helm 3 post-renderer that adds crust-csi-proxy to a CSI driver a chart installs: `kubectl crust
# inject` on the chart's output (crust-inject/inject.sh; Helm 4 takes that directory as a plugin instead).
#
#   helm install DRIVER CHART -n NS --post-renderer deploy/helm/csi-proxy-post-renderer.sh \
#     --post-renderer-args=--namespace=NS
exec "$(dirname "$(readlink -f "$0")")/crust-inject/inject.sh" "$@"
