#!/bin/sh
# Guest smoke test (busybox sh): print what the tier-3 VM looks like. Always exits 0.
#   tests/vm/run.sh --binary /bin/busybox --script tests/vm/smoke.sh

echo "== uname -r"
uname -r
echo "== /sys/kernel/security/lsm"
cat /sys/kernel/security/lsm; echo
echo "== ls -l /sys/class/drm/"
ls -l /sys/class/drm/
for c in /sys/class/drm/card*; do
  case $c in *-*) continue ;; esac   # skip connectors such as card0-Virtual-1
  echo "== $c"
  echo "  link:       $(readlink "$c")"
  echo "  device ->   $(readlink "$c/device")"
  echo "  device is   $(readlink -f "$c/device")"
  echo "  dev:        $(cat "$c/dev")"
  d=$(readlink -f "$c/device")
  [ -e "$d/driver" ] && echo "  driver:     $(basename "$(readlink "$d/driver")")"
  [ -e "$d/subsystem" ] && echo "  subsystem:  $(basename "$(readlink "$d/subsystem")")"
done
for r in /sys/class/drm/renderD*; do
  [ -e "$r" ] || continue
  echo "== $r"
  echo "  link:       $(readlink "$r")"
  echo "  dev:        $(cat "$r/dev")"
done
echo "== PCI functions"
for p in /sys/bus/pci/devices/*; do
  line="$(basename "$p") class=$(cat "$p/class") vendor=$(cat "$p/vendor") device=$(cat "$p/device")"
  [ -e "$p/driver" ] && line="$line driver=$(basename "$(readlink "$p/driver")")"
  [ -e "$p/boot_vga" ] && line="$line boot_vga=$(cat "$p/boot_vga")"
  [ -e "$p/power_state" ] && line="$line power_state=$(cat "$p/power_state")"
  [ -e "$p/power/runtime_status" ] && line="$line runtime=$(cat "$p/power/runtime_status")"
  echo "$line"
  echo "  -> $(readlink -f "$p")"
done
echo "== virtio devices"
for v in /sys/bus/virtio/devices/*; do
  [ -e "$v" ] || continue
  line="$(basename "$v") device=$(cat "$v/device")"
  [ -e "$v/driver" ] && line="$line driver=$(basename "$(readlink "$v/driver")")"
  echo "$line"
  echo "  -> $(readlink -f "$v")"
  echo "  contains: $(cd "$v/" && echo *)"
done
echo "== ls -l /dev/dri"
ls -l /dev/dri
echo "== BTF"
if [ -e /sys/kernel/btf/vmlinux ]; then echo "/sys/kernel/btf/vmlinux exists"; else echo "/sys/kernel/btf/vmlinux MISSING"; fi
echo "== cgroup2 mounts"
grep cgroup2 /proc/self/mountinfo
echo "== /bin/gpuctl"
ls -l /bin/gpuctl
echo "== env (GPUCTL_*)"
env | grep '^GPUCTL' | sort
exit 0
