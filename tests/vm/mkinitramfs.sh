#!/usr/bin/env bash
# Build the tier-3 initramfs (gzip'd newc cpio).
#
# Usage: tests/vm/mkinitramfs.sh --kernel-dir DIR --binary PATH --script PATH --output FILE
#                                [--add SRC:DEST]...
#   --kernel-dir  a directory printed by fetch-kernel.sh (vmlinuz, kernel.env, root/lib/modules)
#   --binary      a static x86-64 executable, installed as /bin/gpuctl
#   --script      the guest test script, installed as /test.sh (runs under busybox sh:
#                 use #!/bin/sh and busybox applets; there is no bash in the guest)
#   --add         extra file to install at DEST (absolute guest path), repeatable
#   --output      the .cpio.gz to write
#
# Contents: /bin/busybox (+ a symlink per applet), /init (tests/vm/init), /lib/modules/KVER
# (the modules from fetch-kernel.sh with their modules.dep, for busybox modprobe),
# /etc/gpuctl-vm/{modules,nodes,kernel.env}, /bin/gpuctl, /test.sh and
# /guest-lib.sh (tests/vm/guest-lib.sh, the checks' helpers every guest script sources).
# Environment: GPUCTL_VM_BUSYBOX (default /bin/busybox, Debian package busybox-static),
#              GPUCTL_VM_NODES (DRM nodes the init waits for; default "card0 card1 renderD128").
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "mkinitramfs: error: $*" >&2; exit 2; }

kdir='' binary='' script='' output=''
adds=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --kernel-dir) kdir=${2:?}; shift 2 ;;
    --binary) binary=${2:?}; shift 2 ;;
    --script) script=${2:?}; shift 2 ;;
    --output) output=${2:?}; shift 2 ;;
    --add) adds+=("${2:?}"); shift 2 ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done
[[ -n $kdir && -n $binary && -n $script && -n $output ]] \
  || die "need --kernel-dir, --binary, --script and --output (see --help)"
[[ -f $kdir/kernel.env ]] || die "$kdir is not a kernel dir from fetch-kernel.sh"
[[ -f $binary ]] || die "binary $binary not found"
[[ -f $script ]] || die "script $script not found"
command -v cpio >/dev/null || die "cpio not found (Debian package cpio)"

busybox=${GPUCTL_VM_BUSYBOX:-/bin/busybox}
[[ -x $busybox ]] || die "$busybox not found (apt-get install busybox-static)"

# A dynamic executable cannot run in the guest (there is no libc there).
is_static() {
  local info
  if command -v readelf >/dev/null; then
    info=$(readelf -lW "$1" 2>/dev/null) || return 0
    [[ $info != *"program interpreter"* ]]
  elif command -v file >/dev/null; then
    info=$(file -L "$1")
    [[ $info != *"dynamically linked"* ]]
  else
    return 0
  fi
}
is_static "$busybox" || die "$busybox is dynamically linked: install busybox-static (not busybox)"
is_static "$binary" || die "$binary is dynamically linked; build it static (see ARCHITECTURE.md#toolchain: RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target x86_64-unknown-linux-gnu)"

# We cd into the staging dir below: make every path absolute first.
kdir=$(realpath "$kdir") binary=$(realpath "$binary") script=$(realpath "$script")
output=$(realpath -m "$output")
for i in "${!adds[@]}"; do
  a=${adds[$i]}
  [[ ${a%%:*} != "$a" ]] || die "--add wants SRC:/ABS/DEST, got $a"
  adds[i]="$(realpath -m "${a%%:*}"):${a#*:}"
done

# shellcheck disable=SC1091
. "$kdir/kernel.env"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cd "$stage"
mkdir -p bin sbin usr/bin usr/sbin dev proc sys tmp run root etc/gpuctl-vm lib/modules
cp "$busybox" bin/busybox
# One symlink per applet ("busybox --list-full" prints e.g. "usr/bin/awk"); perl (Debian's
# essential perl-base) makes them in one process: a shell loop forks ~800 times (~2 s).
"$busybox" --list-full | perl -ne 'chomp; next if -e $_ || -l $_;
  my ($d) = m{^(.*)/}; system("mkdir", "-p", $d) if defined $d && !-d $d;
  symlink("/bin/busybox", $_) or die "symlink $_: $!\n"'
[[ -L bin/sh ]] || ln -s busybox bin/sh

cp -a "$kdir/root/lib/modules/$KVER" "lib/modules/$KVER"
echo "$MODULES" >etc/gpuctl-vm/modules
echo "${GPUCTL_VM_NODES:-card0 card1 renderD128}" >etc/gpuctl-vm/nodes
cp "$kdir/kernel.env" etc/gpuctl-vm/kernel.env
: >etc/fstab
echo "root:x:0:0:root:/root:/bin/sh" >etc/passwd
echo "root:x:0:" >etc/group

install -m 0755 "$here/init" init
install -m 0755 "$binary" bin/gpuctl
install -m 0755 "$script" test.sh
install -m 0644 "$here/guest-lib.sh" guest-lib.sh
for a in ${adds[@]+"${adds[@]}"}; do
  src=${a%%:*} dest=${a#*:}
  [[ $src != "$a" && $dest == /* ]] || die "--add wants SRC:/ABS/DEST, got $a"
  [[ -e $src ]] || die "--add: $src not found"
  mkdir -p ".$(dirname "$dest")"
  cp -a "$src" ".$dest"
done

# /dev/console lets the kernel give init its stdio; needs root (init reopens it anyway).
if [[ $(id -u) == 0 ]]; then
  mknod -m 600 dev/console c 5 1
  mknod -m 666 dev/null c 1 3
fi

mkdir -p "$(dirname "$output")"
find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -1 >"$output.tmp"
mv "$output.tmp" "$output"
