#!/usr/bin/env bash
# crust demo: a loop-backed volume (and, where LVM works, a logical volume) staged with crustd, mounted
# inside a real QEMU microVM by crust-microvm, written and read in the guest, measured from the guest,
# grown online, and torn down leaving nothing behind. Run through `make demo` (as root), which builds the
# binaries and the guest assets first.
set -euo pipefail

BIN=${BIN:-$PWD/bin}
ASSETS=${CRUST_GUEST_ASSETS:-$PWD/_output/guest}
work=$(mktemp -d /tmp/crust-demo.XXXXXX)
kubelet=$work/kubelet
sock=$work/crust.sock
export CRUST_SOCKET=$sock
crustd_pid= vm_pid= loop1= loop2= vg=

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

cleanup() {
	set +e
	if [ -n "$vm_pid" ] && kill -0 "$vm_pid" 2>/dev/null; then
		"$BIN/crust-microvm" stop --state-dir "$work/vms" demo >/dev/null 2>&1 || kill "$vm_pid"
		wait "$vm_pid" 2>/dev/null
	fi
	[ -n "$crustd_pid" ] && kill "$crustd_pid" 2>/dev/null && wait "$crustd_pid" 2>/dev/null
	[ -n "$vg" ] && vgremove -f -y "$vg" >/dev/null 2>&1
	[ -n "$loop2" ] && pvremove -y "$loop2" >/dev/null 2>&1
	for l in $loop1 $loop2; do losetup -d "$l" 2>/dev/null; done
	rm -rf "$work"
}
trap cleanup EXIT

if [ "$(id -u)" != 0 ]; then echo "the demo needs root (loop devices, LVM, QEMU)" >&2; exit 1; fi

say "a 256 MiB loop device, blank: the guest will format it"
truncate -s 256M "$work/disk1.img"
loop1=$(losetup --find --show "$work/disk1.img")
echo "$loop1"

lvm_ok=
if command -v vgcreate >/dev/null; then
	truncate -s 512M "$work/disk2.img"
	loop2=$(losetup --find --show "$work/disk2.img")
	vg=crustdemo$$
	if pvcreate -q -y "$loop2" >/dev/null 2>&1 && vgcreate -q "$vg" "$loop2" >/dev/null 2>&1 &&
		lvcreate -q -y -L 128M -n data "$vg" >/dev/null 2>&1; then
		lvm_ok=1
		say "and an LVM logical volume, /dev/$vg/data (128 MiB)"
	else
		echo "(LVM does not work here; the demo goes on with the loop device only)"
		vg=
	fi
fi

say "crustd: the node daemon"
mkdir -p "$kubelet/pods"
"$BIN/crustd" --crust-socket "$sock" --state-dir "$work/state" --kata-dir "$work/kata" --kubelet-dir "$kubelet" \
	--device-allow '/dev/loop*' --device-allow '/dev/dm-*' --http-addr "" --log-level warn &
crustd_pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done

pod=$kubelet/pods/6e5f0a1c-0000-4000-8000-00000000d3m0/volumes/kubernetes.io~csi
t1=$pod/pvc-loop/mount
t2=$pod/pvc-lvm/mount
mkdir -p "$(dirname "$t1")" "$(dirname "$t2")"

say "a CSI plugin would now call StageVolume; crustctl does the same"
run "$BIN/crustctl" stage --target-path "$t1" --device "$loop1" --fs-type ext4 --create-filesystem --fs-group 2000 -o table
vols=(--volume "$t1:/mnt/loop")
if [ -n "$lvm_ok" ]; then
	run "$BIN/crustctl" stage --target-path "$t2" --device "/dev/$vg/data" --fs-type xfs --create-filesystem -o table
	vols+=(--volume "$t2:/mnt/lvm")
fi

say "crust-microvm: boots a QEMU microVM, claims the volumes, hot-plugs and mounts them in the guest"
"$BIN/crust-microvm" run --name demo --crust-socket "$sock" --state-dir "$work/vms" --assets "$ASSETS" --accel tcg "${vols[@]}" \
	2> >(sed 's/^/  [crust-microvm] /' >&2) &
vm_pid=$!
for _ in $(seq 600); do
	"$BIN/crust-microvm" exec --state-dir "$work/vms" demo -- grep -q ' /mnt/loop ' /proc/mounts >/dev/null 2>&1 && break
	kill -0 "$vm_pid" || { echo "crust-microvm exited" >&2; exit 1; }
	sleep 0.2
done
if [ -n "$lvm_ok" ]; then
	for _ in $(seq 600); do
		"$BIN/crust-microvm" exec --state-dir "$work/vms" demo -- grep -q ' /mnt/lvm ' /proc/mounts >/dev/null 2>&1 && break
		sleep 0.2
	done
fi

say "in the guest: the volumes are mounted from virtio disks, not shared from the host"
run "$BIN/crust-microvm" exec --state-dir "$work/vms" demo -- sh -c 'grep /mnt/ /proc/mounts; echo "hello from the guest" > /mnt/loop/hello; cat /mnt/loop/hello; ls -ln /mnt/loop'

say "crustctl ls: who claims what"
run "$BIN/crustctl" ls

say "crustctl stats: usage measured inside the guest"
run "$BIN/crustctl" stats "$t1"

say "online expansion: grow the backing file to 512 MiB, then ask crust"
run truncate -s 512M "$work/disk1.img"
run "$BIN/crustctl" expand "$t1" --size 512M
run "$BIN/crustctl" stats "$t1"
if [ -n "$lvm_ok" ]; then
	run lvextend -q -L 256M "/dev/$vg/data"
	run "$BIN/crustctl" expand "$t2" --size 256M
	run "$BIN/crustctl" stats "$t2"
fi
run "$BIN/crust-microvm" exec --state-dir "$work/vms" demo -- df -h /mnt/loop

say "stop: unmount, unplug, release, power off"
run "$BIN/crust-microvm" stop --state-dir "$work/vms" demo
wait "$vm_pid" || true
vm_pid=
run "$BIN/crustctl" ls

say "the data is on the device: mounted on the host after the VM is gone"
mkdir -p "$work/mnt"
mount -o ro "$loop1" "$work/mnt"
run cat "$work/mnt/hello"
umount "$work/mnt"

"$BIN/crustctl" unstage --target-path "$t1"
[ -n "$lvm_ok" ] && "$BIN/crustctl" unstage --target-path "$t2"
cleanup
trap - EXIT
say "torn down"
left=$(losetup -a | grep -c "$work" || true)
echo "loop devices left: $left; mounts left: $(grep -c "$work" /proc/mounts || true); processes left: $(pgrep -fc "$work" || true)"
