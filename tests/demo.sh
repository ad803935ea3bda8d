#!/usr/bin/env bash
# `make demo`: a real denial, in the kernel, on this machine, in a few lines.
#
# Materializes a fixture Intel + NVIDIA laptop (a faithful sysfs tree: the
# intel_nvidia machine of tests/common/fixture.rs, by examples/fixture.rs), makes
# the dGPU's card node with mknod (226:0), starts the daemon against the
# fixture with its cgroup/dev program governing a demo cgroup, and opens the
# node from a process in that cgroup: denied in integrated mode, allowed in
# hybrid. Everything is removed at the end. Needs root.
#
#   tests/demo.sh [GPUCTL [FIXTURE]]   (target/debug/gpuctl, target/debug/examples/fixture)
set -euo pipefail

BIN=$(realpath "${1:-target/debug/gpuctl}")
FIXTURE=$(realpath "${2:-target/debug/examples/fixture}")
if [ "$(id -u)" != 0 ]; then
	echo "make demo needs root (it loads BPF programs and uses mknod)" >&2
	exit 1
fi

tmp=$(mktemp -d /tmp/gpuctl-demo.XXXXXX)
cg2=$(awk '$9 == "cgroup2" { print $5; exit }' /proc/self/mountinfo)
cg=$cg2/gpuctl-demo-$$
daemon=
cleanup() {
	[ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
	rmdir "$cg" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

"$FIXTURE" intel_nvidia "$tmp"
mkdir -p "$cg" "$tmp/dev"
mknod -m 666 "$tmp/dev/card0" c 226 0

export GPUCTL_SOCKET=$tmp/gpuctl.sock GPUCTL_SYSFS_ROOT=$tmp/sys GPUCTL_PROCFS_ROOT=$tmp/proc \
	GPUCTL_STATE_DIR=$tmp/state GPUCTL_CONFIG=$tmp/gpuctl.toml
"$BIN" daemon --cgroup "$cg" 2>"$tmp/daemon.log" &
daemon=$!
for _ in $(seq 100); do "$BIN" get >/dev/null 2>&1 && break; sleep 0.05; done

show() {
	printf '\n\033[1m$ %s\033[0m\n' "$*"
	"$@"
}
try_open() {
	printf '\n\033[1m# a process in the governed cgroup opens the dGPU node (226:0)\033[0m\n'
	if out=$(sh -c 'echo $$ > "$1/cgroup.procs"; exec 3<>"$2"' _ "$cg" "$tmp/dev/card0" 2>&1); then
		echo "opened"
	else
		case $out in
		*"Operation not permitted"*) echo "DENIED by gpuctl (EPERM): the GPU stays asleep" ;;
		*"No such device or address"*) echo "allowed: the kernel let it through (ENXIO only because this machine has no GPU driver)" ;;
		*) echo "unexpected: $out" ;;
		esac
	fi
}

show "$BIN" list
show "$BIN" set integrated
try_open
show "$BIN" status
show "$BIN" set hybrid
try_open
printf '\n# daemon log:\n'
kill "$daemon"
wait "$daemon" 2>/dev/null || true
daemon=
sed 's/^/  /' "$tmp/daemon.log"
