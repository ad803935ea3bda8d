#!/usr/bin/env bash
# Installs a .deb into a debootstrapped Debian 12 and boots it in QEMU (TCG) with systemd
# as PID 1, the stock Debian kernel (tests/vm/fetch-kernel.sh) and the two emulated GPUs,
# then runs guest/distro-checks inside: once with the BPF LSM ("main"), once booted with
# lsm= without bpf ("fallback"). Run as root (debootstrap, chroot).
#
# Usage: tests/distro/boot.sh [--only main|fallback] [-v] DEB
#
# Cache (outside the clone; GPUCTL_DISTRO_CACHE, default /var/cache/gpuctl-test):
#   bookworm-root-HASH/ debootstrap --variant=minbase bookworm + guest-packages (systemd, udev,
#                       the desktop clients: ~750 MB, made once, ~5 min; HASH is of the list)
#   kmods-KVER-HASH/    the kernel modules the guest needs, from the cached kernel package
# Kernel: tests/vm/fetch-kernel.sh (GPUCTL_VM_CACHE). Mirror: GPUCTL_DISTRO_MIRROR
# (default http://deb.debian.org/debian). Logs: target/distro/boot-LABEL.log.
# Exit status: 0 when every check of every boot passed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${GPUCTL_DISTRO_CACHE:-/var/cache/gpuctl-test}
mirror=${GPUCTL_DISTRO_MIRROR:-http://deb.debian.org/debian}
logdir=$repo/target/distro
only='' verbose=0 deb=''
die() { echo "distro-boot: error: $*" >&2; exit 2; }
log() { echo "distro-boot: $*" >&2; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --only) only=${2:?}; shift 2 ;;
    -v) verbose=1; shift ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) deb=$1; shift ;;
  esac
done
[[ -f $deb ]] || die "usage: boot.sh [--only main|fallback] [-v] DEB"
[[ $(id -u) == 0 ]] || die "needs root (debootstrap, chroot)"
for t in debootstrap mke2fs qemu-system-x86_64 cpio depmod modprobe gcc; do
  command -v "$t" >/dev/null || [[ -x /usr/sbin/$t || -x /sbin/$t ]] || die "$t not found (make deps)"
done
PATH=$PATH:/usr/sbin:/sbin
mkdir -p "$cache" "$logdir"
exec 9>"$cache/.lock"
flock 9

# --- the Debian 12 root (cached) ------------------------------------------------------------
# The desktop clients (guest/checks-desktop) come from Debian's packages: the root is keyed
# on the package list (a different list gets its own directory; none is modified in place).
pkgs=$(paste -sd, "$here/guest-packages")
base=$cache/bookworm-root-$(printf '%s' "$pkgs" | sha256sum | cut -c1-12)
if [[ ! -x $base/lib/systemd/systemd ]]; then
  log "debootstrap bookworm into $base (once)"
  rm -rf "$base.tmp"
  debootstrap --variant=minbase --include="$pkgs" \
    bookworm "$base.tmp" "$mirror" >"$base.log" 2>&1 \
    || { tail -n 20 "$base.log" >&2; die "debootstrap failed (log: $base.log)"; }
  chroot "$base.tmp" apt-get clean
  rm -rf "$base"
  mv "$base.tmp" "$base"
fi

