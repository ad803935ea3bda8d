#!/usr/bin/env bash
# Tier 3, power-off (part of make test-vm): gpuctl cuts a real rail. Boots Debian's stock
# kernel on q35:
#
#   0000:00:01.0  -device VGA (bochs, card0, the default GPU)
#   0000:00:02.0  -device pcie-root-port with an ACPI _PR0/_PR3 power resource
#                 (tests/vm/poweroff-port.asl: counts its _OFF/_ON calls in CMOS)
#   0000:01:00.0  -device virtio-gpu-pci bound to virtio-pci: a driver without runtime PM,
#                 so the GPU stays in D0 while bound (like a pre-Turing NVIDIA GPU)
#   0000:01:00.1  -device ich9-intel-hda (+ an hda-duplex codec) in the same slot
#                 (multifunction): the function every real dGPU has, bound to snd_hda_intel
#                 (its modules come from the same kernel package), with /dev/snd nodes
#   pcie_port_pm=force (SeaBIOS reports a 2014 firmware date; the kernel lets root ports
#   enter D3 on older firmware only when told so)
#
# The guest (tests/vm/poweroff-guest.sh): power_off = never keeps D0; `set integrated` with
# auto unbinds (audio first) and the rail goes off (_OFF called, D3cold); `set hybrid` binds
# both back and the node opens; holders of card1 and of the audio control node make the
# power-off refuse naming them, the last one's exit lets it follow; a
# drivers_probe rebind is powered off again; daemon stop binds back; boot with integrated
# saved powers off before the socket answers; kill -9 then `gpuctl poweroff-restore` binds
# back.
#
# Usage: tests/vm/poweroff-tests.sh [-v] BIN       (the static gpuctl)
# Prints "vm: poweroff: N passed, M failed"; exit 1 if anything failed, 2 on a setup error.
# Console log: target/vm/poweroff.log (the TIME lines feed docs/PERFORMANCE.md).
set -euo pipefail

# shellcheck source=tests/vm/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

vm_args 2,27 "[-v]" -- "$@"
vm_kernel
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$repo/target/vm
mkdir -p "$out"

# snd_hda_intel and its dependencies, in load order (the guest insmods them in this order).
vm_modules poweroff sound/soundcore.ko sound/core/snd.ko sound/core/snd-timer.ko \
  sound/core/snd-pcm.ko sound/core/snd-hwdep.ko sound/hda/snd-hda-core.ko \
  sound/hda/snd-intel-sdw-acpi.ko sound/hda/snd-intel-dspcfg.ko sound/pci/hda/snd-hda-codec.ko \
  drivers/leds/trigger/ledtrig-audio.ko sound/pci/hda/snd-hda-codec-generic.ko \
  sound/pci/hda/snd-hda-intel.ko
echo "$order" >"$tmp/snd-order"
adds+=(--add "$tmp/snd-order:/etc/gpuctl-vm/snd-order")

vm_static "$tmp" vmopen holdopen
"$here/ssdt.sh" "$here/poweroff-port.asl" "$out/poweroff-port.aml"
cp "$bin" "$tmp/gpuctl"
GPUCTL_VM_NODES="card0 card1 renderD128" "$here/mkinitramfs.sh" --kernel-dir "$kdir" \
  --binary "$tmp/gpuctl" --script "$here/poweroff-guest.sh" --output "$tmp/initrd.cpio.gz" \
  --add "$tmp/vmopen:/bin/vmopen" --add "$tmp/holdopen:/bin/holdopen" "${adds[@]}" \
  || die "mkinitramfs.sh failed"

kernel=$kdir/vmlinuz
[[ -f $kdir/vmlinux ]] && kernel=$kdir/vmlinux
vm_boot poweroff 300 "$out/poweroff.log" \
  -accel tcg -machine q35 -nodefaults -no-user-config -display none -m 1024 -smp 2 \
  -global ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off \
  -device VGA -device pcie-root-port,id=rp1,chassis=1,slot=1 \
  -device virtio-gpu-pci,bus=rp1,addr=00.0,multifunction=on \
  -device ich9-intel-hda,id=hda,bus=rp1,addr=00.1 -device hda-duplex,bus=hda.0,audiodev=snd0 \
  -audiodev none,id=snd0 \
  -acpitable "file=$out/poweroff-port.aml" \
  -chardev "stdio,id=con,signal=off" -serial chardev:con -no-reboot \
  -kernel "$kernel" -initrd "$tmp/initrd.cpio.gz" \
  -append "console=ttyS0 panic=-1 quiet pcie_port_pm=force"
