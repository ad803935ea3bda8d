#!/usr/bin/env bash
# Fetch Debian's stock kernel (the package linux-image-amd64 depends on) and extract
# vmlinuz plus the DRM/virtio modules the tier-3 VM needs, with their dependencies.
#
# Usage: tests/vm/fetch-kernel.sh [--refresh]
#   Prints the kernel directory (absolute path) as the last line on stdout.
#   Everything else goes to stderr.
#
# Cache (default <repo>/.cache/vm, override with GPUCTL_VM_CACHE):
#   <cache>/current                        name of the kernel dir in use (e.g. linux-image-6.1.0-57-amd64_6.1.192-3)
#   <cache>/debs/<pkg>_<ver>_amd64.deb     the downloaded package (kept, so re-extraction needs no network)
#   <cache>/<pkg>_<ver>/vmlinuz            the kernel (bzImage, as packaged)
#   <cache>/<pkg>_<ver>/vmlinux            the same kernel decompressed (ELF with a PVH entry note),
#                                          when it could be extracted: QEMU boots it directly,
#                                          which skips ~6 s of XZ decompression under TCG
#   <cache>/<pkg>_<ver>/config             its .config
#   <cache>/<pkg>_<ver>/kernel.env         KVER, PKG, PKG_VERSION, CONFIG_LSM, MODULES
#   <cache>/<pkg>_<ver>/modules.load       the modules to insmod, in dependency order (paths relative to lib/modules/KVER)
#   <cache>/<pkg>_<ver>/root/lib/modules/KVER/...  only the needed modules, plus modules.dep etc. (depmod -b)
#
# A second run with <cache>/current present and complete does no apt/network work at all.
# --refresh (or GPUCTL_VM_REFRESH=1) re-resolves the package name with apt-cache (a newer
# Debian security update changes the ABI name, e.g. 6.1.0-57 -> 6.1.0-58).
#
# Overrides: GPUCTL_VM_KERNEL_PKG (exact package name, skips the apt-cache resolution),
#            GPUCTL_VM_MODULES   (space-separated module names; default "bochs virtio_pci virtio_gpu").
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${GPUCTL_VM_CACHE:-$repo/.cache/vm}
modules_wanted=${GPUCTL_VM_MODULES:-bochs virtio_pci virtio_gpu}
refresh=${GPUCTL_VM_REFRESH:-0}
cache_format=2   # bump when the layout of a kernel dir changes (forces re-extraction, no download)

die() { echo "fetch-kernel: error: $*" >&2; exit 2; }
log() { echo "fetch-kernel: $*" >&2; }

for arg in "$@"; do
  case $arg in
    --refresh) refresh=1 ;;
    -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $arg" ;;
  esac
done

for tool in depmod modprobe dpkg-deb; do
  command -v "$tool" >/dev/null 2>&1 || [[ -x /usr/sbin/$tool || -x /sbin/$tool ]] \
    || die "$tool not found (install the Debian packages kmod and dpkg)"
done
PATH=$PATH:/usr/sbin:/sbin

mkdir -p "$cache/debs"

# A kernel dir is complete when its stamp matches the wanted module list.
is_complete() {
  local dir=$1
  [[ -f $dir/kernel.env && -f $dir/vmlinuz && -f $dir/modules.load ]] || return 1
  # shellcheck disable=SC1091
  ( . "$dir/kernel.env" && [[ "${MODULES:-}" == "$modules_wanted" && "${FORMAT:-}" == "$cache_format" ]] )
}

# --- fast path: cache present, no network, no apt ----------------------------------------
if [[ $refresh != 1 && -z ${GPUCTL_VM_KERNEL_PKG:-} && -f $cache/current ]]; then
  cur=$(<"$cache/current")
  if [[ -n $cur ]] && is_complete "$cache/$cur"; then
    log "using cached kernel $cur"
    echo "$cache/$cur"
    exit 0
  fi
fi

# --- slow path: one run at a time (parallel test runs share the cache) ----------------------
exec 9>"$cache/.lock"
flock 9 || die "cannot lock $cache/.lock"

# --- resolve the package name --------------------------------------------------------------
apt_update_once() {
  if [[ ${_apt_updated:-0} == 1 ]]; then return 1; fi
  _apt_updated=1
  if [[ $(id -u) == 0 ]]; then
    log "apt lists look empty or stale; running apt-get update"
    apt-get update -qq >&2 || die "apt-get update failed (no access to Debian's apt mirrors?)"
    return 0
  fi
  return 1
}

