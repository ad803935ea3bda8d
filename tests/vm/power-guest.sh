#!/bin/sh
# Tier-3 power checks (busybox sh, /test.sh of the q35 boot of tests/vm/power-tests.sh).
# The GPU under test is the virtio GPU behind a PCIe root port (0000:01:00.0), rebound to
# vfio-pci, with an ACPI power resource: a real D3cold device. Prints "PASS name",
# "FAIL name: details" or "SKIP name: why" per check, "== …" lines with real output (the
# README quotes them), and last "N passed, M failed, K skipped". Exit 0 if nothing failed.

export GPUCTL_STATE_DIR=/tmp/state GPUCTL_CONFIG=/tmp/gpuctl.toml
unset NOTIFY_SOCKET GPUCTL_SOCKET
mkdir -p "$GPUCTL_STATE_DIR"
KV=$(uname -r)

# shellcheck source=tests/vm/guest-lib.sh
. /guest-lib.sh
# num FILE KEY: the first numeric value of "KEY": in pretty-printed JSON.
num() { sed -n "s/.*\"$2\": \\([0-9.]*\\).*/\\1/p" "$1" | grep -m1 .; }
finish() {
  [ -n "$dpid" ] && stop_daemon
  results
  exit
}

for m in irqbypass vfio vfio_iommu_type1 vfio_virqfd vfio-pci-core vfio-pci; do
  insmod "/lib/modules/$KV/extra/$m.ko" || echo "guest: insmod $m failed"
done
D=
for x in /sys/bus/pci/devices/*; do
  [ "$(cat "$x/vendor"):$(cat "$x/device")" = 0x1af4:0x1050 ] && D=$x
done
P=${D##*/}
CONFIG=$D/config
expect "setup: the virtio GPU sits behind the root port" "$P" "0000:01:00.0"
echo "$P" >"$D/driver/unbind"
echo vfio-pci >"$D/driver_override"
echo "$P" >/sys/bus/pci/drivers/vfio-pci/bind || echo "guest: binding vfio-pci failed"
state() { echo "$(cat "$D/power_state") $(cat "$D/power/runtime_status")"; }
# wait_state WANT: ≤ 10 s for "power_state runtime_status".
wait_state() {
  ws_i=0
  while [ "$(state)" != "$1" ] && [ $ws_i -lt 100 ]; do usleep 100000; ws_i=$((ws_i + 1)); done
  state
}
expect "setup: vfio-pci puts the GPU in D3cold" "$(wait_state "D3cold suspended")" "D3cold suspended"
echo "guest: firmware node $(cat "$D/firmware_node/path" 2>/dev/null)"
# The root port above the GPU (watched as its bridge). QEMU's does not runtime-suspend (the
# GPU's own power resource gives it D3cold); where it does, its wake is attributed too.
BR=$(readlink -f "$D/..")
echo "guest: root port ${BR##*/}: control $(cat "$BR/power/control"), $(cat "$BR/power/runtime_status")"

dpid=
start_daemon() { # BACKEND LOG
  gpuctl daemon --backend "$1" 2>"$2" &
  dpid=$!
  await_daemon "$dpid" 100
}
stop_daemon() {
  kill "$dpid" 2>/dev/null
  wait "$dpid"
  dpid=
}
# reader: read 256 bytes of the GPU's config as a process named `lspci` (what lspci does:
# busybox's dd, exec'd from a file named lspci); prints its pid, dd's words, "rc=STATUS".
cp /bin/busybox /tmp/lspci
reader() {
  rd_out=$(sh -c 'echo $$; exec -a dd /tmp/lspci if='"$CONFIG"' of=/dev/null bs=256 count=1 2>&1')
  rd_rc=$?
  echo "$(echo "$rd_out" | tr '\n' ' ')rc=$rd_rc"
}
ctxsw() { awk '/ctxt_switches/ { n += $2 } END { print n }' "/proc/$dpid/status"; }

# ---------------------------------------------------------------- lsm backend
if ! start_daemon lsm /tmp/daemon-lsm.log; then
  fail "daemon --backend lsm starts" "$(cat /tmp/daemon-lsm.log)"
  finish
