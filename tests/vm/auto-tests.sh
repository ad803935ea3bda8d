#!/usr/bin/env bash
# Tier 3 (make test-vm): automatic modes against a REAL ACPI AC adapter and battery.
# Boots Debian's stock kernel once (-machine pc, VGA + virtio GPU as in run.sh) with an SSDT
# (tests/vm/ssdt-power.asl, compiled with iasl) that gives the guest an AC adapter and a
# battery whose state the guest flips through CMOS; the kernel's own ac/battery drivers
# (from the same kernel package) then send real power_supply uevents. tests/vm/guest-auto.sh
# checks what the daemon does with them (cgroup backend). The guest also suspends to RAM
# (S3) once: this script wakes it through QEMU's QMP socket (`system_wakeup`) when the guest
# prints "GPUCTL-SUSPEND" (S3 resume needs the firmware path, so this boot uses the bzImage).
#
# Usage: tests/vm/auto-tests.sh [-v] BIN
#   -v   stream the guest's console (default: one summary line, plus FAIL lines and the
#        daemon's log if anything failed)
# Prints "vm: auto: N passed, M failed[, K skipped] (Ts)" and "vm: N passed, M failed";
# exits 1 if a check failed, 2 on a setup error. Console log: target/vm/guest-auto.log.
# Needs: iasl (acpica-tools), gcc + libc6-dev (static uevmon), dpkg-deb, and what run.sh needs.
set -euo pipefail

# shellcheck source=tests/vm/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

vm_args 2,15 "[-v]" -- "$@"
command -v iasl >/dev/null || die "iasl not found (apt-get install acpica-tools)"
vm_cc

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$bin" "$tmp/gpuctl"
vm_static "$tmp" vmopen uevmon holdopen
cp "$here/ssdt-power.asl" "$tmp/"
(cd "$tmp" && iasl -p ssdt-power ssdt-power.asl >"$tmp/iasl.log" 2>&1) \
  || { cat "$tmp/iasl.log" >&2; die "iasl failed on ssdt-power.asl"; }

# The ACPI ac and battery modules of the kernel run.sh boots (the shared kernel cache keeps
# only the DRM modules): extracted once from the cached .deb, kept beside it.
vm_kernel
cache=$(dirname "$kdir")
acpi=$kdir/extra-acpi
if [[ ! -f $acpi/ac.ko || ! -f $acpi/battery.ko ]]; then
  deb=$cache/debs/${PKG}_${PKG_VERSION}_amd64.deb
  [[ -f $deb ]] || die "$deb not found (run tests/vm/fetch-kernel.sh --refresh)"
  x=$tmp/deb
  mkdir -p "$x"
  dpkg-deb --fsys-tarfile "$deb" \
    | tar -x -C "$x" --wildcards "./lib/modules/$KVER/kernel/drivers/acpi/ac.ko*" \
        "./lib/modules/$KVER/kernel/drivers/acpi/battery.ko*" \
    || die "extracting ac.ko and battery.ko from $deb failed"
  mkdir -p "$tmp/acpi"
  for m in ac battery; do
    src=$(find "$x/lib/modules/$KVER/kernel/drivers/acpi" -name "$m.ko*" | head -n1)
    case $src in
      *.xz) xz -dc "$src" >"$tmp/acpi/$m.ko" ;;
      *.zst) zstd -dcq "$src" >"$tmp/acpi/$m.ko" ;;
      *) cp "$src" "$tmp/acpi/$m.ko" ;;
    esac
  done
  # Atomic for parallel runs; where the cache is read-only, use the copies in $tmp.
  if mkdir -p "$acpi.tmp.$$" 2>/dev/null && cp "$tmp/acpi/"*.ko "$acpi.tmp.$$/" \
     && mv -T "$acpi.tmp.$$" "$acpi" 2>/dev/null; then :; else
    rm -rf "$acpi.tmp.$$"; acpi=$tmp/acpi
  fi
fi

log=$repo/target/vm/guest-auto.log
args=(--binary "$tmp/gpuctl" --script "$here/guest-auto.sh" --name guest-auto --log "$log"
      --timeout 150
      --add "$tmp/vmopen:/bin/vmopen" --add "$tmp/uevmon:/bin/uevmon" --add "$tmp/holdopen:/bin/holdopen"
      --add "$acpi/ac.ko:/lib/modules/$KVER/extra/ac.ko"
      --add "$acpi/battery.ko:/lib/modules/$KVER/extra/battery.ko")
[[ $verbose == 1 ]] || args+=(--quiet)
# The wake-up button: each "GPUCTL-SUSPEND" line on the console gets a system_wakeup 2 s later.
qmp=$tmp/qmp.sock
rm -f "$log"
(
  seen=0
  while :; do
    n=$(grep -ac '^GPUCTL-SUSPEND' "$log" 2>/dev/null || true)
    if [[ ${n:-0} -gt $seen ]]; then
      seen=$n
      sleep 2
      perl -MIO::Socket::UNIX -e '
        my $s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "qmp: $!\n";
        $s->print(qq({"execute":"qmp_capabilities"}\n{"execute":"system_wakeup"}\n));
        for (1 .. 3) { defined(my $l = <$s>) or last; }' "$qmp" 2>>"$tmp/qmp.err" || true
    fi
    sleep 0.2
  done
) &
waker=$!
t0=$SECONDS
set +e
GPUCTL_VM_BOOT=bzimage \
GPUCTL_VM_QEMU_EXTRA="-acpitable file=$tmp/ssdt-power.aml -qmp unix:$qmp,server=on,wait=off ${GPUCTL_VM_QEMU_EXTRA:-}" \
  "$here/run.sh" "${args[@]}" 2>"$tmp/run.err"
rc=$?
set -e
kill "$waker" 2>/dev/null || true
wait "$waker" 2>/dev/null || true
secs=$((SECONDS - t0))
bad=0
vm_report auto "$log" "$rc" "$secs" "$tmp/run.err" || bad=1
echo "vm: $np passed, $nf failed"
exit "$bad"
