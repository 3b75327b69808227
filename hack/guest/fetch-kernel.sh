#!/usr/bin/env bash
# fetch-kernel.sh gathers the host-independent assets of the crust guest VM:
# a Debian kernel with the modules the guest needs, busybox, and the
# filesystem tools (with their shared libraries) that crust-guest runs.
#
# usage: hack/guest/fetch-kernel.sh [--with-9p] [OUTDIR]    (OUTDIR defaults to _output/guest)
#
# It is idempotent: packages are cached under OUTDIR/debs and each part is
# redone only when its package version changed or its files are missing.
# Layout it produces (read by examples/microvm/initramfs.LoadAssets):
#
#   OUTDIR/cloud/vmlinux        linux-image-cloud-amd64's kernel, as the ELF its
#                               bzImage carries compressed: QEMU boots it by its PVH
#                               entry point, and the guest skips the decompressor
#                               (under TCG, 0.8 s less to the agent in the median
#                               of 10 boots taken in turns with the bzImage's)
#   OUTDIR/cloud/modules/*.ko   the modules the guest needs (disks, pmem, virtio-fs for
#                               a pod's containers, virtio-net for its network),
#                               dependencies included
#                               (some may not load on every CPU, e.g. crc32c-intel
#                               without SSE4.2: the agent logs and goes on)
#   OUTDIR/cloud/modules.load   their file names, one a line, in load order
#   OUTDIR/tools/               a root tree merged into the initramfs: busybox and
#                               its applet links, mkfs.ext4, resize2fs, e2fsck,
#                               mkfs.xfs, xfs_growfs, xfs_io (statx, timed I/O), blkid and their libraries
#   OUTDIR/generic/...          with --with-9p: linux-image-amd64's kernel, laid out
#                               like cloud/, with the 9p modules as well
set -euo pipefail

with_9p=false
out=""
for arg in "$@"; do
	case "$arg" in
	--with-9p) with_9p=true ;;
	-h | --help)
		sed -n '2,25p' "$0"
		exit 0
		;;
	-*)
		echo "fetch-kernel.sh: unknown flag $arg" >&2
		exit 2
		;;
	*) out="$arg" ;;
	esac
done
out="${out:-_output/guest}"
mkdir -p "$out/debs"
out="$(cd "$out" && pwd)"

log() { echo "fetch-kernel: $*" >&2; }

# layout is part of every stamp: bump it when this script changes what it
# produces, so that caches are redone.
layout=4