resolve_pkg() {
  # linux-image-amd64 (metapackage) -> Depends: linux-image-6.1.0-NN-amd64
  apt-cache depends linux-image-amd64 2>/dev/null \
    | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n1
}

if [[ -n ${GPUCTL_VM_KERNEL_PKG:-} ]]; then
  pkg=$GPUCTL_VM_KERNEL_PKG
else
  pkg=$(resolve_pkg)
  if [[ -z $pkg ]] && apt_update_once; then pkg=$(resolve_pkg); fi
  [[ -n $pkg ]] || die "cannot resolve the kernel package: 'apt-cache depends linux-image-amd64' names no linux-image-*-amd64 (run 'apt-get update' as root; is this Debian?)"
fi
case $pkg in
  linux-image-6.1.0-*-amd64) ;;
  *) log "warning: $pkg is not a Debian 12 (6.1) kernel; tier-3 facts in tests/vm/README.md were observed on 6.1" ;;
esac

ver=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | sed -n 's/^Version: //p' | head -n1 || true)
if [[ -z $ver ]] && apt_update_once; then
  ver=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | sed -n 's/^Version: //p' | head -n1 || true)
fi
[[ -n $ver ]] || die "apt-cache knows no version of $pkg (run 'apt-get update')"

name="${pkg}_${ver}"
kdir=$cache/$name
deb=$cache/debs/${pkg}_${ver//:/%3a}_amd64.deb

if is_complete "$kdir"; then
  log "using cached kernel $name"
  echo "$name" >"$cache/current"
  echo "$kdir"
  exit 0
fi

# --- download ------------------------------------------------------------------------------
if [[ ! -s $deb ]]; then
  log "downloading $pkg=$ver (about 70 MB) with apt-get download"
  dl=$(mktemp -d "$cache/debs/.dl.XXXXXX")
  trap 'rm -rf "$dl"' EXIT
  apt_opts=()
  # As root, apt drops to the _apt user, which cannot write into our directory.
  [[ $(id -u) == 0 ]] && apt_opts=(-o APT::Sandbox::User=root)
  if ! (cd "$dl" && apt-get download "${apt_opts[@]}" "$pkg=$ver" >&2); then
    if apt_update_once && (cd "$dl" && apt-get download "${apt_opts[@]}" "$pkg=$ver" >&2); then :; else
      die "apt-get download $pkg=$ver failed (no access to Debian's apt mirrors, or the version left the mirror: rerun with --refresh after apt-get update)"
    fi
  fi
  got=$(find "$dl" -maxdepth 1 -name '*.deb' | head -n1)
  [[ -n $got ]] || die "apt-get download produced no .deb"
  mv "$got" "$deb"
  rm -rf "$dl"
  trap - EXIT
else
  log "using cached package $(basename "$deb")"
fi

# --- extract -------------------------------------------------------------------------------
work=$(mktemp -d "$cache/.extract.XXXXXX")
trap 'rm -rf "$work"' EXIT
dpkg-deb -x "$deb" "$work/full" || die "cannot extract $deb (corrupt? delete it and rerun)"

vmlinuz=$(find "$work/full/boot" -maxdepth 1 -name 'vmlinuz-*' | head -n1)
[[ -n $vmlinuz ]] || die "$deb contains no boot/vmlinuz-*"
kver=${vmlinuz##*/vmlinuz-}
[[ -d $work/full/lib/modules/$kver ]] || die "$deb has no lib/modules/$kver"

# The package ships no modules.dep: generate it.
depmod -b "$work/full" "$kver" || die "depmod -b failed"

out=$work/out
mkdir -p "$out/root/lib/modules/$kver"
cp "$vmlinuz" "$out/vmlinuz"
cp "$work/full/boot/config-$kver" "$out/config"
mdir_full=$work/full/lib/modules/$kver
: >"$out/modules.load"
for m in $modules_wanted; do
  # --show-depends prints "insmod /abs/path.ko[.xz|.zst] [params]" lines in load order,
  # or "builtin NAME" for built-in modules.
  deps=$(modprobe -d "$work/full" -S "$kver" --show-depends "$m") \
    || die "module $m not found in $pkg"
  while read -r kind path _; do
    case $kind in
      insmod)
        rel=${path#"$mdir_full"/}
        if ! grep -qxF "$rel" "$out/modules.load"; then
          echo "$rel" >>"$out/modules.load"
          mkdir -p "$out/root/lib/modules/$kver/$(dirname "$rel")"
          cp "$path" "$out/root/lib/modules/$kver/$rel"
        fi ;;
      builtin) log "$path is built in" ;;
      *) die "unexpected modprobe output for $m: $kind $path" ;;
    esac
  done <<<"$deps"
