#!/usr/bin/env bash
# Tier 3, power (part of make test-vm): a real D3cold GPU. Boots Debian's stock kernel on a
# NEW machine type, q35 (the `pc` boots of guest-tests.sh stay as they are):
#
#   -machine q35 + -device intel-iommu (intel_iommu=on)
#   0000:00:01.0  -device VGA (bochs, card0, the default GPU)
#   0000:00:1c.0… -device pcie-root-port, and behind it
#   0000:01:00.0  -device virtio-gpu-pci, which the guest rebinds to vfio-pci (a runtime-PM
#                 driver; its modules come from the same kernel package)
#   an SSDT (tests/vm/power-d3cold.asl) giving that GPU a _PR0/_PR3 power resource, so the
#   PCI core puts it in real D3cold, and a read of its `config` file (what lspci does)
#   really wakes it.
#
# The guest (tests/vm/power-guest.sh) proves: gpuctl reports D3cold; asleep residency grows;
# a named process's config read makes a `wake` event naming the process and the file, and
# the wake count and residency change; with the lsm backend blocking that GPU the same read
# is denied and the GPU stays in D3cold; with the cgroup backend it is not (sysfs is not a
# device node) and the GPU wakes; the idle daemon has no context switches.
#
# Usage: tests/vm/power-tests.sh [-v] BIN       (the static gpuctl)
# Prints "vm: power: N passed, M failed"; exit 1 if anything failed, 2 on a setup error.
# Console log: target/vm/power.log. Environment: GPUCTL_VM_CACHE (kernel cache),
# GPUCTL_VM_QEMU (QEMU binary).
set -euo pipefail

# shellcheck source=tests/vm/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

vm_args 2,24 "[-v]" -- "$@"
qemu=${GPUCTL_VM_QEMU:-qemu-system-x86_64}
command -v "$qemu" >/dev/null || die "$qemu not found (apt-get install qemu-system-x86)"

vm_kernel
cache=${GPUCTL_VM_CACHE:-$repo/.cache/vm}
deb=$cache/debs/${PKG}_${PKG_VERSION}_amd64.deb
[[ -f $deb ]] || die "$deb not found (fetch-kernel.sh keeps the package there)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$repo/target/vm
mkdir -p "$out"
log=$out/power.log

# vfio-pci and its dependencies, from the same kernel package (kept beside the logs).
mods=$out/power-modules-$KVER
vfio=(virt/lib/irqbypass.ko drivers/vfio/vfio.ko drivers/vfio/vfio_iommu_type1.ko
      drivers/vfio/vfio_virqfd.ko drivers/vfio/pci/vfio-pci-core.ko drivers/vfio/pci/vfio-pci.ko)
if [[ ! -f $mods/vfio-pci.ko ]]; then
  mkdir -p "$tmp/x" "$mods"
  paths=()
  for f in "${vfio[@]}"; do paths+=("./lib/modules/$KVER/kernel/$f"); done
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp/x" "${paths[@]}" \
    || die "extracting the vfio modules from $deb failed"
  for f in "${vfio[@]}"; do cp "$tmp/x/lib/modules/$KVER/kernel/$f" "$mods/"; done
fi
adds=()
for f in "${vfio[@]}"; do
  b=$(basename "$f")
  adds+=(--add "$mods/$b:/lib/modules/$KVER/extra/$b")
done

"$here/ssdt.sh" "$here/power-d3cold.asl" "$out/power-d3cold.aml"
cp "$bin" "$tmp/gpuctl"
"$here/mkinitramfs.sh" --kernel-dir "$kdir" --binary "$tmp/gpuctl" \
  --script "$here/power-guest.sh" --output "$tmp/initrd.cpio.gz" "${adds[@]}" \
  || die "mkinitramfs.sh failed"

kernel=$kdir/vmlinuz
[[ -f $kdir/vmlinux ]] && kernel=$kdir/vmlinux
# shellcheck disable=SC2054  # QEMU option values contain commas
cmd=(
  "$qemu" -accel tcg -machine q35 -nodefaults -no-user-config -display none -m 1024 -smp 2
  -device intel-iommu
  -global ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off
  -device VGA -device pcie-root-port,id=rp1,chassis=1,slot=1 -device virtio-gpu-pci,bus=rp1
  -acpitable "file=$out/power-d3cold.aml"
  -chardev "stdio,id=con,signal=off" -serial chardev:con -no-reboot
  -kernel "$kernel" -initrd "$tmp/initrd.cpio.gz"
  -append "console=ttyS0 panic=-1 quiet intel_iommu=on"
)
t0=$SECONDS
set +e
if [[ $verbose == 1 ]]; then
  timeout -k 5 180 "${cmd[@]}" </dev/null 2>&1 | sed -u 's/\r//g' | tee "$log"
else
  timeout -k 5 180 "${cmd[@]}" </dev/null 2>&1 | sed -u 's/\r//g' >"$log"
fi
set -e
secs=$((SECONDS - t0))
marker=$(grep -aoE 'GPUCTL-VM-EXIT [0-9]+' "$log" | tail -n1 || true)
if ! vm_counts "$log"; then
  echo "vm: power: 0 passed, 1 failed (no result from the guest${marker:+, $marker}; ${secs}s)"
  tail -n 40 "$log" | sed 's/^/  | /'
  exit 1
fi
[[ ${marker#GPUCTL-VM-EXIT } == 0 || $nf != 0 ]] || nf=1
line="vm: power: $np passed, $nf failed"
[[ $ns == 0 ]] || line+=", $ns skipped"
echo "$line (${secs}s)"
if [[ $nf != 0 && $verbose == 0 ]]; then
  grep -aE '^(FAIL|SKIP) |^daemon\| |^guest: ' "$log" | sed 's/^/  /' || true
  echo "  (console log: $log)"
fi
[[ $nf == 0 ]]
