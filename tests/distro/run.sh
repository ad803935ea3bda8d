#!/usr/bin/env bash
# The distro tier (`make test-distro`, as root): build the packages the way distributions
# do, lint them, then boot Debian 12 with the .deb (tests/distro/boot.sh).
#
# Usage: tests/distro/run.sh [--skip-boot] [--only deb|rpm|arch] TARBALL
#   TARBALL   gpuctl-VERSION.tar.gz from `make dist` (crates vendored)
#
# Every build runs as an unprivileged user (gpuctl-build, created if missing) inside a
# network namespace with no interfaces (`unshare -n`): offline for real, with Debian's
# cargo (cargo-web) and no rustup.
#   deb   dpkg-buildpackage (source + binary, build-deps checked), DEB_BUILD_OPTIONS=nocheck
#         (the unit tests run in `make test`; the log must show no `cargo test`), lintian
#   rpm   rpmbuild -ba --nodeps (Debian's rpm: no rpm database to check BuildRequires;
#         tests/distro/rpm-macros stands in for Fedora's systemd-rpm-macros), rpmlint
#   arch  makepkg --nodeps (Debian's pacman-package-manager: no pacman database)
# Work dir $GPUCTL_DISTRO_CACHE/build.XXXXXX (default /var/cache/gpuctl-test), one per run,
# removed at exit; packages and logs in target/distro/. Prints one line per step and the tier's wall time.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${GPUCTL_DISTRO_CACHE:-/var/cache/gpuctl-test}
out=$repo/target/distro
user=gpuctl-build
skip_boot=0 only='' tarball=''
die() { echo "distro: error: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --skip-boot) skip_boot=1; shift ;;
    --only) only=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) tarball=$1; shift ;;
  esac