# --- the kernel and its modules -----------------------------------------------------------
kdir=$("$repo/tests/vm/fetch-kernel.sh" | tail -n1)
# shellcheck disable=SC1091
. "$kdir/kernel.env"
kernel=$kdir/vmlinux
[[ -f $kernel ]] || kernel=$kdir/vmlinuz
vmcache=${GPUCTL_VM_CACHE:-$repo/.cache/vm}
kdeb=$vmcache/debs/${PKG}_${PKG_VERSION//:/%3a}_amd64.deb
# Root disk (virtio-blk, ext4) for the initramfs; the GPUs' drivers for udev to autoload.
mods_initrd="virtio_pci virtio_blk crc32c_generic ext4"
# snd_hda_intel: the offload GPU's HDMI-audio-like function (00:03.1) for PipeWire.
mods_all="$mods_initrd bochs virtio_gpu snd_hda_intel snd_hda_codec_generic"
# Keyed on the module list too (a list that grows gets its own directory).
kmods=$cache/kmods-$KVER-$(printf '%s' "$mods_all" | sha256sum | cut -c1-8)
if [[ ! -f $kmods/.complete ]]; then
  [[ -f $kdeb ]] || die "kernel package $kdeb not cached (tests/vm/fetch-kernel.sh --refresh)"
  log "extracting modules ($mods_all) from $(basename "$kdeb")"
  work=$(mktemp -d "$cache/.kmods.XXXXXX")
  dpkg-deb -x "$kdeb" "$work/full"
  depmod -b "$work/full" "$KVER"
  full=$work/full/lib/modules/$KVER
  mkdir -p "$work/out/lib/modules/$KVER"
  for m in $mods_all; do
    modprobe -d "$work/full" -S "$KVER" --show-depends "$m" | while read -r kind path _; do
      [[ $kind == insmod ]] || continue
      rel=${path#"$full"/}
      mkdir -p "$work/out/lib/modules/$KVER/$(dirname "$rel")"
      cp "$path" "$work/out/lib/modules/$KVER/$rel"
    done
  done
  cp "$full"/modules.{builtin,builtin.modinfo,order} "$work/out/lib/modules/$KVER/"
  depmod -b "$work/out" "$KVER"
  touch "$work/out/.complete"
  rm -rf "$kmods"
  mv "$work/out" "$kmods"
  rm -rf "$work"
fi

work=$(mktemp -d "$cache/.run.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --- the initramfs: busybox, the disk modules, guest/init -----------------------------------
mkdir -p "$work/initrd"/{bin,sbin,dev,proc,sys,etc,newroot,lib/modules}
cp /bin/busybox "$work/initrd/bin/busybox"
for a in sh mount umount modprobe sleep cat mkdir switch_root poweroff echo; do
  ln -s busybox "$work/initrd/bin/$a"
done
cp -a "$kmods/lib/modules/$KVER" "$work/initrd/lib/modules/"
echo "$mods_initrd" >"$work/initrd/etc/initrd-modules"
install -m 0755 "$here/guest/init" "$work/initrd/init"
(cd "$work/initrd" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -1) >"$work/initrd.gz"

# --- the root disk: base + modules + the package (installed as apt would) + test fixtures ---
root=$work/root
cp -a "$base" "$root"
cp -a "$kmods/lib/modules" "$root/lib/"
gcc -static -O2 -o "$root/usr/local/bin/vmopen" "$repo/tests/vm/vmopen.c"
install -m 0755 "$here/guest/distro-checks" "$root/usr/local/sbin/distro-checks"
install -m 0755 "$here/guest/stub-dm" "$root/usr/local/sbin/stub-dm"
install -m 0644 "$here/guest/checks-hardening" "$root/usr/local/sbin/checks-hardening"
install -m 0644 "$here/guest/checks-desktop" "$root/usr/local/sbin/checks-desktop"
install -m 0755 "$here/guest/session-agent" "$root/usr/local/bin/session-agent"
install -m 0755 "$here/guest/desktop-client" "$root/usr/local/bin/desktop-client"
cp "$deb" "$root/root/"
echo gpuctl-distro >"$root/etc/hostname"
echo '/dev/vda / ext4 rw 0 0' >"$root/etc/fstab"
# The saved mode, as a previous boot leaves it (the display manager must find it in force).
chroot "$root" dpkg -i "/root/$(basename "$deb")" >"$work/dpkg.log" 2>&1 \
  || { cat "$work/dpkg.log" >&2; die "dpkg -i in the chroot failed"; }
mkdir -p "$root/var/lib/gpuctl"
echo '{"version": 1, "mode": "integrated", "force": true}' >"$root/var/lib/gpuctl/state.json"
# A bind-time rule on the offload GPU, as NVIDIA's runtime-PM rule (udev-checks, issue 22).
cat >"$root/etc/udev/rules.d/80-gpuctl-test.rules" <<'RULES'
ACTION=="bind", SUBSYSTEM=="pci", KERNEL=="0000:00:03.0", ATTR{power/control}="auto", RUN+="/bin/sh -c 'echo bind >/run/gpuctl-udev-bind'"
RULES

# The virtio GPU is bound to virtio-pci (no runtime PM): with the packaged power_off = auto,
# integrated would unbind it (issue 19) and its node would go away; these checks are about
# blocking it (EPERM). The power-off has its own QEMU suite (tests/vm/poweroff-tests.sh).
# The packages ship no /etc/gpuctl/gpuctl.toml (the example is under /usr/share/doc): the
# admin's file is written here, as an admin would.
mkdir -p "$root/etc/gpuctl"
printf '# distro tier: block only (tests/distro/boot.sh)\npower_off = "never"\n' \
  >"$root/etc/gpuctl/gpuctl.toml"
chroot "$root" useradd -m -G gpuctl alice
chroot "$root" useradd -m bob
# A real logind session for alice (checks-desktop): autologin on tty2 (getty@tty2 with
# agetty --autologin, through PAM: pam_systemd registers the session, user@1000 starts her
# systemd --user with PipeWire); her login shell becomes the agent that runs the checks'
# commands inside that session.
mkdir -p "$root/etc/systemd/system/getty@tty2.service.d"
# shellcheck disable=SC2016 # $TERM is the unit's, $(tty) the login shell's
printf '[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin alice --noclear %%I $TERM\n' \
  >"$root/etc/systemd/system/getty@tty2.service.d/autologin.conf"
# shellcheck disable=SC2016
# (alice's login shell is useradd's default, /bin/sh: it reads ~/.profile.)
printf '[ "$(tty)" = /dev/tty2 ] && exec /usr/local/bin/session-agent\n' >"$root/home/alice/.profile"
chroot "$root" chown alice: /home/alice/.profile
echo 'd /run/session-agent 0700 alice alice -' >"$root/etc/tmpfiles.d/session-agent.conf"
# A display manager registers a wayland session (XDG_SESSION_TYPE in the PAM environment
# before pam_systemd): so does this login, so that alice's weston runs in a graphical
# session as under gdm (the split-session guard knows a display server by that).
echo 'XDG_SESSION_TYPE DEFAULT=wayland' >>"$root/etc/security/pam_env.conf"
cat >"$root/etc/systemd/system/stub-dm.service" <<'UNIT'
[Unit]
Description=Stub display manager (gpuctl distro test)
# Ordered like gdm3/sddm/lightdm.
After=systemd-user-sessions.service getty@tty1.service plymouth-quit.service
Conflicts=getty@tty1.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/stub-dm

[Install]
Alias=display-manager.service
UNIT
cat >"$root/etc/systemd/system/gpuctl-distro-test.service" <<'UNIT'
[Unit]
Description=gpuctl distro tier checks
After=graphical.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/distro-checks
StandardOutput=tty
StandardError=inherit
TTYPath=/dev/ttyS0

[Install]
WantedBy=graphical.target
UNIT
systemctl --root="$root" --quiet enable stub-dm.service gpuctl-distro-test.service getty@tty2.service
# gpuctl's net.hadess.SwitcherooControl is the one desktops see (issue 20); the package's
# own daemon is masked, as doctor advises.
systemctl --root="$root" --quiet enable gpuctl-switcheroo.service
systemctl --root="$root" --quiet mask switcheroo-control.service
systemctl --root="$root" --quiet set-default graphical.target
systemctl --root="$root" --quiet mask serial-getty@ttyS0.service getty@tty1.service \
  apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service 2>/dev/null || true
img=$work/root.ext4
mke2fs -q -t ext4 -L gpuctl-root -d "$root" "$img" 2560M
rm -rf "$root"

# --- boot -------------------------------------------------------------------------------
no_bpf_lsm=$(echo "${CONFIG_LSM:?kernel.env names no CONFIG_LSM}" | tr ',' '\n' | grep -vx bpf | paste -sd, -)
rc=0
for label in main fallback; do
  [[ -z $only || $only == "$label" ]] || continue
  append="console=ttyS0 panic=-1 quiet systemd.show_status=false root=/dev/vda gpuctl_test=$label"
  [[ $label == fallback ]] && append="$append lsm=$no_bpf_lsm"
  blog=$logdir/boot-$label.log
  start=$SECONDS
  # shellcheck disable=SC2054 # commas are QEMU's
  cmd=(qemu-system-x86_64 -accel tcg -machine pc -nodefaults -display none -m 1024 -smp 2
    -device VGA,addr=02.0 -device virtio-gpu-pci,addr=03.0,multifunction=on
    -device intel-hda,addr=03.1 -device hda-output,audiodev=snd0 -audiodev none,id=snd0
    -drive "file=$img,if=virtio,format=raw" -snapshot
    -serial stdio -no-reboot -kernel "$kernel" -initrd "$work/initrd.gz" -append "$append")
  if ((verbose)); then
    timeout -k 5 720 "${cmd[@]}" </dev/null 2>&1 | sed -u 's/\r//g' | tee "$blog" || true
  else
    timeout -k 5 720 "${cmd[@]}" </dev/null 2>&1 | sed -u 's/\r//g' >"$blog" || true
  fi
  # The desktop clients' table (checks-desktop): docs/DESKTOP-CLIENTS.md is made from it.
  sed -n 's/^TABLE|//p' "$blog" >"$logdir/desktop-$label.txt"
  status=$(sed -n 's/^GPUCTL-VM-EXIT \([0-9]*\).*/\1/p' "$blog" | tail -n1)
  counts=$(sed -n 's/^distro-checks: \([0-9]* passed, [0-9]* failed\)$/\1/p' "$blog" | tail -n1)
  if [[ $status == 0 ]]; then
    echo "distro: boot $label: ${counts:-?} ($((SECONDS - start)) s)"
  else
    rc=1
    echo "distro: boot $label: FAILED (${counts:-no result}, exit ${status:-none}, $((SECONDS - start)) s; log $blog)"
    grep -E '^(FAIL|distro-checks:)' "$blog" || tail -n 40 "$blog"
  fi
done
exit $rc
