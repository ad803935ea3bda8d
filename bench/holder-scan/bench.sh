#!/bin/bash
# bench/holder-scan/bench.sh NPROCxNFDS...: the holder scan under the O_PATH attack (issue 18).
# Run as root from the repository root after `cargo build --example fixture`. Per size: root `who`
# and `set integrated` times, the procfs walk (the CLI's own `who`: what the daemon did before),
# root's worst `get` while 8 connections of uid 60001 ask `who`, and the kernel scan's duration.
set -u
B=${B:-target/debug/gpuctl}
D=${D:-/tmp/gpuctl-holder-bench}; H=$(dirname "$0")
rm -rf "$D"; mkdir -p "$D/state"
target/debug/examples/fixture intel_nvidia "$D/m" >/dev/null
CG=/sys/fs/cgroup/gpuctl-bench-i18; mkdir -p "$CG"
export GPUCTL_SYSFS_ROOT="$D/m"/sys GPUCTL_PROCFS_ROOT=/proc GPUCTL_STATE_DIR="$D/state" GPUCTL_CONFIG="$D/c".toml GPUCTL_SOCKET="$D/sock"
"$B" daemon --cgroup "$CG" 2>"$D/daemon".log & DPID=$!
for _ in $(seq 50); do [ -S "$D/sock" ] && break; sleep 0.1; done
ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N); echo $(( (t1-t0)/1000000 )); }
for spec in "$@"; do
  np=${spec%x*}; nf=${spec#*x}
  python3 "$H"/hogs.py "$np" "$nf" 60001 > "$D/pids" & HP=$!
  for _ in $(seq 600); do [ -s "$D/pids" ] && break; sleep 0.1; done
  read -r -a pids < "$D/pids"
  for p in "${pids[@]}"; do while [ "$(find "/proc/$p/fd" -mindepth 1 2>/dev/null | wc -l)" -lt "$nf" ]; do sleep 0.2; done; done
  k=""; for _ in 1 2 3; do sleep 0.3; k="$k $(ms "$B" who --json)"; done
  s=""; for _ in 1 2; do "$B" set hybrid >/dev/null; s="$s $(ms "$B" set integrated)"; done; "$B" set hybrid >/dev/null
  w=""; for _ in 1 2; do w="$w $(GPUCTL_SOCKET="$D/none" ms "$B" who --json)"; done
  g=$(python3 "$H"/attack.py "$D/sock" 60001 4); sc=$(python3 "$H"/scantime.py "$D/sock")
  echo "procs=$np fds_each=$nf total=$((np*nf)) who_ms:$k set_integrated_ms:$s walk_ms:$w worst_root_get_under_8_askers_ms: $g kernel_scan_ms: $sc"
  pkill -P "$HP" 2>/dev/null; kill "$HP"; wait "$HP" 2>/dev/null; rm -f "$D/pids"
done
kill "$DPID"; wait "$DPID"; rmdir "$CG"