# Host tools this script runs, and the host packages whose binaries are copied.
need_pkgs=()
command -v modprobe >/dev/null && command -v depmod >/dev/null || need_pkgs+=(kmod)
command -v dpkg-deb >/dev/null || need_pkgs+=(dpkg)
command -v mkfs.ext4 >/dev/null || need_pkgs+=(e2fsprogs)
command -v mkfs.xfs >/dev/null || need_pkgs+=(xfsprogs)
command -v blkid >/dev/null || need_pkgs+=(util-linux)
command -v cryptsetup >/dev/null || need_pkgs+=(cryptsetup-bin)
command -v ldd >/dev/null || need_pkgs+=(libc-bin)
command -v readelf >/dev/null || need_pkgs+=(binutils)
apt_updated=false
apt_update() {
	if ! $apt_updated; then
		apt-get update -qq
		apt_updated=true
	fi
}
if ((${#need_pkgs[@]})); then
	log "installing ${need_pkgs[*]}"
	apt_update
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# candidate PKG prints the version apt would install.
candidate() {
	local v
	v="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')"
	if [[ -z "$v" || "$v" == "(none)" ]]; then
		apt_update
		v="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')"
	fi
	[[ -n "$v" && "$v" != "(none)" ]] || {
		echo "fetch-kernel: no candidate for package $1" >&2
		return 1
	}
	echo "$v"
}

# kernel_pkg META resolves a meta package (linux-image-cloud-amd64) to the
# versioned kernel package it depends on (linux-image-6.1.0-NN-cloud-amd64).
kernel_pkg() {
	local p
	candidate "$1" >/dev/null
	p="$(apt-cache depends "$1" | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')"
	[[ -n "$p" ]] || {
		echo "fetch-kernel: cannot resolve the kernel package of $1" >&2
		return 1
	}
	echo "$p"
}

# fetch_deb PKG [META] prints the path of PKG's .deb in the cache, downloading it
# if the cached one is missing or not the candidate version. When the download
# fails, apt's lists may be a reused machine's, naming a version the archive no
# longer has: they are updated, and the package resolved again (from META, a
# kernel's meta package, whose kernel ABI may have moved on too).
fetch_deb() {
	local pkg="$1" meta="${2:-}" ver deb
	ver="$(candidate "$pkg")"
	for deb in "$out/debs/${pkg}_"*.deb; do
		[[ -e "$deb" ]] || continue
		if [[ "$(dpkg-deb -f "$deb" Version)" == "$ver" ]]; then
			echo "$deb"
			return
		fi
		rm -f "$deb"
	done
	log "downloading $pkg $ver"
	(cd "$out/debs" && apt-get download -qq "$pkg=$ver" 2>/dev/null) || {
		apt_update
		[[ -z "$meta" ]] || pkg="$(kernel_pkg "$meta")"
		ver="$(candidate "$pkg")"
		log "downloading $pkg $ver (apt's lists updated)"
		(cd "$out/debs" && apt-get download -qq "$pkg=$ver")
	}
	for deb in "$out/debs/${pkg}_"*.deb; do
		echo "$deb"
		return
	done
	echo "fetch-kernel: download of $pkg left no .deb" >&2
	return 1
}

# unpack_kernel BZIMAGE ELF writes the kernel a bzImage carries to ELF: the
# payload its setup header locates (boot protocol 2.08 and later), decompressed
# by the tool its magic names. The ELF must have a PVH entry point (Xen's
# PHYS32_ENTRY note), which QEMU needs to boot it.
unpack_kernel() {
	local bz="$1" elf="$2" setup off len magic tool pkg
	# u N OFFSET: the N-byte little-endian number at OFFSET.
	u() { od -An -tu"$1" -j "$2" -N"$1" "$bz" | tr -d ' '; }
	setup=$(u 1 $((0x1f1)))
	[[ "$setup" != 0 ]] || setup=4
	off=$(($((setup + 1)) * 512 + $(u 4 $((0x248)))))
	len=$(u 4 $((0x24c)))
	magic=$(od -An -tx1 -j "$off" -N4 "$bz" | tr -d ' \n')
	case "$magic" in
	02214c18) tool="lz4 -dc" pkg=lz4 ;;
	fd377a58) tool="xz -dc --single-stream" pkg=xz-utils ;;
	28b52ffd) tool="zstd -qdc" pkg=zstd ;;
	1f8b*) tool="gzip -dc" pkg=gzip ;;
	*)
		echo "fetch-kernel: $bz: unknown compression of the kernel (magic $magic)" >&2
		return 1
		;;
	esac
	if ! command -v "${tool%% *}" >/dev/null; then
		apt_update
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
	fi
	# The payload's last 4 bytes are the kernel's size, not part of the stream.
	dd if="$bz" iflag=skip_bytes,count_bytes skip="$off" count=$((len - 4)) bs=1M status=none | $tool >"$elf"
	# readelf names the note's type by number (Xen's notes are unknown to it) or, if it learns them, by name.
	local notes
	notes=$(readelf -n "$elf" 2>&1) || true
	if ! grep -qE '\(0x00000012\)|PHYS32_ENTRY' <<<"$notes"; then
		echo "fetch-kernel: $bz: the kernel it carries has no PVH entry point, which QEMU boots it by" >&2
		return 1
	fi
}

