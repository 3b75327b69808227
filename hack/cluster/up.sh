#!/usr/bin/env bash
# Starts a real single-node Kubernetes cluster on this machine, from packages and the binaries
# hack/cluster/build.sh made: etcd, containerd, runc and the CNI plugins from Debian; kube-apiserver,
# kube-controller-manager, kube-scheduler and kubelet from k8s.io/kubernetes. Everything listens on
# loopback addresses (lib.sh: the API server on the kubernetes Service's 127.100.0.1:443, the rest on
# 127.0.0.1, ports overridable) and lives under $RUN. It imports the images `make test-images` built
# into containerd, applies deploy/ with `kubectl apply -k` through an overlay that changes only image
# names, and the example driver's two shapes (deploy/examples, deploy/examples/lvm-statefulset) through the
# same overlay and `kubectl crust inject`, and exits 0 once the node is Ready, crustd runs and both example
# drivers are registered. The last line it prints is the kubeconfig's path.
#
# Idempotent: a cluster that is up and healthy is left as it is (deploy/ is applied again); anything else
# under $RUN, such as the remains of a crash, is torn down first (down.sh).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || die "run as root"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
	[ -x "$K8S_BIN/$b" ] || die "$K8S_BIN/$b missing: run hack/cluster/build.sh (make test-images does)"
done
[ -f "$IMAGES/images.txt" ] || die "$IMAGES/images.txt missing: run make test-images"
for b in etcd containerd ctr runc openssl nsenter unshare losetup lvm curl; do
	command -v "$b" >/dev/null || die "$b not found: install the packages in the Makefile's CLUSTER_PKGS"
done

NODE=$(node_name)
T0=$(date +%s.%N)
elapsed() { echo "$(date +%s.%N) - $T0" | bc | xargs printf '%.1fs'; }

healthy() {
	for p in ns etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet; do
		pid_alive "$p" || return 1
	done
	kubectl_ get --raw /readyz >/dev/null 2>&1
}

if [ -d "$RUN" ]; then
	if healthy; then
		log "cluster already up; applying deploy/ again"
		ALREADY_UP=1
	else
		log "remains of an earlier cluster under $RUN: tearing them down first"
		"$(dirname "$0")/down.sh"
	fi
fi

# crust's containerd shim, built from this tree each time (a running containerd starts the new binary for
# the next pod), and the guest it boots, which `make guest` builds.
(cd "$ROOT" && go build -o "$MICROVM_BIN/" ./examples/microvm/cmd/containerd-shim-crust-microvm-v1)
for f in cloud/vmlinux initramfs-cloud.cpio; do
	[ -f "$GUEST_ASSETS/$f" ] || die "$GUEST_ASSETS/$f missing: run make guest"
done

