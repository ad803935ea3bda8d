# shellcheck shell=bash
# Sourced by bench/run.sh. Builds a minimal but faithful sysfs tree of an
# Intel + NVIDIA laptop (the layout, files and relative symlinks of a real
# /sys), for gpuctl's GPUCTL_SYSFS_ROOT.
#
#   0000:00:02.0               Intel iGPU 8086:46a6, boot_vga 1, i915, card1 + renderD128,
#                              drives the connected internal panel card1-eDP-1
#   0000:00:01.0/0000:01:00.0  NVIDIA dGPU 10de:25a2 behind a PCIe root port, nouveau,
#                              card0 + renderD129 (what integrated mode blocks: 226:0, 226:129)
#
# Usage: bench_fixture ROOT   (creates ROOT/sys and ROOT/proc)

# _fx_file PATH CONTENT: one sysfs attribute (a line ending in a newline, like the kernel's).
_fx_file() {
	mkdir -p "${1%/*}"
	printf '%s\n' "$2" >"$1"
}

# _fx_link LINK TARGET: a relative symlink, spelled as kernfs spells it.
_fx_link() {
	mkdir -p "${1%/*}"
	ln -sfn "$2" "$1"
}

# _fx_pci SYS REL VENDOR DEVICE CLASS DRIVER: a PCI function at SYS/devices/REL.
_fx_pci() {
	local sys=$1 rel=$2 vendor=$3 device=$4 class=$5 driver=$6
	local dir=$sys/devices/$rel addr=${rel##*/}
	# ../ from the function's directory up to SYS: one per path component of devices/REL.
	local up='' comp
	IFS=/ read -ra comp <<<"devices/$rel"
	for _ in "${comp[@]}"; do up+='../'; done
	_fx_file "$dir/vendor" "$vendor"
	_fx_file "$dir/device" "$device"
	_fx_file "$dir/class" "$class"
	_fx_file "$dir/power_state" D0
	_fx_file "$dir/power/runtime_status" active
	_fx_file "$dir/power/control" auto
	_fx_file "$dir/uevent" "DRIVER=$driver"
	mkdir -p "$sys/bus/pci/drivers/$driver"
	_fx_link "$dir/driver" "${up}bus/pci/drivers/$driver"
	_fx_link "$dir/subsystem" "${up}bus/pci"
	_fx_link "$sys/bus/pci/devices/$addr" "../../../devices/$rel"
}

# _fx_drm SYS REL NAME MINOR: DRM node NAME (226:MINOR) under the PCI function REL.
_fx_drm() {
	local sys=$1 rel=$2 name=$3 minor=$4
	local dir=$sys/devices/$rel/drm/$name
	_fx_file "$dir/dev" "226:$minor"
	_fx_file "$dir/uevent" "MAJOR=226
MINOR=$minor
DEVNAME=dri/$name
DEVTYPE=drm_minor"
	_fx_link "$dir/device" "../../../${rel##*/}"
	_fx_link "$sys/class/drm/$name" "../../devices/$rel/drm/$name"
	_fx_link "$sys/dev/char/226:$minor" "../../devices/$rel/drm/$name"
}

bench_fixture() {
	local root=$1
	local sys=$root/sys
	local igpu=pci0000:00/0000:00:02.0
	local bridge=pci0000:00/0000:00:01.0
	local dgpu=$bridge/0000:01:00.0
	mkdir -p "$sys/devices/pci0000:00" "$sys/class/drm" "$sys/dev/char" \
		"$sys/bus/pci/drivers/i915" "$sys/bus/pci/drivers/nouveau" "$root/proc"

	# The PCIe root port above the dGPU (a bridge, not a GPU: discovery must skip it).
	_fx_pci "$sys" "$bridge" 0x8086 0x460d 0x060400 pcieport

	_fx_pci "$sys" "$igpu" 0x8086 0x46a6 0x030000 i915
	_fx_file "$sys/devices/$igpu/boot_vga" 1
	_fx_drm "$sys" "$igpu" card1 1
	_fx_drm "$sys" "$igpu" renderD128 128
	local conn=$sys/devices/$igpu/drm/card1/card1-eDP-1
	_fx_file "$conn/status" connected
	_fx_file "$conn/enabled" enabled
	_fx_link "$sys/class/drm/card1-eDP-1" "../../devices/$igpu/drm/card1/card1-eDP-1"

	_fx_pci "$sys" "$dgpu" 0x10de 0x25a2 0x030000 nouveau
	_fx_file "$sys/devices/$dgpu/boot_vga" 0
	_fx_drm "$sys" "$dgpu" card0 0
	_fx_drm "$sys" "$dgpu" renderD129 129
}
