#!/bin/sh
# Runs inside the QEMU tier (see bench/vm-lsm.sh): per-call cost of each
# attached gpuctl program, from the kernel's own bpf_stats, for the lsm and
# the cgroup backend, under the same guest and load. TCG inflates every
# figure; the ratios between programs in one guest are what carry over.
export GPUCTL_STATE_DIR=/tmp/state GPUCTL_CONFIG=/tmp/gpuctl.toml
N=${VMLSM_N:-20000}
echo 1 >/proc/sys/kernel/bpf_stats_enabled

# prog_stats PID: "prog_id type run_cnt run_time_ns" per BPF program fd of PID
# (prog_type 29 = lsm, 15 = cgroup_device, 26 = tracing).
prog_stats() {
	for f in /proc/"$1"/fdinfo/*; do
		awk '/^prog_type:/ { t = $2 } /^prog_id:/ { id = $2 } /^run_cnt:/ { c = $2 }
		     /^run_time_ns:/ { r = $2 } END { if (t != "" && id != "") print id, t, c, r }' "$f" 2>/dev/null
	done | sort -u
}

# measure LABEL PID CMD...: per-call ns of every program that ran during CMD.
measure() {
	label=$1 pid=$2
	shift 2
	prog_stats "$pid" >/tmp/before
	"$@" >/tmp/loop
	prog_stats "$pid" >/tmp/after
	awk -v l="$label" -v n="$N" '
		NR == FNR { c[$1] = $3; r[$1] = $4; next }
		($1 in c) { dc = $3 - c[$1]; dt = $4 - r[$1]
		  if (dc >= n / 2) printf "vmlsm %-34s prog %s (type %s) calls/op %.2f  ns/call %d\n", l, $1, $2, dc / n, dt / dc }
	' /tmp/before /tmp/after
	sed "s/^/vmlsm   /" /tmp/loop
}

run_backend() {
	b=$1
	gpuctl daemon --backend "$b" 2>/tmp/d-"$b".log &
	dpid=$!
	i=0
	while ! gpuctl get >/dev/null 2>&1 && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
	gpuctl set integrated --force >/dev/null
	echo "vmlsm backend $(gpuctl status --json | grep '"backend"' | head -1 | tr -d ' ,')"
	measure "$b: open regular file" "$dpid" vmloop /etc/passwd "$N"
	measure "$b: stat regular file" "$dpid" vmloop /etc/passwd "$N" stat
	measure "$b: open /dev/null" "$dpid" vmloop /dev/null "$N"
	measure "$b: open allowed GPU node card0" "$dpid" vmloop /dev/dri/card0 "$N"
	measure "$b: open blocked GPU node card1" "$dpid" vmloop /dev/dri/card1 "$N"
	measure "$b: stat blocked GPU node card1" "$dpid" vmloop /dev/dri/card1 "$N" stat
	measure "$b: open blocked sysfs config" "$dpid" vmloop /sys/bus/pci/devices/0000:00:03.0/config "$N"
	kill "$dpid"
	wait "$dpid" 2>/dev/null
}

# Baseline wall time with nothing attached.
vmloop /etc/passwd "$N" | sed 's/^/vmlsm baseline /'
vmloop /dev/dri/card0 "$N" | sed 's/^/vmlsm baseline /'
run_backend lsm
run_backend cgroup
echo 0 >/proc/sys/kernel/bpf_stats_enabled
exit 0
