# Shared settings and functions of hack/cluster/up.sh and down.sh, which the cluster tier's tests also
# call. Everything the cluster writes lives under $RUN, apart from the mount-point directories listed in
# $RUN/host-dirs, which down.sh removes again.
#
# The node runs in a mount namespace of its own (held by one `sleep` process, recorded as ns): inside
# it, /run is a fresh tmpfs and /var/lib/kubelet, /var/lib/cni and /var/log/pods are bind mounts of
# directories under $RUN. So the node uses the standard paths that deploy/ names, while nothing it mounts
# or creates there is seen on the host, and everything it mounted goes away with its processes.
# shellcheck shell=bash

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$ROOT/_output/k8s}
RUN=${RUN:-$OUT/run}
K8S_BIN=${K8S_BIN:-$OUT/bin}
IMAGES=${IMAGES:-$ROOT/_output/images}
# The microVM runtime: crust's containerd shim, built here by up.sh, and the guest `make guest` builds.
MICROVM_BIN=${MICROVM_BIN:-$OUT/microvm}
GUEST_ASSETS=${GUEST_ASSETS:-$ROOT/_output/guest}
# containerd's default runtime: pods that name no RuntimeClass run in a microVM, as on a node where every
# pod does (Kubernetes' storage suite, whose pods name none, then sees deferred volumes). The node's own
# workloads (crustd, the example drivers) name the RuntimeClass runc. DEFAULT_RUNTIME=runc makes runc the
# default again.
DEFAULT_RUNTIME=${DEFAULT_RUNTIME:-crust-microvm}
KUBECONFIG_OUT=$OUT/kubeconfig

# Services get loopback addresses: with no kube-proxy on the node, a Service's address must never be
# routed off the machine. The API server listens on the first one, the `kubernetes` Service's own
# ClusterIP, at the Service's port, so pods that use their in-cluster configuration (KUBERNETES_SERVICE_HOST
# and _PORT) reach it directly.
SERVICE_CIDR=127.100.0.0/24
APISERVER_ADDR=127.100.0.1
APISERVER_PORT=443
# The other ports, on 127.0.0.1; each may be overridden from the environment.
ETCD_PORT=${ETCD_PORT:-2379}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-2380}
KUBELET_PORT=${KUBELET_PORT:-10250}
KUBELET_HEALTHZ_PORT=${KUBELET_HEALTHZ_PORT:-10248}
KCM_PORT=${KCM_PORT:-10257}
SCHEDULER_PORT=${SCHEDULER_PORT:-10259}
# crustd's and the CSI proxies' HTTP ports on the node (deploy/'s, and the injected example drivers':
# up.sh), and the example registrar's; checked so a collision is reported early.
CRUST_PORTS=(9809 9810 9811 9812 9820 9822)

# The bridge the CNI plugin makes, and the pod subnet on it.
BRIDGE=${BRIDGE:-k8stest0}
POD_SUBNET=10.88.77.0/24
# The volume group the example driver serves (deploy/examples), on a sparse file on a loop device.
VG_NAME=${VG_NAME:-crust-example}
VG_SIZE=${VG_SIZE:-8G}
# Sysctls kubelet or the CNI plugin may change; saved at start, restored at teardown.
SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom kernel.keys.root_maxkeys
	kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv4.conf.all.route_localnet)

# The node's name: the host name when it resolves to loopback (kubelet's and the apiserver's default
# address type then reaches kubelet), localhost otherwise.
node_name() {
	local h
	h=$(hostname)
	if getent hosts "$h" | grep -q '^127\.'; then echo "$h"; else echo localhost; fi
}

