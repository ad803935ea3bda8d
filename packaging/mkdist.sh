#!/usr/bin/env bash
# make dist: the release source tarball distributions build from, offline.
#
# Usage: packaging/mkdist.sh [OUTDIR]          (default OUTDIR: target/dist)
#
# Writes OUTDIR/gpuctl-VERSION.tar.gz: the project's files (tracked plus untracked
# not-ignored ones, so a work in progress can be packaged too) and vendor/ (every crate
# of Cargo.lock, from `cargo vendor`), with .cargo/config.toml pointing cargo at vendor/
# so `cargo build --frozen` needs no network. Reproducible for a given tree: sorted
# names, owner 0, mtimes from the last commit (SOURCE_DATE_EPOCH), gzip -n.
# Also writes OUTDIR/gpuctl-VERSION.tar.gz.sha256 and OUTDIR/PKGBUILD (+ gpuctl.install):
# packaging/arch/PKGBUILD with the tarball's sha256 filled in.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${1:-$repo/target/dist}
die() { echo "mkdist: error: $*" >&2; exit 1; }

cd "$repo"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
[[ -n $version ]] || die "no version in Cargo.toml"
name=gpuctl-$version
git rev-parse --git-dir >/dev/null 2>&1 || die "needs a git checkout (and git)"
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct)}"
export SOURCE_DATE_EPOCH

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name"
# Tracked and untracked-but-not-ignored files that exist (a deleted file is skipped).
git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do [[ -e $f || -L $f ]] && printf '%s\0' "$f"; done \
  | tar --null -T - -cf - | tar -xf - -C "$stage/$name"

# Vendor every crate of Cargo.lock and point cargo at them.
if ! (cd "$stage/$name" && cargo vendor --locked --versioned-dirs vendor >"$stage/vendor.toml" 2>"$stage/vendor.log"); then
  cat "$stage/vendor.log" >&2
  die "cargo vendor failed (it needs the crates: network or a filled ~/.cargo/registry)"
fi
{
  echo
  echo "# Added by make dist: build from the vendored crates, without network."
  cat "$stage/vendor.toml"
} >>"$stage/$name/.cargo/config.toml"

mkdir -p "$out"
tarball=$out/$name.tar.gz
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -C "$stage" -cf - "$name" | gzip -n -6 >"$tarball.tmp"
mv "$tarball.tmp" "$tarball"
sum=$(sha256sum "$tarball" | cut -d' ' -f1)
echo "$sum  $name.tar.gz" >"$tarball.sha256"
sed "s/^sha256sums=.*/sha256sums=('$sum')/" packaging/arch/PKGBUILD >"$out/PKGBUILD"
cp packaging/arch/gpuctl.install "$out/"
echo "mkdist: $tarball ($(du -h "$tarball" | cut -f1), sha256 $sum)"