done
[[ -f $tarball ]] || die "usage: run.sh [--skip-boot] [--only deb|rpm|arch] gpuctl-VERSION.tar.gz (make dist)"
[[ $(id -u) == 0 ]] || die "needs root (a build user, unshare -n, debootstrap)"
tarball=$(realpath "$tarball")
name=$(basename "$tarball" .tar.gz)
version=${name#gpuctl-}
for t in dpkg-buildpackage lintian rpmbuild rpmlint makepkg unshare runuser; do
  command -v "$t" >/dev/null || die "$t not found (make deps)"
done
t0=$SECONDS
failed=0
mkdir -p "$out" "$cache"
rm -rf "${out:?}/packages"
mkdir -p "$out/packages"
id "$user" >/dev/null 2>&1 || useradd --system --home-dir "$cache/build-home" "$user"
mkdir -p "$cache/build-home"
chown "$user:" "$cache/build-home"
# A work dir of this run's own (two runs on one machine must not wipe each other's build),
# removed when the run ends; the packages and logs are kept in $out.
rm -rf "$cache/build" # the shared work dir of earlier versions of this script
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
chown "$user:" "$work"

# as_builder CMD...: CMD as the build user, offline, with the distribution's toolchain only.
as_builder() {
  unshare -n runuser -u "$user" -- env -i PATH=/usr/bin:/bin:/usr/sbin:/sbin \
    HOME="$cache/build-home" LANG=C.UTF-8 "$@"
}
step() { # step NAME LOG CMD...: run, report, keep going
  local n=$1 logf=$2 s=$SECONDS
  shift 2
  if "$@" >"$logf" 2>&1; then
    echo "distro: $n: ok ($((SECONDS - s)) s)"
  else
    failed=$((failed + 1))
    echo "distro: $n: FAILED ($((SECONDS - s)) s; log $logf)"
    tail -n 25 "$logf"
  fi
}

# --- deb -----------------------------------------------------------------------------------
build_deb() {
  local d=$work/deb
  as_builder mkdir -p "$d"
  as_builder cp "$tarball" "$d/gpuctl_$version.orig.tar.gz"
  as_builder tar -C "$d" -xzf "$d/gpuctl_$version.orig.tar.gz"
  as_builder cp -a "$d/$name/packaging/debian" "$d/$name/debian"
  (cd "$d/$name" && as_builder DEB_BUILD_OPTIONS=nocheck dpkg-buildpackage -us -uc)
  cp "$d"/*.deb "$d"/*.dsc "$d"/*.debian.tar.* "$out/packages/"
}
check_nocheck() {
  if grep -n 'cargo test' "$out/deb-build.log"; then
    echo "DEB_BUILD_OPTIONS=nocheck was not honoured: debian/rules ran the tests (above)"
    return 1
  fi
  echo "no cargo test in $out/deb-build.log"
}
lint_deb() {
  local d=$work/deb
  as_builder lintian --fail-on error --display-info "$d"/gpuctl_*.changes
}
# --- rpm -----------------------------------------------------------------------------------
build_rpm() {
  local d=$work/rpm
  as_builder mkdir -p "$d/SOURCES"
  as_builder cp "$tarball" "$d/SOURCES/"
  as_builder cp "$repo/packaging/sysusers.d/gpuctl.conf" "$d/SOURCES/gpuctl.sysusers"
  as_builder cp "$repo/packaging/rpm/gpuctl.spec" "$repo/tests/distro/rpm-macros" "$d/"
  as_builder rpmbuild --load "$d/rpm-macros" --define "_topdir $d" --nodeps --nocheck \
    -ba "$d/gpuctl.spec"
  cp "$d"/RPMS/*/*.rpm "$d"/SRPMS/*.rpm "$out/packages/"
}
lint_rpm() {
  local d=$work/rpm
  as_builder cp "$repo/packaging/rpm/gpuctl.rpmlintrc" "$d/"
  as_builder rpmlint -r "$d/gpuctl.rpmlintrc" "$d"/RPMS/*/*.rpm "$d/gpuctl.spec"
}
# --- arch ----------------------------------------------------------------------------------
build_arch() {
  local d=$work/arch
  as_builder mkdir -p "$d"
  as_builder cp "$tarball" "$(dirname "$tarball")/PKGBUILD" "$repo/packaging/arch/gpuctl.install" "$d/"
  # Debian keeps libelf.a and libz.a here, Arch in /usr/lib (the PKGBUILD's default).
  (cd "$d" && as_builder LIBBPF_SYS_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu \
    makepkg --nodeps --nocheck --noconfirm)
  cp "$d"/*.pkg.tar.* "$out/packages/"
}

if [[ -z $only || $only == deb ]]; then
  step "deb: dpkg-buildpackage (offline, nocheck)" "$out/deb-build.log" build_deb
  step "deb: nocheck honoured (no cargo test)" "$out/deb-nocheck.log" check_nocheck
  step "deb: lintian" "$out/deb-lintian.log" lint_deb
  grep -E '^[EW]:' "$out/deb-lintian.log" | sed 's/^/distro:   /' || true
fi
if [[ -z $only || $only == rpm ]]; then
  step "rpm: rpmbuild -ba (offline)" "$out/rpm-build.log" build_rpm
  step "rpm: rpmlint" "$out/rpm-lint.log" lint_rpm
  # One line per kept tag (packaging/README.md says why each is kept).
  sed -n 's/.*: \([EW]\): \([^ ]*\).*/\1 \2/p' "$out/rpm-lint.log" | sort | uniq -c \
    | awk '{ printf "distro:   %s: %s (%d)\n", $2, $3, $1 }' || true
fi
if [[ -z $only || $only == arch ]]; then
  step "arch: makepkg (offline, unprivileged)" "$out/arch-build.log" build_arch
fi
if ((skip_boot == 0)) && [[ -z $only || $only == deb ]]; then
  deb=$(find "$out/packages" -name 'gpuctl_*_amd64.deb' | head -n1)
  if [[ -n $deb ]]; then
    "$here/boot.sh" "$deb" || failed=$((failed + 1))
  else
    echo "distro: boot: SKIPPED (no .deb was built)"
    failed=$((failed + 1))
  fi
fi
echo "distro: $((SECONDS - t0)) s wall, $failed failed step(s); packages in $out/packages"
((failed == 0))
