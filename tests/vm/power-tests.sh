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
vm_kernel
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$repo/target/vm
mkdir -p "$out"

vm_modules power virt/lib/irqbypass.ko drivers/vfio/vfio.ko drivers/vfio/vfio_iommu_type1.ko \
  drivers/vfio/vfio_virqfd.ko drivers/vfio/pci/vfio-pci-core.ko drivers/vfio/pci/vfio-pci.ko
"$here/ssdt.sh" "$here/power-d3cold.asl" "$out/power-d3cold.aml"
cp "$bin" "$tmp/gpuctl"
"$here/mkinitramfs.sh" --kernel-dir "$kdir" --binary "$tmp/gpuctl" \
  --script "$here/power-guest.sh" --output "$tmp/initrd.cpio.gz" "${adds[@]}" \
  || die "mkinitramfs.sh failed"

kernel=$kdir/vmlinuz
[[ -f $kdir/vmlinux ]] && kernel=$kdir/vmlinux
vm_boot power 180 "$out/power.log" \
  -accel tcg -machine q35 -nodefaults -no-user-config -display none -m 1024 -smp 2 \
  -device intel-iommu \
  -global ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off \
  -device VGA -device pcie-root-port,id=rp1,chassis=1,slot=1 -device virtio-gpu-pci,bus=rp1 \
  -acpitable "file=$out/power-d3cold.aml" \
  -chardev "stdio,id=con,signal=off" -serial chardev:con -no-reboot \
  -kernel "$kernel" -initrd "$tmp/initrd.cpio.gz" \
  -append "console=ttyS0 panic=-1 quiet intel_iommu=on"