if [ -z "${ALREADY_UP:-}" ]; then
	# A start that fails takes down what it started, after showing why.
	on_exit() {
		local rc=$?
		[ "$rc" = 0 ] && return
		for f in "$RUN"/logs/*.log; do
			[ -s "$f" ] && { echo "--- $(basename "$f") (last lines)"; tail -n 15 "$f"; } >&2
		done
		log "cluster-up failed (exit $rc): tearing down what it started"
		"$(dirname "$0")/down.sh"
		exit "$rc"
	}
	trap on_exit EXIT
	# Refuse to start on busy ports: the cluster must not collide with anything on the machine.
	for p in "$ETCD_PORT" "$ETCD_PEER_PORT" "$KUBELET_PORT" "$KUBELET_HEALTHZ_PORT" "$KCM_PORT" "$SCHEDULER_PORT" "${CRUST_PORTS[@]}"; do
		if [ -n "$(ss -Hltn "sport = :$p")" ]; then die "port $p is in use; set the matching *_PORT variable (see hack/cluster/lib.sh)"; fi
	done
	if [ -n "$(ss -Hltn "src $APISERVER_ADDR:$APISERVER_PORT or src 0.0.0.0:$APISERVER_PORT")" ]; then
		die "$APISERVER_ADDR:$APISERVER_PORT, the API server's address, is in use"
	fi
	clear_remains || exit 1

	mkdir -p "$RUN"/{pids,logs,pki,etcd,containerd,cni/net.d,cni/ipam,ns/var/lib/kubelet,ns/var/lib/cni,ns/var/log/pods,vg}
	: >"$RUN/host-dirs"
	for s in "${SYSCTLS[@]}"; do
		v=$(sysctl -n "$s" 2>/dev/null) && printf '%s=%s\n' "$s" "$v" >>"$RUN/sysctls.saved"
	done

	# The mount namespace, and the host mount points it needs (recorded for removal).
	for d in /var/lib/kubelet /var/lib/cni /var/log/pods; do
		if [ ! -e "$d" ]; then
			mkdir -p "$d"
			echo "$d" >>"$RUN/host-dirs"
		fi
	done
	setsid unshare --mount --propagation private -- bash -c '
		set -e
		mount -t tmpfs -o mode=0755 crust-k8s-run /run
		mkdir -p /run/lock
		for d in /var/lib/kubelet /var/lib/cni /var/log/pods; do mount --bind "$1/ns$d" "$d"; done
		mount --make-rshared /
		pidfile=$1/pids/ns.pid
		'"$RECORD_SELF"'
		exec sleep infinity' _ "$RUN" >"$RUN/logs/ns.log" 2>&1 </dev/null &
	wait_for 5 "the mount namespace" test -s "$RUN/pids/ns.pid"
	log "mount namespace $(pid_of ns) ($(elapsed))"

	# PKI: one CA, EC P-256 leaf certificates for server and client use.
	pki=$RUN/pki
	openssl ecparam -name prime256v1 -genkey -noout -out "$pki/ca.key" 2>/dev/null
	openssl req -x509 -new -key "$pki/ca.key" -subj /CN=crust-test-ca -days 30 -out "$pki/ca.crt" 2>/dev/null
	cert() { # cert NAME SUBJECT [SAN]
		local name=$1 subj=$2 san=${3:-}
		openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$name.key" 2>/dev/null
		openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
		{
			echo "basicConstraints=CA:FALSE"
			echo "keyUsage=digitalSignature,keyEncipherment"
			echo "extendedKeyUsage=serverAuth,clientAuth"
			[ -n "$san" ] && echo "subjectAltName=$san"
		} >"$pki/$name.ext"
		openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
			-days 30 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
	}
	cert apiserver /CN=kube-apiserver "IP:$APISERVER_ADDR,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	cert admin "/O=system:masters/CN=crust-admin"
	cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
	cert kube-controller-manager /CN=system:kube-controller-manager
	cert kube-scheduler /CN=system:kube-scheduler
	cert kubelet "/O=system:nodes/CN=system:node:$NODE" "DNS:$NODE,DNS:localhost,IP:127.0.0.1"
	openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
	openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
	kubeconfig() { # kubeconfig FILE CERT-NAME
		local f=$1 n=$2 k=$K8S_BIN/kubectl
		$k --kubeconfig "$f" config set-cluster crust-test --server "https://$APISERVER_ADDR:$APISERVER_PORT" --certificate-authority "$pki/ca.crt" --embed-certs >/dev/null
		$k --kubeconfig "$f" config set-credentials "$n" --client-certificate "$pki/$n.crt" --client-key "$pki/$n.key" --embed-certs >/dev/null
		$k --kubeconfig "$f" config set-context crust-test --cluster crust-test --user "$n" >/dev/null
		$k --kubeconfig "$f" config use-context crust-test >/dev/null
	}
	rm -f "$KUBECONFIG_OUT"
	kubeconfig "$KUBECONFIG_OUT" admin
	for n in kube-controller-manager kube-scheduler kubelet; do kubeconfig "$pki/$n.kubeconfig" "$n"; done
	log "PKI ($(elapsed))"

	# etcd
	start etcd etcd --name default --data-dir "$RUN/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT"

	# containerd, with three handlers: runc; crust-microvm, deploy/examples' microVM handler, which is
	# crust's shim (containerd-shim-crust-microvm-v1: one QEMU guest a pod, booted from the assets `make
	# guest` built, its containers in the guest) and the default (lib.sh: DEFAULT_RUNTIME); and kata,
	# where runc stands in for Kata, which cannot run on these machines, and the tests play Kata's shim.
	# The shim (built above) is found on containerd's PATH, and reads its settings from containerd's
	# environment.
	cat >"$RUN/containerd/config.toml" <<-TOML
		version = 2
		root = "$RUN/containerd/root"
		state = "$RUN/containerd/state"
		disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
		[grpc]
		  address = "$RUN/containerd/containerd.sock"
		[ttrpc]
		  address = "$RUN/containerd/containerd.sock.ttrpc"
		[debug]
		  address = ""
		[metrics]
		  address = ""
		[plugins."io.containerd.internal.v1.opt"]
		  path = "$RUN/containerd/opt"
		[plugins."io.containerd.grpc.v1.cri"]
		  sandbox_image = "localhost/pause:3.10.2"
		  restrict_oom_score_adj = true
		  netns_mounts_under_state_dir = true
		  stream_server_address = "127.0.0.1"
		  stream_server_port = "0"
		  [plugins."io.containerd.grpc.v1.cri".cni]
		    bin_dir = "/usr/lib/cni"
		    conf_dir = "$RUN/cni/net.d"
		  [plugins."io.containerd.grpc.v1.cri".containerd]
		    snapshotter = "overlayfs"
		    default_runtime_name = "$DEFAULT_RUNTIME"
		    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
		      runtime_type = "io.containerd.runc.v2"
		      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
		        SystemdCgroup = false
		        BinaryName = "runc"
		        Root = "$RUN/containerd/runc"
		    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crust-microvm]
		      runtime_type = "io.containerd.crust-microvm.v1"
		      privileged_without_host_devices = true
		    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]
		      runtime_type = "io.containerd.runc.v2"
		      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata.options]
		        SystemdCgroup = false
		        BinaryName = "runc"
		        Root = "$RUN/containerd/runc"
	TOML
	cat >"$RUN/cni/net.d/10-crust-test.conflist" <<-JSON
		{"cniVersion": "0.4.0", "name": "crust-test", "plugins": [
		  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": false, "ipMasq": false,
		   "ipam": {"type": "host-local", "subnet": "$POD_SUBNET", "dataDir": "$RUN/cni/ipam"}}]}
	JSON
	start containerd env PATH="$MICROVM_BIN:$PATH" CRUST_MICROVM_ASSETS="$GUEST_ASSETS" containerd --config "$RUN/containerd/config.toml"
	wait_for 30 containerd ctr -a "$RUN/containerd/containerd.sock" version
	# Node-local clients (crustd's CRI lookups) find the CRI socket where containerd puts it on a real
	# node: bound there in the node's /run, which goes away with the namespace.
	in_ns sh -c 'mkdir -p /run/containerd && : >/run/containerd/containerd.sock &&
		mount --bind "$0" /run/containerd/containerd.sock' "$RUN/containerd/containerd.sock"
	log "containerd ($(elapsed))"
	while read -r archive ref; do
		ctr -a "$RUN/containerd/containerd.sock" -n k8s.io images import "$IMAGES/$archive" >/dev/null ||
			die "import $archive"
		log "imported $ref"
	done <"$IMAGES/images.txt"
	log "images ($(elapsed))"

	wait_for 30 etcd curl -fsS "http://127.0.0.1:$ETCD_PORT/health"
	start kube-apiserver "$K8S_BIN/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$ETCD_PORT" --bind-address "$APISERVER_ADDR" --advertise-address "$APISERVER_ADDR" \
		--secure-port "$APISERVER_PORT" --endpoint-reconciler-type none \
		--tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \
		--kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority "$pki/ca.crt" --kubelet-preferred-address-types Hostname,InternalIP \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
		--service-cluster-ip-range "$SERVICE_CIDR" --service-account-issuer https://kubernetes.default.svc \
		--service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
		--allow-privileged=true --profiling=false
	wait_for 60 "the API server" kubectl_ get --raw /readyz
	log "apiserver ready ($(elapsed))"
	# Pods must reach the API server at the kubernetes Service's address, and that address must be one
	# that never leaves the machine.
	wait_for 30 "the kubernetes Service" kubectl_ get service kubernetes
	svc=$(kubectl_ get service kubernetes -o jsonpath='{.spec.clusterIP}:{.spec.ports[0].port}')
	[ "$svc" = "$APISERVER_ADDR:$APISERVER_PORT" ] || die "the kubernetes Service is $svc, not $APISERVER_ADDR:$APISERVER_PORT"

	start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
		--kubeconfig "$pki/kube-controller-manager.kubeconfig" --authentication-kubeconfig "$pki/kube-controller-manager.kubeconfig" \
		--authorization-kubeconfig "$pki/kube-controller-manager.kubeconfig" \
		--bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false --use-service-account-credentials \
		--root-ca-file "$pki/ca.crt" --service-account-private-key-file "$pki/sa.key" \
		--cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
		--controllers '*,-nodeipam' --profiling=false
	start kube-scheduler "$K8S_BIN/kube-scheduler" \
		--kubeconfig "$pki/kube-scheduler.kubeconfig" --authentication-kubeconfig "$pki/kube-scheduler.kubeconfig" \
		--authorization-kubeconfig "$pki/kube-scheduler.kubeconfig" \
		--bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" --leader-elect=false --profiling=false

	cat >"$RUN/kubelet.yaml" <<-YAML
		apiVersion: kubelet.config.k8s.io/v1beta1
		kind: KubeletConfiguration
		address: 127.0.0.1
		port: $KUBELET_PORT
		healthzBindAddress: 127.0.0.1
		healthzPort: $KUBELET_HEALTHZ_PORT
		readOnlyPort: 0
		cgroupDriver: cgroupfs
		failSwapOn: false
		failCgroupV1: false
		containerRuntimeEndpoint: unix://$RUN/containerd/containerd.sock
		tlsCertFile: $pki/kubelet.crt
		tlsPrivateKeyFile: $pki/kubelet.key
		authentication:
		  anonymous: {enabled: false}
		  webhook: {enabled: true}
		  x509: {clientCAFile: $pki/ca.crt}
		authorization: {mode: Webhook}
		# NodeGetVolumeStats every 5 s, and a pod resync every 10 s (online NodeExpandVolume waits for it).
		volumeStatsAggPeriod: 5s
		syncFrequency: 10s
		# No iptables chains: they would drop non-loopback sources to 127.0.0.0/8 and outlive the cluster.
		makeIPTablesUtilChains: false
		# The images are imported by hand; never collect them.
		imageGCHighThresholdPercent: 100
		evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
		serializeImagePulls: false
	YAML
	start kubelet "$K8S_BIN/kubelet" --config "$RUN/kubelet.yaml" --kubeconfig "$pki/kubelet.kubeconfig" \
		--hostname-override "$NODE" --node-labels crust.dev/microvm=true
	wait_for 90 "node $NODE Ready" kubectl_ wait --for=condition=Ready "node/$NODE" --timeout=1s
	log "node $NODE Ready ($(elapsed))"

	# The example driver's volume group on a sparse file.
	truncate -s "$VG_SIZE" "$RUN/vg/pv.img"
	dev=$(losetup --find --show "$RUN/vg/pv.img")
	echo "$dev" >"$RUN/vg/device"
	lvm_ "$dev" pvcreate --yes "$dev" >/dev/null
	lvm_ "$dev" vgcreate --yes "$VG_NAME" "$dev" >/dev/null
	log "volume group $VG_NAME on $dev ($(elapsed))"
fi

# deploy/ and the example, as they are, with the image names of this build.
overlay() { # overlay DIR BASE: a kustomization that only renames images
	mkdir -p "$1"
	{
		echo "apiVersion: kustomize.config.k8s.io/v1beta1"
		echo "kind: Kustomization"
		echo "resources:"
		# kustomize takes only relative paths to other kustomizations.
		echo "  - $(realpath --relative-to "$1" "$2")"
		# The node's own workloads run with runc, whatever containerd's default runtime.
		echo "patches:"
		for kind in DaemonSet Deployment StatefulSet; do
			echo "  - {target: {kind: $kind}, patch: '[{\"op\": \"add\", \"path\": \"/spec/template/spec/runtimeClassName\", \"value\": \"runc\"}]'}"
		done
		echo "images:"
		while read -r _ ref; do
			local name=${ref%:*} tag=${ref##*:} short
			short=${name#localhost/}
			case $short in
			crust/csi-registrar) echo "  - {name: registry.k8s.io/sig-storage/csi-node-driver-registrar, newName: $name, newTag: $tag}" ;;
			crust/*) echo "  - {name: $short, newName: $name, newTag: $tag}" ;;
			sig-storage/*) echo "  - {name: registry.k8s.io/$short, newName: $name, newTag: $tag}" ;;
			esac
		done <"$IMAGES/images.txt"
	} >"$1/kustomization.yaml"
}
# The example driver in its two shapes, as their projects would deploy them, is given crust-csi-proxy by
# `kubectl crust inject` alone, as an operator would, before the overlay renames its images. One change
# comes first: this cluster has no kube-proxy and serves the API only on the host's loopback, and the host
# has no route to the pod subnet, so a pod off the host network could not reach the API server (the
# sidecars and the node proxy need it) and kubelet's probes of a pod's IP would leave the machine. The
# driver's pods therefore run on the host network here, and the second shape's proxies on other ports.
(cd "$ROOT" && go build -o "$RUN/kubectl-crust" ./cmd/kubectl-crust)
injected() { # injected DIR BASE INJECT-FLAGS...: BASE's manifests on the host network, injected, as a kustomization in DIR
	local dir=$1 base=$2
	shift 2
	mkdir -p "$dir/host-network"
	{
		echo "resources: [$(realpath --relative-to "$dir/host-network" "$base")]"
		echo "patches:"
		for kind in DaemonSet Deployment StatefulSet; do
			echo "  - {target: {kind: $kind}, patch: '[{\"op\": \"add\", \"path\": \"/spec/template/spec/hostNetwork\", \"value\": true}]'}"
		done
	} >"$dir/host-network/kustomization.yaml"
	kubectl_ kustomize "$dir/host-network" | "$RUN/kubectl-crust" inject --default-runtime-handler="$DEFAULT_RUNTIME" "$@" >"$dir/injected.yaml"
	echo "resources: [injected.yaml]" >"$dir/kustomization.yaml"
}
injected "$RUN/deploy/examples-injected" "$ROOT/deploy/examples"
injected "$RUN/deploy/lvm-statefulset-injected" "$ROOT/deploy/examples/lvm-statefulset" --node-port=9820 --controller-port=9822
overlay "$RUN/deploy/crust" "$ROOT/deploy"
overlay "$RUN/deploy/examples" "$RUN/deploy/examples-injected"
overlay "$RUN/deploy/lvm-statefulset" "$RUN/deploy/lvm-statefulset-injected"
# The RuntimeClasses of the node's other handlers (deploy/examples ships crust-microvm's): runc, which the
# node's own workloads name, and kata, for the tests that play Kata. Before anything names them.
kubectl_ apply -f - >/dev/null <<-YAML
	apiVersion: node.k8s.io/v1
	kind: RuntimeClass
	metadata: {name: runc}
	handler: runc
	---
	apiVersion: node.k8s.io/v1
	kind: RuntimeClass
	metadata: {name: kata}
	handler: kata
	scheduling: {nodeSelector: {crust.dev/microvm: "true"}}
YAML
kubectl_ apply -k "$RUN/deploy/crust" >/dev/null
kubectl_ apply -k "$RUN/deploy/examples" >/dev/null
kubectl_ apply -k "$RUN/deploy/lvm-statefulset" >/dev/null
kubectl_ -n crust-system rollout status daemonset/crustd --timeout=120s >/dev/null
log "crustd running ($(elapsed))"
for driver in lvm.test.crust.dev lvm-sts.test.crust.dev; do
	wait_for 120 "the example driver $driver in CSINode" sh -c "'$K8S_BIN/kubectl' --kubeconfig '$KUBECONFIG_OUT' get csinode '$NODE' -o jsonpath='{.spec.drivers[*].name}' | grep -qw $driver"
done
log "example drivers registered ($(elapsed))"
# A pod can only be created once its namespace's ServiceAccount exists.
wait_for 60 "the default ServiceAccount" kubectl_ -n default get serviceaccount default
log "cluster up in $(elapsed)"
echo "$KUBECONFIG_OUT"