fi
pass "daemon --backend lsm starts"
gpuctl status --json >/tmp/s1.json
contains "status reports D3cold" "$(grep -m1 '"power_state"' /tmp/s1.json)$(grep '"power_state"' /tmp/s1.json | tail -n1)" '"D3cold"'
contains "status: the runtime-PM programs are running" "$(grep -A1 '"power_monitor"' /tmp/s1.json)" '"running": true'
gpuctl list --json >/tmp/l1.json
contains "list --json: can_sleep true" "$(cat /tmp/l1.json)" '"can_sleep": true'
contains "list --json: D3cold reachable" "$(cat /tmp/l1.json)" '"d3cold": true'
contains "list --json: runtime_pm watches the root port" "$(cat /tmp/l1.json)" '"role": "bridge"'
a1=$(num /tmp/s1.json asleep_s)
# Idle: nothing happens for 5 s, and the daemon must not run at all (no polling).
c0=$(ctxsw)
sleep 5
c1=$(ctxsw)
expect "idle daemon: 0 context switches in 5 s" "$((c1 - c0))" 0
gpuctl status --json >/tmp/s2.json
a2=$(num /tmp/s2.json asleep_s)
if awk -v a="$a1" -v b="$a2" 'BEGIN { exit !(b >= a + 4) }'; then
  pass "asleep residency grows ($a1 s -> $a2 s over 5 s)"
else
  fail "asleep residency grows" "asleep_s $a1 -> $a2 over 5 s"
fi
w0=$(num /tmp/s2.json wakes)
expect "no wake yet" "$w0" 0
echo "== gpuctl status (asleep, lsm)"
gpuctl status

# A named process reads config: a wake event names it and the file.
gpuctl events --json >/tmp/ev1.json 2>&1 &
epid=$!
usleep 300000
br_before=$(cat "$BR/power/runtime_status")
r=$(reader)
rpid=${r%% *}
contains "lspci reads config while unblocked" "$r" "rc=0"
wait_state "D3cold suspended" >/dev/null
usleep 300000
kill "$epid" 2>/dev/null
wait "$epid" 2>/dev/null
echo "== gpuctl events --json (lspci pid $rpid read config)"
cat /tmp/ev1.json
wake=$(grep '"event":"wake"' /tmp/ev1.json | grep '"role":"gpu"')
contains "wake event names the process" "$wake" "\"comm\":\"lspci\""
contains "wake event has its pid" "$wake" "\"tgid\":$rpid"
contains "wake event names the file" "$wake" '"what":"read /sys/bus/pci/devices/0000:01:00.0/config"'
contains "wake event has uid" "$wake" '"uid":0'
if [ "$br_before" = suspended ]; then
  contains "the bridge's wake is attributed too" "$(grep '"role":"bridge"' /tmp/ev1.json)" "\"tgid\":$rpid"
else
  expect "no bridge wake (the root port never slept)" "$(grep -c '"role":"bridge"' /tmp/ev1.json)" 0
fi
contains "sleep event after the read (back in D3cold)" "$(grep '"event":"sleep"' /tmp/ev1.json)" '"power_state":"D3cold"'
contains "power events carry the state" "$(grep '"event":"power"' /tmp/ev1.json | head -n1)" '"runtime_status":"active"'
gpuctl status --json >/tmp/s3.json
expect "wake count 0 -> 1" "$(num /tmp/s3.json wakes)" 1
aw2=$(num /tmp/s2.json awake_s) aw3=$(num /tmp/s3.json awake_s)
if awk -v a="$aw2" -v b="$aw3" 'BEGIN { exit !(b > a) }'; then
  pass "awake residency grows with the wake ($aw2 s -> $aw3 s)"
else
  fail "awake residency grows with the wake" "awake_s $aw2 -> $aw3"
fi
gpuctl wakes --json >/tmp/w.json
contains "wakes --json lists it with awake_ms" "$(grep -A22 '"role": "gpu"' /tmp/w.json | grep awake_ms)" '"awake_ms": '
echo "== gpuctl status (after one wake)"
gpuctl status
echo "== gpuctl wakes"
gpuctl wakes
echo "== gpuctl list"
gpuctl list
echo "== gpuctl doctor"
gpuctl doctor