# kernel META DEST MODULE... extracts META's kernel into DEST: vmlinux, the
# named modules and everything they need, dependencies and soft dependencies
# ("pre:" ones, such as libcrc32c's crc32c) included, and modules.load listing
# them in the order modprobe would load them. Built-in modules are skipped.
kernel() {
	local meta="$1" dest="$2"
	shift 2
	local pkg deb stamp
	pkg="$(kernel_pkg "$meta")"
	deb="$(fetch_deb "$pkg" "$meta")"
	pkg="$(dpkg-deb -f "$deb" Package)"
	stamp="layout=$layout $pkg $(dpkg-deb -f "$deb" Version) $*"
	if [[ -f "$dest/.stamp" && "$(cat "$dest/.stamp")" == "$stamp" && -f "$dest/vmlinux" && -f "$dest/modules.load" ]]; then
		log "$dest is up to date ($pkg)"
		return
	fi
	log "extracting $pkg into $dest"
	local tmp
	tmp="$(mktemp -d)"
	# shellcheck disable=SC2064
	trap "rm -rf '$tmp'" RETURN
	dpkg-deb -x "$deb" "$tmp"
	local kver
	kver="$(ls "$tmp/lib/modules")"
	# The package ships no modules.dep: make one for modprobe to read.
	depmod -b "$tmp" "$kver"
	rm -rf "$dest"
	mkdir -p "$dest/modules"
	unpack_kernel "$tmp/boot/vmlinuz-$kver" "$dest/vmlinux"

	local order=() m kind path base name
	for m in "$@"; do
		while read -r kind path _; do
			[[ "$kind" == insmod ]] || continue # "builtin NAME"
			base="$(basename "$path")"
			name="${base%.ko*}.ko"
			[[ " ${order[*]} " == *" $name "* ]] && continue
			case "$base" in
			*.ko.xz) xz -dc "$path" >"$dest/modules/$name" ;;
			*.ko.zst) zstd -qdc "$path" >"$dest/modules/$name" ;;
			*.ko.gz) gzip -dc "$path" >"$dest/modules/$name" ;;
			*) cp "$path" "$dest/modules/$name" ;;
			esac
			order+=("$name")
		done < <(modprobe -d "$tmp" -S "$kver" --show-depends "$m")
	done
	printf '%s\n' "${order[@]}" >"$dest/modules.load"
	echo "$stamp" >"$dest/.stamp"
	log "$dest: $kver, modules: ${order[*]}"
}

# copy_with_libs ROOT BIN copies BIN to the same path under ROOT, with the
# shared libraries and the dynamic loader ldd reports for it.
copy_with_libs() {
	local root="$1" bin="$2" lib
	install -D -m 0755 "$bin" "$root$bin"
	for lib in $(ldd "$bin" | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}'); do
		[[ -e "$root$lib" ]] || install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
	done
}

# The host binaries copied into the guest, with their libraries.
guest_tools=(mkfs.ext4 resize2fs e2fsck mkfs.xfs xfs_growfs xfs_io blkid cryptsetup)

tools() {
	local dest="$out/tools" deb stamp bins=() b
	deb="$(fetch_deb busybox-static)"
	for b in "${guest_tools[@]}"; do
		bins+=("$(readlink -f "$(command -v "$b")")")
	done
	stamp="layout=$layout busybox-static $(dpkg-deb -f "$deb" Version)"
	for b in "${bins[@]}"; do
		stamp+=" $b:$(stat -c %Y "$b")"
	done
	if [[ -f "$dest/.stamp" && "$(cat "$dest/.stamp")" == "$stamp" && -x "$dest/bin/busybox" ]]; then
		log "$dest is up to date"
		return
	fi
	log "assembling $dest"
	local tmp
	tmp="$(mktemp -d)"
	# shellcheck disable=SC2064
	trap "rm -rf '$tmp'" RETURN
	dpkg-deb -x "$deb" "$tmp"
	rm -rf "$dest"
	mkdir -p "$dest"
	install -D -m 0755 "$tmp/bin/busybox" "$dest/bin/busybox"
	local applet
	for applet in $("$dest/bin/busybox" --list-full); do
		[[ "$applet" == bin/busybox ]] && continue
		mkdir -p "$dest/$(dirname "$applet")"
		ln -sf /bin/busybox "$dest/$applet"
	done
	# The real tools win over busybox applets of the same name.
	for b in "${guest_tools[@]}"; do
		local path
		path="$(command -v "$b")"
		rm -f "$dest$path"
		copy_with_libs "$dest" "$(readlink -f "$path")"
		if [[ "$(readlink -f "$path")" != "$path" ]]; then
			ln -sf "$(readlink -f "$path")" "$dest$path"
		fi
	done
	if [[ -f /etc/mke2fs.conf ]]; then
		install -D -m 0644 /etc/mke2fs.conf "$dest/etc/mke2fs.conf"
	fi
	echo "$stamp" >"$dest/.stamp"
}

# dm_crypt and dm_integrity open encrypted volumes; xts, authenc, aesni_intel and sha256_ssse3 are the
# ciphers and hashes they ask for (the guest's kernel cannot load a module it is not given).
guest_modules=(virtio_pci virtio_blk virtio_console virtio-rng xfs ext4 nd_pmem virtio_pmem virtiofs virtio_net
	dm_crypt dm_integrity xts authenc aesni_intel sha256_ssse3)
kernel linux-image-cloud-amd64 "$out/cloud" "${guest_modules[@]}"
tools
if $with_9p; then
	kernel linux-image-amd64 "$out/generic" "${guest_modules[@]}" 9pnet_virtio 9p
fi
log "assets are in $out"
