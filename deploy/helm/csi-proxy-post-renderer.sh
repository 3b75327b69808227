#!/usr/bin/env bash
# A Helm post-renderer that adds crust-csi-proxy to a CSI driver that a chart installs, with the same
# kustomize Component as a kustomization would (deploy/csi-proxy: the sidecar, its ServiceAccount, RBAC
# and ConfigMap, the controller proxy). It reads the chart's rendered manifests on stdin and writes them,
# with the proxy added, on stdout; what a driver needs, and what the flags mean, is deploy/csi-proxy/README.md.
#
#   helm install DRIVER CHART -n NS --post-renderer deploy/helm/csi-proxy-post-renderer.sh \
#     --post-renderer-args=--namespace=NS \
#     --post-renderer-args=--daemonset=NODE-DAEMONSET --post-renderer-args=--deployment=CONTROLLER \
#     --post-renderer-args=--patch=driver-socket.yaml --post-renderer-args=--patch=proxy-config.yaml
#
# --namespace=NS     the release's namespace: it is given to the objects that have none (Helm's own default),
#                    the proxy's ServiceAccount and its ClusterRoleBinding's subject among them. Required.
# --daemonset=NAME   the driver's node DaemonSet, labelled crust.dev/csi-proxy: enabled so that the Component
#                    adds the sidecar; repeatable. Not needed if the chart labels it already.
# --deployment=NAME  the driver's controller Deployment, labelled the same for the controller proxy;
#                    repeatable.
# --patch=FILE       a strategic-merge patch applied after the Component, as in a kustomization's patches:
#                    the driver's socket moved to driver.sock, the proxy's plugin-dir (README.md, 3. and
#                    4.); repeatable.
# --name-suffix=S    names the proxy's cluster-wide objects, its ClusterRole and ClusterRoleBinding,
#                    crust-csi-proxy-S instead of crust-csi-proxy, so that a second driver release with the
#                    proxy has its own (the release's name serves). Optional.
#
# It runs `kustomize build` when kustomize is on PATH, `kubectl kustomize` otherwise; CRUST_KUSTOMIZE
# names another command (it is given the directory to build). A named DaemonSet or Deployment that the
# chart does not render, and a patch that matches no object, are errors.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
component="$here/../csi-proxy"

namespace=
suffix=
objects=() # KIND/NAME to label
patches=()
for arg in "$@"; do
	case $arg in
	--namespace=*) namespace=${arg#*=} ;;
	--daemonset=*) objects+=("DaemonSet/${arg#*=}") ;;
	--deployment=*) objects+=("Deployment/${arg#*=}") ;;
	--patch=*) patches+=("${arg#*=}") ;;
	--name-suffix=*) suffix=${arg#*=} ;;
	*)
		echo "csi-proxy-post-renderer: unknown argument $arg (see the head of $0)" >&2
		exit 2
		;;
	esac
done
if [[ -n $suffix && ! $suffix =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]]; then
	echo "csi-proxy-post-renderer: --name-suffix=$suffix: want lower-case letters, digits and '-', starting and ending with a letter or digit" >&2
	exit 2
fi
if [[ -z $namespace ]]; then
	echo "csi-proxy-post-renderer: --namespace=NS is required (the release's namespace)" >&2
	exit 2
fi

if [[ -n ${CRUST_KUSTOMIZE:-} ]]; then
	read -r -a kustomize <<<"$CRUST_KUSTOMIZE"
elif command -v kustomize >/dev/null; then
	kustomize=(kustomize build)
else
	kustomize=(kubectl kustomize)
fi

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# driver/: the chart's output, with the labels that select it for the Component. A patch without a target
# names its object, so a name the chart does not render fails the build.
mkdir "$dir/driver" "$dir/csi-proxy"
cat >"$dir/driver/rendered.yaml"
{
	echo "resources: [rendered.yaml]"
	echo "patches:"
	for o in "${objects[@]}"; do # both kinds are apps/v1
		printf '  - patch: |-\n      apiVersion: apps/v1\n      kind: %s\n      metadata:\n        name: %s\n        labels:\n          crust.dev/csi-proxy: enabled\n' \
			"${o%%/*}" "${o#*/}"
	done
} >"$dir/driver/kustomization.yaml"

# The Component as it is in deploy/csi-proxy (kustomize loads only files under a kustomization's own
# directory, so it is copied beside the build rather than named by path).
cp "$component"/*.yaml "$dir/csi-proxy/"

# The top: the driver, the Component, the operator's patches, and the namespace for objects without one.
{
	echo "resources: [driver]"
	echo "components: [csi-proxy]"
	echo "patches:"
	i=0
	for p in "${patches[@]}"; do
		i=$((i + 1))
		cp "$p" "$dir/patch-$i.yaml"
		echo "  - path: patch-$i.yaml"
	done
	# The proxy's own cluster-wide objects renamed (the driver's keep their names); the binding's roleRef
	# follows its ClusterRole, as kustomize fixes name references.
	if [[ -n $suffix ]]; then
		for kind in ClusterRole ClusterRoleBinding; do
			printf '  - target: {kind: %s, name: crust-csi-proxy}\n    patch: |-\n      - {op: replace, path: /metadata/name, value: crust-csi-proxy-%s}\n' \
				"$kind" "$suffix"
		done
	fi
	cat <<EOF
transformers:
  - |-
    apiVersion: builtin
    kind: NamespaceTransformer
    metadata:
      name: release-namespace
      namespace: $namespace
    unsetOnly: true
EOF
} >"$dir/kustomization.yaml"

"${kustomize[@]}" "$dir"