# Blocked with the lsm backend: the same read is denied; the GPU stays in D3cold.
gpuctl block 1 >/dev/null
gpuctl events --json >/tmp/ev2.json 2>&1 &
epid=$!
usleep 300000
r=$(reader)
usleep 500000
kill "$epid" 2>/dev/null
wait "$epid" 2>/dev/null
contains "lsm: the blocked GPU's config read is denied (EPERM)" "$r" "Operation not permitted"
expect "lsm: the GPU stays in D3cold" "$(state)" "D3cold suspended"
gpuctl status --json >/tmp/s4.json
expect "lsm: no new wake" "$(num /tmp/s4.json wakes)" 1
contains "lsm: the denial is an event" "$(cat /tmp/ev2.json)" '"event":"denied"'
expect "lsm: no wake event" "$(grep -c '"event":"wake"' /tmp/ev2.json)" 0
echo "== lsm, GPU 1 blocked: lspci's read: $r; GPU now $(state)"
echo "== gpuctl events --json (blocked)"
cat /tmp/ev2.json
# pstat FILE NAME: "run_cnt run_time_ns" of one program in status --json's power_monitor.
pstat() {
  awk -v n="\"$2\"" '$0 ~ "\"name\": " n { f = 1 } f && /run_cnt/ { gsub(/[^0-9]/, ""); c = $0 }
    f && /run_time_ns/ { gsub(/[^0-9]/, ""); print c, $0; exit }' "$1"
}
if [ -w /proc/sys/kernel/bpf_stats_enabled ]; then
  # Per-run cost of the runtime-PM programs (TCG: compare, do not quote as hardware figures).
  echo 1 >/proc/sys/kernel/bpf_stats_enabled
  gpuctl status --json >/tmp/b0.json
  # 200 runtime-PM calls on devices nobody watches (a config read takes a reference on the
  # read function's parent, the root bus): the leave-at-once path.
  for _ in $(seq 1 200); do dd if=/sys/bus/pci/devices/0000:00:01.0/config of=/dev/null bs=64 count=1 2>/dev/null; done
  gpuctl status --json >/tmp/b1.json
  gpuctl unblock 1 >/dev/null
  for _ in 1 2 3 4 5; do reader >/dev/null; wait_state "D3cold suspended" >/dev/null; done
  gpuctl status --json >/tmp/b2.json
  echo 0 >/proc/sys/kernel/bpf_stats_enabled
  for p in gpuctl_rpm_resume gpuctl_rpm_suspend gpuctl_rpm_return_int; do
    # shellcheck disable=SC2046  # word splitting wanted: six numbers
    set -- $(pstat /tmp/b0.json $p) $(pstat /tmp/b1.json $p) $(pstat /tmp/b2.json $p)
    awk -v p=$p -v c0="$1" -v t0="$2" -v c1="$3" -v t1="$4" -v c2="$5" -v t2="$6" 'BEGIN {
      printf "== bpf_stats %s: unwatched %d runs, %d ns/run; 5 wakes: %d runs, %d ns/run (TCG)\n",
        p, c1 - c0, (c1 > c0) ? (t1 - t0) / (c1 - c0) : 0, c2 - c1, (c2 > c1) ? (t2 - t1) / (c2 - c1) : 0 }'
  done
  c=$(pstat /tmp/b2.json gpuctl_rpm_resume)
  if [ "${c%% *}" -gt 0 ] 2>/dev/null; then
    pass "status --json counts the runtime-PM programs' runs"
  else
    fail "status --json counts the runtime-PM programs' runs" "gpuctl_rpm_resume: $c"
  fi
  gpuctl block 1 >/dev/null
fi
stop_daemon

# ---------------------------------------------------------------- cgroup backend
if ! start_daemon cgroup /tmp/daemon-cgroup.log; then
  fail "daemon --backend cgroup starts" "$(cat /tmp/daemon-cgroup.log)"
  finish
fi
pass "daemon --backend cgroup starts (GPU 1 blocked from the saved state)"
expect "cgroup: GPU asleep before the read" "$(state)" "D3cold suspended"
r=$(reader)
contains "cgroup: sysfs is not covered: the read succeeds" "$r" "rc=0"
wait_state "D3cold suspended" >/dev/null
gpuctl wakes --json >/tmp/w2.json
contains "cgroup: and it wakes the blocked GPU (attributed)" "$(grep '"comm"' /tmp/w2.json)" '"lspci"'
echo "== cgroup, GPU 1 blocked: lspci's read: $r"
gpuctl wakes
gpuctl status | grep -A1 '^GPU 1:'
stop_daemon

# ---------------------------------------------------------------- can it sleep at all?
echo on >"$D/power/control"
echo 0 >"$D/d3cold_allowed"
echo "== gpuctl list (power/control = on, d3cold_allowed = 0)"
gpuctl list | tee /tmp/l2.txt
contains "list says the GPU cannot sleep, and the fix" "$(cat /tmp/l2.txt)" \
  "fix: echo auto > /sys/bus/pci/devices/$P/power/control"
expect "runtime PM off: the GPU is awake (D0)" "$(wait_state "D0 active")" "D0 active"
echo "== gpuctl doctor (same)"
gpuctl doctor
# (Writing d3cold_allowed resumes the device: set it before runtime PM goes back on.)
echo 1 >"$D/d3cold_allowed"
echo auto >"$D/power/control"
expect "runtime PM back on: D3cold again" "$(wait_state "D3cold suspended")" "D3cold suspended"
grep -a 'error\|panic' /tmp/daemon-lsm.log /tmp/daemon-cgroup.log | sed 's/^/daemon| /'
finish