log() { printf '%s cluster: %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The node's processes are recorded in $RUN/pids/NAME.pid as "PID START": the pid and the start time
# (field 22 of /proc/PID/stat) of the process, written by the process itself (RECORD_SELF, with the file's
# name in $pidfile) before it execs its program. A pid alone would name whichever process has that pid
# now: once the cluster's processes are gone without down.sh and the pids have wrapped (pid_max is 32768
# on these machines), an unrelated one, which down.sh would then stop.
# shellcheck disable=SC2016 # expanded by the shell that runs it
RECORD_SELF='read -r s </proc/self/stat; s=${s##*") "}; echo "$$ $(echo $s | cut -d" " -f20)" >"$pidfile"'

# pid_of NAME: the pid recorded as NAME.
pid_of() { cut -d' ' -f1 "$RUN/pids/$1.pid"; }

# pid_alive NAME: the process recorded as NAME is running: its pid has the start time recorded with it.
pid_alive() {
	local f=$RUN/pids/$1.pid pid start stat
	read -r pid start <"$f" 2>/dev/null && [ -n "$start" ] || return 1
	stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
	stat=${stat##*") "}
	# shellcheck disable=SC2086 # one word per field
	set -- $stat
	[ "${20}" = "$start" ]
}

# wait_for SECONDS WHAT CMD...: polls CMD every 0.2 s until it succeeds. It fails at once, naming the
# process, when one that start() started has exited: none of them ends on its own.
wait_for() {
	local limit=$1 what=$2 end f
	shift 2
	end=$(($(date +%s) + limit))
	until "$@" >/dev/null 2>&1; do
		for f in "$RUN"/pids/*.pid; do
			[ -s "$f" ] || continue
			f=$(basename "$f" .pid)
			if ! pid_alive "$f"; then
				log "$f exited while waiting for $what; its log is $RUN/logs/$f.log"
				return 1
			fi
		done
		if [ "$(date +%s)" -ge "$end" ]; then
			log "timed out after ${limit}s waiting for $what"
			return 1
		fi
		sleep 0.2
	done
}

# start NAME CMD...: runs CMD in the node's mount namespace, in its own session, appending to
# $RUN/logs/NAME.log, recorded as NAME (RECORD_SELF); returns once it is recorded. A process recorded as
# NAME before must have ended: its record goes.
start() {
	local name=$1
	shift
	rm -f "$RUN/pids/$name.pid"
	setsid nsenter -t "$(pid_of ns)" -m -- sh -c "pidfile=\$0; $RECORD_SELF; exec \"\$@\"" "$RUN/pids/$name.pid" "$@" \
		>>"$RUN/logs/$name.log" 2>&1 </dev/null &
	wait_for 5 "$name to start" test -s "$RUN/pids/$name.pid"
}

# clear_remains: clears what a cluster stopped before down.sh could run leaves on the host, where no
# $RUN names it any more, and what would stop the next cluster: its CNI bridge (clear_bridge) and the
# loop device of its volume group (clear_volume_group). Call it only once the cluster's ports are known
# to be free, so that no cluster of this tree is running. Nothing to clear is not an error.
clear_remains() { clear_bridge && clear_volume_group; }

# clear_bridge makes way for the CNI bridge. A bridge of that name with no ports is the remains of a
# cluster (its pods' interfaces went with their network namespaces): it carries nothing, so it is
# removed, and said so. Anything else of that name is left alone and refused, naming what it is.
clear_bridge() {
	local d=/sys/class/net/$BRIDGE ports
	[ -e "$d" ] || return 0
	if [ ! -d "$d/bridge" ]; then
		log "error: network interface $BRIDGE exists and is not a bridge"
		return 1
	fi
	ports=$(ls "$d/brif")
	if [ -n "$ports" ]; then
		log "error: bridge $BRIDGE exists and has ports (${ports//$'\n'/ }): something else is using it"
		return 1
	fi
	ip link del "$BRIDGE" || return 1
	log "removed bridge $BRIDGE: it had no ports, the remains of a cluster stopped before cluster-down"
}

# clear_volume_group detaches every loop device that carries a physical volume of $VG_NAME, the volume
# group's file of a cluster that stays attached when the cluster is killed: the example driver refuses a
# volume group whose name two groups have. The file itself is left as it is.
clear_volume_group() {
	local dev file vg
	while read -r dev file; do
		vg=$(lvm_ "$dev" pvs --noheadings -o vg_name "$dev" 2>/dev/null) || continue
		[ "${vg//[[:space:]]/}" = "$VG_NAME" ] || continue
		losetup -d "$dev" || return 1
		log "detached $dev ($file): it carried volume group $VG_NAME, the remains of a cluster stopped before cluster-down"
	done < <(losetup -n -l -O NAME,BACK-FILE)
}

# in_ns CMD...: runs CMD in the node's mount namespace.
in_ns() { nsenter -t "$(pid_of ns)" -m -- "$@"; }

kubectl_() { "$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_OUT" "$@"; }

# lvm_ LVM-ARGS...: LVM restricted to the volume group's loop device, with no udev and no activation,
# as the example driver runs it.
lvm_() {
	local dev=$1
	shift
	local cmd=$1
	shift
	LVM_SUPPRESS_FD_WARNINGS=1 DM_DISABLE_UDEV=1 lvm "$cmd" --config "devices { use_devicesfile=0 obtain_device_list_from_udev=0 global_filter=[\"a|^$dev\$|\",\"r|.*|\"] } activation { udev_sync=0 udev_rules=0 } backup { backup=0 archive=0 } global { activation=0 }" "$@"
}