done

# Compressed modules (.ko.xz/.ko.zst/.ko.gz): decompress, so busybox insmod/modprobe can load
# them whatever the kernel's CONFIG_MODULE_DECOMPRESS says. (Debian 6.1 ships plain .ko.)
mroot=$out/root/lib/modules/$kver
while read -r rel; do
  case $rel in
    *.ko) ;;
    *.ko.xz)  xz -dc  "$mroot/$rel" >"$mroot/${rel%.xz}"  && rm "$mroot/$rel" ;;
    *.ko.zst) zstd -qdc "$mroot/$rel" >"$mroot/${rel%.zst}" && rm "$mroot/$rel" ;;
    *.ko.gz)  gzip -dc "$mroot/$rel" >"$mroot/${rel%.gz}"  && rm "$mroot/$rel" ;;
    *) die "unknown module file type: $rel" ;;
  esac
done <"$out/modules.load"
sed -i -E 's/\.ko\.(xz|zst|gz)$/.ko/' "$out/modules.load"

cp "$mdir_full/modules.builtin" "$mdir_full/modules.builtin.modinfo" "$mdir_full/modules.order" "$mroot/" 2>/dev/null || true
depmod -b "$out/root" "$kver" || die "depmod on the module subset failed"

# Decompress the bzImage payload into an ELF vmlinux if it carries a PVH entry note
# (CONFIG_PVH=y; ELF note "Xen" type 0x12). Optional: run.sh falls back to vmlinuz.
extract_vmlinux() {
  local img=$1 dst=$2 magic tool off notes
  command -v readelf >/dev/null || { log "readelf (binutils) missing: no vmlinux, booting the bzImage"; return 1; }
  for magic in xz zstd gzip; do
    case $magic in
      xz)   off=$(LC_ALL=C grep -abo $'\xfd7zXZ\x00' "$img" | head -n1 | cut -d: -f1 || true); tool=(xz -dc --single-stream) ;;
      zstd) off=$(LC_ALL=C grep -abo $'\x28\xb5\x2f\xfd' "$img" | head -n1 | cut -d: -f1 || true); tool=(zstd -dcq) ;;
      gzip) off=$(LC_ALL=C grep -abo $'\x1f\x8b\x08' "$img" | head -n1 | cut -d: -f1 || true); tool=(gzip -dcq) ;;
    esac
    [[ -n $off ]] || continue
    command -v "${tool[0]}" >/dev/null || { log "${tool[0]} missing: no vmlinux, booting the bzImage"; return 1; }
    tail -c +$((off + 1)) "$img" | "${tool[@]}" >"$dst" 2>/dev/null || true
    notes=$(readelf -nW "$dst" 2>/dev/null || true)
    if [[ $notes == *"(0x00000012)"* ]]; then return 0; fi
    rm -f "$dst"
  done
  log "no PVH-capable vmlinux inside the bzImage: booting the bzImage"
  return 1
}
extract_vmlinux "$out/vmlinuz" "$out/vmlinux" || true

config_lsm=$(sed -n 's/^CONFIG_LSM="\(.*\)"$/\1/p' "$out/config")
{
  echo "KVER='$kver'"
  echo "PKG='$pkg'"
  echo "PKG_VERSION='$ver'"
  echo "CONFIG_LSM='$config_lsm'"
  echo "MODULES='$modules_wanted'"
  echo "FORMAT='$cache_format'"
} >"$out/kernel.env"

rm -rf "$kdir"
mv "$out" "$kdir"
rm -rf "$work"
trap - EXIT
echo "$name" >"$cache/current"
log "kernel $kver ($pkg $ver) ready in $kdir"
log "modules: $(tr '\n' ' ' <"$kdir/modules.load")"
echo "$kdir"
