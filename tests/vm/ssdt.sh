#!/usr/bin/env bash
# Compile an ACPI source table (.asl) into the .aml QEMU loads with -acpitable file=…
#
# Usage: tests/vm/ssdt.sh SRC.asl OUT.aml
#   Recompiles only when SRC is newer than OUT. Needs iasl (Debian package acpica-tools,
#   in the Makefile's APT_PACKAGES). Exit 2 on a usage or setup error, 1 if iasl fails.
set -euo pipefail
die() { echo "ssdt: error: $*" >&2; exit 2; }
[[ $# -eq 2 ]] || die "usage: $0 SRC.asl OUT.aml"
src=$1 out=$2
[[ -f $src ]] || die "$src not found"
command -v iasl >/dev/null || die "iasl not found (apt-get install acpica-tools)"
[[ -f $out && $out -nt $src ]] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# iasl names its output after the DefinitionBlock; -p sets the prefix instead.
if ! iasl -p "$tmp/table" "$src" >"$tmp/log" 2>&1; then
  echo "ssdt: iasl failed on $src:" >&2
  cat "$tmp/log" >&2
  exit 1
fi
mkdir -p "$(dirname "$out")"
mv "$tmp/table.aml" "$out"
