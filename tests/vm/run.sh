#!/usr/bin/env bash
# Tier 3: boot Debian's stock kernel in QEMU (TCG) with two emulated GPUs and run a guest script.
#
# Usage: tests/vm/run.sh --binary PATH --script GUEST_SCRIPT [options]
#   --binary PATH      static executable, installed in the guest as /bin/gpuctl
#   --script PATH      guest test script (busybox sh), installed as /test.sh and run by /init
#   --append "ARGS"    extra kernel command line, e.g. "lsm=landlock,lockdown,yama,loadpin,\
#                      safesetid,integrity,apparmor,selinux,smack,tomoyo" (stock default minus
#                      bpf) or "FOO=bar" (unknown NAME=value words become /test.sh's environment)
#   --timeout SECS     kill QEMU after SECS (default 120); a hung guest never hangs the host
#   --name LABEL       label for messages and the log file name (default: the script's basename)
#   --add SRC:DEST     extra file for the guest at absolute path DEST (repeatable)
#   --smp N            guest CPUs (default 2)
#   --quiet            do not stream the console; print its last lines only on failure
#   --log FILE         console log (default <repo>/target/vm/LABEL.log)
#   --bzimage          boot the packaged bzImage (vmlinuz) instead of the decompressed ELF
#                      vmlinux through its PVH entry (same kernel; PVH skips ~6 s of TCG
#                      decompression); also GPUCTL_VM_BOOT=bzimage
#
# Exit status: the guest script's status, read from the console line "GPUCTL-VM-EXIT <status>";
# 124 if the timeout killed QEMU before the marker, 125 if QEMU ended without the marker
# (kernel panic, init failure, QEMU error); 2 on a usage or setup error.
#
# Guest: -machine pc; 0000:00:02.0 = -device VGA (bochs, card0, boot_vga=1);
# 0000:00:03.0 = -device virtio-gpu-pci (virtio-pci -> virtio0 -> virtio_gpu, card1 + renderD128).
# Environment: GPUCTL_VM_CACHE (kernel cache), GPUCTL_VM_QEMU (QEMU binary),
#              GPUCTL_VM_QEMU_EXTRA (extra QEMU arguments, word-split).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
die() { echo "vm: error: $*" >&2; exit 2; }

binary='' script='' append='' timeout_s=120 name='' smp=2 quiet=0 log=''
boot=${GPUCTL_VM_BOOT:-pvh}
adds=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --binary) binary=${2:?}; shift 2 ;;
    --script) script=${2:?}; shift 2 ;;
    --append) append=${2?}; shift 2 ;;
    --timeout) timeout_s=${2:?}; shift 2 ;;
    --name) name=${2:?}; shift 2 ;;
    --add) adds+=(--add "${2:?}"); shift 2 ;;
    --smp) smp=${2:?}; shift 2 ;;
    --quiet) quiet=1; shift ;;
    --log) log=${2:?}; shift 2 ;;
    --bzimage) boot=bzimage; shift ;;
    -h|--help) sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done
[[ -n $binary && -n $script ]] || die "need --binary and --script (see --help)"
[[ $timeout_s =~ ^[0-9]+$ ]] || die "--timeout wants whole seconds"
[[ -n $name ]] || name=$(basename "$script" .sh)
[[ -n $log ]] || log=$repo/target/vm/$name.log

qemu=${GPUCTL_VM_QEMU:-qemu-system-x86_64}
command -v "$qemu" >/dev/null || die "$qemu not found (apt-get install qemu-system-x86)"

kdir=$("$here/fetch-kernel.sh" | tail -n1) || die "fetch-kernel.sh failed"

kernel=$kdir/vmlinuz
[[ $boot != bzimage && -f $kdir/vmlinux ]] && kernel=$kdir/vmlinux

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$here/mkinitramfs.sh" --kernel-dir "$kdir" --binary "$binary" --script "$script" \
  --output "$tmp/initrd.cpio.gz" ${adds[@]+"${adds[@]}"} || die "mkinitramfs.sh failed"

mkdir -p "$(dirname "$log")"
# shellcheck disable=SC2206  # word splitting wanted
extra=(${GPUCTL_VM_QEMU_EXTRA:-})
cmd=(
  "$qemu" -accel tcg -machine pc -nodefaults -no-user-config -display none
  -m 1024 -smp "$smp"
  -device VGA -device virtio-gpu-pci
  -chardev "stdio,id=con,signal=off" -serial chardev:con
  -no-reboot
  -kernel "$kernel" -initrd "$tmp/initrd.cpio.gz"
  -append "console=ttyS0 panic=-1 quiet $append"
  ${extra[@]+"${extra[@]}"}
)

echo "vm[$name]: booting $(basename "$kdir")/$(basename "$kernel") (smp $smp, timeout ${timeout_s}s${append:+, append \"$append\"})" >&2
start=$(date +%s.%N)
set +e
if [[ $quiet == 1 ]]; then
  timeout -k 5 "$timeout_s" "${cmd[@]}" </dev/null 2>&1 | sed -u 's/\r//g' >"$log"
else
  timeout -k 5 "$timeout_s" "${cmd[@]}" </dev/null 2>&1 | sed -u 's/\r//g' | tee "$log"
fi
qemu_rc=${PIPESTATUS[0]}
set -e
# The console's last line ("reboot: Power down") has no newline.
[[ $quiet == 1 || ! -s $log || $(tail -c1 "$log" | od -An -c) == *'\n'* ]] || echo
elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')

marker=$(grep -aoE 'GPUCTL-VM-EXIT [0-9]+' "$log" | tail -n1 || true)
if [[ -n $marker ]]; then
  status=${marker#GPUCTL-VM-EXIT }
  echo "vm[$name]: guest script exited $status (${elapsed}s wall, log $log)" >&2
  exit "$status"
fi

if [[ $qemu_rc == 124 || $qemu_rc == 137 ]]; then
  echo "vm[$name]: FAILED: timeout after ${timeout_s}s, no GPUCTL-VM-EXIT marker (guest hung?)" >&2
  rc=124
else
  echo "vm[$name]: FAILED: QEMU exited $qemu_rc without the GPUCTL-VM-EXIT marker (kernel panic, init failure or QEMU error)" >&2
  rc=125
fi
echo "vm[$name]: last console lines ($log):" >&2
tail -n 40 "$log" | sed 's/^/  | /' >&2
exit "$rc"
