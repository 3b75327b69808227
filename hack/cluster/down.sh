#!/usr/bin/env bash
# Removes everything hack/cluster/up.sh made, whatever state it is in (a healthy cluster, a crash of up.sh
# or of this script): every process of the node, the mount namespace and so every mount in it, the
# example volume group and its loop device, loop devices left by the example driver, the CNI bridge, the
# kubepods cgroups, the mount-point directories it created on the host, and $RUN; the sysctls it saved
# are restored. Running it with nothing up is a no-op that exits 0.
set -uo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || die "run as root"
[ -d "$RUN" ] || { log "nothing to tear down"; exit 0; }

# stop NAME...: SIGTERM to the recorded processes, SIGKILL to those alive 10 s later.
stop() {
	local n pids=()
	for n in "$@"; do
		pid_alive "$n" && pids+=("$(pid_of "$n")")
	done
	[ ${#pids[@]} -gt 0 ] || return 0
	kill -TERM "${pids[@]}" 2>/dev/null
	for _ in $(seq 50); do
		kill -0 "${pids[@]}" 2>/dev/null || return 0
		sleep 0.2
	done
	kill -KILL "${pids[@]}" 2>/dev/null
	sleep 0.2
}

# kill_ns: SIGKILL to every process left in the node's mount namespace (containers, shims, handlers
# the tests started), until none is left.
kill_ns() {
	pid_alive ns || return 0
	local nsid p left holder
	holder=$(pid_of ns)
	nsid=$(readlink "/proc/$holder/ns/mnt")
	# Never the host's own namespace: that would be every process of the machine.
	[ -n "$nsid" ] && [ "$nsid" != "$(readlink /proc/self/ns/mnt)" ] || return 0
	for _ in $(seq 50); do
		left=0
		for p in /proc/[0-9]*; do
			p=${p#/proc/}
			[ "$p" = "$holder" ] && continue
			if [ "$(readlink "/proc/$p/ns/mnt" 2>/dev/null)" = "$nsid" ]; then
				kill -KILL "$p" 2>/dev/null && left=1
			fi
		done
		[ $left = 0 ] && return 0
		sleep 0.2
	done
}

# The control plane and kubelet first, so nothing restarts what is being removed.
stop kube-scheduler kube-controller-manager kubelet
# Container processes live in other mount namespaces (runc makes one per container): kill them by cgroup.
for _ in $(seq 20); do
	procs=$(cat /sys/fs/cgroup/*/kubepods/cgroup.procs /sys/fs/cgroup/*/kubepods/*/cgroup.procs \
		/sys/fs/cgroup/*/kubepods/*/*/cgroup.procs /sys/fs/cgroup/*/kubepods/*/*/*/cgroup.procs 2>/dev/null | sort -u)
	[ -n "$procs" ] || break
	# shellcheck disable=SC2086
	kill -KILL $procs 2>/dev/null
	sleep 0.2
done
# Shims of this containerd (they run in the node's namespace, but name its socket).
pkill -KILL -f -- "-address $RUN/containerd/containerd.sock" 2>/dev/null
kill_ns
stop containerd kube-apiserver etcd
kill_ns
stop ns
# Loop devices: any backed by a file under $RUN (the volume group's), and the example driver's: without
# device-mapper it attaches each logical volume's extent-map file (csi-<40 hex digits>, on its own FUSE
# mount) to a loop device, which outlives a killed driver and then shows only the file's name.
vgdev=$(cat "$RUN/vg/device" 2>/dev/null)
if [ -n "$vgdev" ]; then
	lvm_ "$vgdev" vgremove --yes --force "$VG_NAME" >/dev/null 2>&1
	lvm_ "$vgdev" pvremove --yes --force "$vgdev" >/dev/null 2>&1
fi
losetup -n -l -O NAME,BACK-FILE 2>/dev/null | while read -r dev file; do
	if [[ $file == "$RUN"/* ]] || { [[ ${file##*/} =~ ^csi-[0-9a-f]{40}$ ]] && [ ! -e "$file" ]; }; then
		losetup -d "$dev" 2>/dev/null
	fi
done
# The driver's /dev/<vg>/<lv> links (in the host's /dev, which its pods mount), left when it was killed.
if [ -d "/dev/$VG_NAME" ]; then
	find "/dev/$VG_NAME" -mindepth 1 -maxdepth 1 -type l -delete
	rmdir "/dev/$VG_NAME" 2>/dev/null || log "left /dev/$VG_NAME: not only links"
fi
ip link del "$BRIDGE" 2>/dev/null
# kubepods cgroups, deepest first.
for c in /sys/fs/cgroup/*/kubepods; do
	[ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null
done
if [ -f "$RUN/sysctls.saved" ]; then
	while IFS='=' read -r k v; do sysctl -q -w "$k=$v" >/dev/null 2>&1; done <"$RUN/sysctls.saved"
fi
if [ -f "$RUN/host-dirs" ]; then
	tac "$RUN/host-dirs" | while read -r d; do rmdir "$d" 2>/dev/null || log "left $d: not empty"; done
fi
# Nothing is mounted under $RUN on the host (the node's mounts were in its namespace), but a crash of
# up.sh between two steps is no reason to remove files through a mount: check first.
if grep -q " $RUN" /proc/self/mountinfo; then
	grep " $RUN" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l
fi
rm -rf "$RUN" "$KUBECONFIG_OUT"
log "cluster removed"
