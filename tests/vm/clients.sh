#!/bin/sh
# Tier-3 checks with real clients (issue 10): sourced by guest.sh (it provides check,
# opens, set_mode, pass/fail, $C0 $C1 $R1 and EXPECT_ERRNO) while the daemon runs in
# hybrid mode; leaves it in hybrid mode.
#
# A blocked node is *present and unopenable* on both backends: stat, statx, access(F_OK)
# and faccessat2 find it, open fails (EPERM). So Flatpak's way of sandboxing a GPU
# (access(F_OK) on each /dev/nvidia* node, then `bwrap --dev-bind NODE NODE`, or
# `--dev-bind /dev/dri /dev/dri`) starts the app, and the app cannot open the blocked GPU;
# libdrm's drmGetDevices2() (Mesa, Xorg, compositors) enumerates without error and, with
# the lsm backend, skips the blocked GPU (its PCI uevent is denied); with the cgroup backend
# it lists it, its nodes cannot be opened, and Mesa's loader and Vulkan drivers skip it.
#
# Needs /usr/bin/bwrap, /bin/drmprobe (tests/vm/drmprobe.c) and their shared libraries.

VGA_TAG=pci-0000_00_02_0
VIRTIO_TAG=pci-0000_00_03_0

# bwrap pivot_roots into its sandbox, which the kernel refuses on the initramfs' rootfs:
# run it from a chroot whose root is a real mount (a tmpfs with the guest's dirs bound in).
mkdir -p /newroot
mount -t tmpfs tmpfs /newroot
for d in bin sbin usr lib lib64 etc dev proc sys tmp run; do
  [ -d "/$d" ] || continue
  mkdir -p "/newroot/$d"
  mount --rbind "/$d" "/newroot/$d"
done
mount --make-rslave /newroot

# bw ARGS...: bwrap with / read-only, a fresh /dev (as Flatpak builds it) and ARGS.
bw() {
  chroot /newroot /usr/bin/bwrap --ro-bind / / --dev /dev --proc /proc "$@"
}

# drm NAME WANT_VIRTIO_USABLE [PREFIX...]: drmprobe must enumerate without error, the VGA
# usable, the virtio GPU usable or not. A GPU blocked for the caller is skipped by libdrm
# with the lsm backend (its PCI function's uevent, which drmGetDevices2 reads, is denied);
# the cgroup backend cannot cover sysfs, so there libdrm lists it and its opens fail.
drm() {
  dr_name=$1 dr_virtio=$2
  shift 2
  dr_vga="$VGA_TAG 1234:1111 card=$C0:ok render=-:- usable=yes"
  if [ "$dr_virtio" = yes ]; then
    dr_want="drmGetDevices2 2; $dr_vga; $VIRTIO_TAG 1af4:1050 card=$C1:ok render=$R1:ok usable=yes"
  elif [ "$EXPECT_BACKEND" = lsm ]; then
    dr_want="drmGetDevices2 1; $dr_vga"
  else
    dr_want="drmGetDevices2 2; $dr_vga; $VIRTIO_TAG 1af4:1050 card=$C1:$EXPECT_ERRNO render=$R1:$EXPECT_ERRNO usable=no"
  fi
  check "$dr_name" "$dr_want" sh -c '"$@" /bin/drmprobe | sort' x "$@"
}

clients_checks() {

# ---------------------------------------------------------------- unblocked
drm "clients: libdrm, hybrid: both GPUs usable" yes
check "clients: bwrap --dev-bind, hybrid" "$C1 ok; $R1 ok" bw --dev-bind "$C1" "$C1" --dev-bind "$R1" "$R1" /bin/vmopen "$C1" "$R1"

# ---------------------------------------------------------------- blocked
set_mode "clients: integrated --force" 0 integrated --force
for how in --stat --statx --access --faccessat2; do
  check "clients: blocked nodes present to $how" "$C1 ok; $R1 ok; $C0 ok" /bin/vmopen "$how" "$C1" "$R1" "$C0"
done
opens "clients: blocked nodes unopenable" :: "$C1=$EXPECT_ERRNO" "$R1=$EXPECT_ERRNO" "$C0=ok"
# Flatpak --device=all on an NVIDIA laptop: access(F_OK) decides, then --dev-bind each.
fp_args=''
for n in "$C1" "$R1"; do
  /bin/vmopen --access "$n" >/dev/null && fp_args="$fp_args --dev-bind $n $n"
done
# shellcheck disable=SC2086  # one word per argument
check "clients: bwrap --dev-bind of a blocked node starts, open denied inside" \
  "$C1 $EXPECT_ERRNO; $R1 $EXPECT_ERRNO" bw $fp_args /bin/vmopen "$C1" "$R1"
check "clients: bwrap --dev-bind /dev/dri (Flatpak --device=dri)" \
  "$C0 ok; $C1 $EXPECT_ERRNO" bw --dev-bind /dev/dri /dev/dri /bin/vmopen "$C0" "$C1"
drm "clients: libdrm, blocked: enumerates without error, blocked GPU skipped (lsm) or unusable (cgroup)" no
echo "      blocked, as a program sees it:"
{
  /bin/vmopen --access "$C1"
  /bin/vmopen --stat "$C1"
  /bin/vmopen "$C1"
  /bin/drmprobe | sort
} 2>&1 | sed 's/^/        /'

# ---------------------------------------------------------------- granted (smart)
set_mode "clients: smart --force" 0 smart --force
# shellcheck disable=SC2016  # expanded by the inner sh
check "clients: bwrap in a gpuctl run tree (granted)" "$C1 ok; $R1 ok" \
  gpuctl run -- sh -c 'chroot /newroot /usr/bin/bwrap --ro-bind / / --dev /dev --proc /proc --dev-bind "$0" "$0" --dev-bind "$1" "$1" /bin/vmopen "$0" "$1"' "$C1" "$R1"
check "clients: bwrap, not granted" "$C1 $EXPECT_ERRNO" bw --dev-bind "$C1" "$C1" /bin/vmopen "$C1"
drm "clients: libdrm under gpuctl run: virtio usable" yes gpuctl run --
drm "clients: libdrm, DRI_PRIME=$VIRTIO_TAG: granted" yes env DRI_PRIME=$VIRTIO_TAG
drm "clients: libdrm, DRI_PRIME=$VGA_TAG (the default GPU): not granted" no env DRI_PRIME=$VGA_TAG
drm "clients: libdrm, MESA_VK_DEVICE_SELECT=1af4:1050!: granted" yes env MESA_VK_DEVICE_SELECT=1af4:1050!
drm "clients: libdrm, MESA_VK_DEVICE_SELECT=1234:1111: not granted" no env MESA_VK_DEVICE_SELECT=1234:1111
drm "clients: libdrm, VK_ICD_FILENAMES=virtio ICD: granted" yes \
  env VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/virtio_icd.x86_64.json
drm "clients: libdrm, DRI_PRIME=yes: not granted" no env DRI_PRIME=yes
set_mode "clients: back to hybrid" 0 hybrid
}

if [ -x /usr/bin/bwrap ] && [ -x /bin/drmprobe ]; then
  clients_checks
else
  fail "clients: bwrap and drmprobe in the guest" "missing (see guest-tests.sh)"
fi
umount -l /newroot 2>/dev/null
