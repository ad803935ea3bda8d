#!/usr/bin/env bash
# bench/vm-lsm.sh BIN: the per-call cost of the lsm backend's programs, which
# cannot attach on our CI machine kind (BPF trampolines are refused), measured
# in the QEMU tier on Debian's stock 6.1 kernel next to the cgroup backend.
# Figures are TCG-emulated: compare programs within one run, not with the
# bare-metal table of `make bench`. Not part of `make bench` (it boots a VM).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: bench/vm-lsm.sh STATIC_GPUCTL}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${CC:-gcc}" -static -O2 -Wall -o "$tmp/vmloop" "$here/vmloop.c"
"$here/../tests/vm/run.sh" --binary "$bin" --script "$here/vm-lsm-guest.sh" \
	--add "$tmp/vmloop:/bin/vmloop" --name vm-lsm --timeout 300 --quiet --log "$tmp/console.log" || {
	tail -40 "$tmp/console.log"
	exit 1
}
grep -a '^vmlsm' "$tmp/console.log" | sed 's/^vmlsm //'
