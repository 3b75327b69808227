#!/usr/bin/env bash
# sysroot.sh ARCH DIR PACKAGE...: unpacks the Debian packages PACKAGE..., with everything they depend on,
# for the Debian architecture ARCH (arm64, amd64), as this machine's apt sources serve them, into DIR:
# the sysroot that `hack/images -sysroot ARCH=DIR` copies an image's host tools from. apt's lists and
# downloads are kept under DIR.apt, apart from the machine's own apt and dpkg state, which it leaves
# alone; a DIR made before is made again. DIR.apt/files.list names the package of every regular file,
# one line "PATH PACKAGE ARCH VERSION", for the SBOM (hack/release -packages ARCH=DIR.apt/files.list).
set -euo pipefail
arch=${1:?usage: sysroot.sh ARCH DIR PACKAGE...}
dir=${2:?usage: sysroot.sh ARCH DIR PACKAGE...}
shift 2
[ $# -gt 0 ] || { echo "sysroot.sh: no packages named" >&2; exit 2; }
state=$dir.apt
mkdir -p "$state/lists/partial" "$state/archives/partial"
: >"$state/status"
apt=(apt-get -q -y -o "Dir::State=$state" -o "Dir::State::Lists=$state/lists" -o "Dir::State::status=$state/status"
	-o "Dir::Cache=$state" -o "Dir::Cache::archives=$state/archives" -o "APT::Architecture=$arch"
	-o "APT::Architectures=$arch" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
"${apt[@]}" update >/dev/null
"${apt[@]}" install --download-only --no-install-recommends "$@" >/dev/null
rm -rf "$dir"
mkdir -p "$dir"
: >"$state/files.list"
for deb in "$state"/archives/*.deb; do
	dpkg-deb -x "$deb" "$dir"
	pkg=$(dpkg-deb -W --showformat='${Package} ${Architecture} ${Version}' "$deb")
	dpkg-deb -c "$deb" | awk -v pkg="$pkg" '$1 ~ /^-/ { p = $6; sub(/^\./, "", p); print p, pkg }' >>"$state/files.list"
done
echo "sysroot.sh: $(ls "$state"/archives/*.deb | wc -l) $arch packages unpacked into $dir"
