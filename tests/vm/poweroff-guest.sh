#!/bin/sh
# Tier-3 power-off checks (busybox sh, /test.sh of the q35 boot of tests/vm/poweroff-tests.sh).
# The GPU under test is the virtio GPU (0000:01:00.0) bound to virtio-pci, a driver without
# runtime PM (it stays in D0 while bound, like a pre-Turing NVIDIA GPU on the proprietary
# driver), behind a root port whose ACPI node has a _PR3 power resource
# (tests/vm/poweroff-port.asl; CMOS 0x73/0x74 count its _OFF/_ON calls). gpuctl does the
# work: integrated with power_off = auto cuts the rail, hybrid brings the GPU back. Prints
# "PASS name", "FAIL name: details", "== ..." lines with real output (docs quote them),
# "TIME name ms" lines, and last "N passed, M failed, K skipped".
# QEMU reports the virtio GPU's connector connected (and a rebind brings it back connected),
# so every `set integrated` here carries --force.

export GPUCTL_STATE_DIR=/tmp/state GPUCTL_CONFIG=/tmp/gpuctl.toml
unset NOTIFY_SOCKET GPUCTL_SOCKET
mkdir -p "$GPUCTL_STATE_DIR"

# shellcheck source=tests/vm/guest-lib.sh
. /guest-lib.sh
finish() {
  [ -n "$dpid" ] && stop_daemon
  results
  exit
}
ms() { awk '{ printf "%d", $1 * 1000 }' /proc/uptime; }

KV=$(uname -r)
snd_order=
[ -f /etc/gpuctl-vm/snd-order ] && read -r snd_order </etc/gpuctl-vm/snd-order
for m in $snd_order; do
  insmod "/lib/modules/$KV/extra/$m.ko" || echo "guest: insmod $m failed"
done
D=
for x in /sys/bus/pci/devices/*; do
  [ "$(cat "$x/vendor"):$(cat "$x/device")" = 0x1af4:0x1050 ] && D=$x
done
[ -n "$D" ] || { fail "setup: a virtio GPU" "none"; finish; }
G=${D##*/}
P=$(readlink -f "$D/..")
PB=${P##*/}
A=/sys/bus/pci/devices/${G%.0}.1
expect "setup: the virtio GPU sits behind the root port" "$G $PB" "0000:01:00.0 0000:00:02.0"
cmos() {
  # shellcheck disable=SC2059  # the byte to write is the format, as an octal escape
  printf "\\$(printf %03o "$1")" | dd of=/dev/port bs=1 seek=112 count=1 2>/dev/null
  dd if=/dev/port bs=1 skip=113 count=1 2>/dev/null | od -An -tu1 | tr -d ' '
}
drv() { basename "$(readlink "$1/driver" 2>/dev/null)" 2>/dev/null; }
st() {
  echo "gpu $(cat "$D/power_state") drv=$(drv "$D") port $(cat "$P/power_state") _OFF=$(cmos 115) _ON=$(cmos 116)"
}
ps() { cat "$D/power_state"; }
# diag: runtime PM of the slot's functions and the port (for a failure's log).
diag() {
  for x in "$D" "$A" "$P"; do
    [ -d "$x" ] || continue
    echo "guest: ${x##*/}: $(cat "$x/power_state") control=$(cat "$x/power/control") rt=$(cat "$x/power/runtime_status") kids=$(cat "$x/power/runtime_active_kids" 2>/dev/null) usage=$(cat "$x/power/runtime_usage" 2>/dev/null) d3cold_allowed=$(cat "$x/d3cold_allowed")"
  done
}
# wait_ps WANT [TENTHS]: until the GPU's power_state is WANT (default 15 s).
wait_ps() {
  wp_i=0
  while [ "$(ps)" != "$1" ] && [ $wp_i -lt "${2:-150}" ]; do usleep 100000; wp_i=$((wp_i + 1)); done
  ps
}
# wait_node PATH: until PATH exists (15 s).
wait_node() {
  wn_i=0
  while [ ! -e "$1" ] && [ $wn_i -lt 150 ]; do usleep 100000; wn_i=$((wn_i + 1)); done
  [ -e "$1" ] && echo present || echo missing
}
echo "guest: initial: $(st); audio function: $(drv "$A" || true)"
expect "setup: virtio-pci drives the GPU, which stays in D0" "$(drv "$D") $(ps)" "virtio-pci D0"
HDA=0
sn_i=0
while [ ! -e /dev/snd/controlC0 ] && [ $sn_i -lt 100 ]; do usleep 100000; sn_i=$((sn_i + 1)); done
if [ "$(drv "$A")" = snd_hda_intel ] && [ -e /dev/snd/controlC0 ]; then
  HDA=1
  pass "setup: snd_hda_intel drives the HDA function at .1 ($(echo /dev/snd/*))"
else
  fail "setup: snd_hda_intel drives the HDA function at .1" "driver '$(drv "$A")', /dev/snd: $(ls /dev/snd 2>&1)"
fi
off0=$(cmos 115)

dpid=
start_daemon() { # LOG
  gpuctl daemon --backend lsm 2>"$1" &
  dpid=$!
  await_daemon "$dpid" 150
}
stop_daemon() {
  kill "$dpid" 2>/dev/null
  wait "$dpid"
  dpid=
}

# ------------------------------------------------------------ power_off = never
echo 'power_off = "never"' >"$GPUCTL_CONFIG"
if ! start_daemon /tmp/daemon1.log; then
  fail "daemon starts" "$(cat /tmp/daemon1.log)"
  finish
fi
pass "daemon starts"
gpuctl set integrated --force >/dev/null
sleep 5
expect "power_off = never: integrated blocks only, the GPU stays in D0 and bound" \
  "$(ps) $(drv "$D") $(cmos 115)" "D0 virtio-pci $off0"
gpuctl status --json >/tmp/s0.json
contains "power_off = never: status has no power-off" "$(grep '"power_off"' /tmp/s0.json)" '"power_off": null'

# ------------------------------------------------------------ power_off = auto
gpuctl set hybrid >/dev/null
gpuctl config power_off auto >/tmp/cfg.out 2>&1 || fail "gpuctl config power_off auto" "$(cat /tmp/cfg.out)"
t0=$(ms)
gpuctl set integrated --force >/dev/null
got=$(wait_ps D3cold)
t1=$(ms)
expect "integrated, power_off = auto: the GPU is in D3cold" "$got" D3cold
echo "TIME set-integrated-to-D3cold $((t1 - t0)) ms"
echo "guest: after integrated: $(st)"
diag
expect "the root port is in D3cold too" "$(cat "$P/power_state")" D3cold
expect "the rail's _OFF was called" "$(cmos 115)" "$((off0 + 1))"
expect "the GPU's driver is unbound" "$(drv "$D")" ""
expect "the DRM node is gone" "$([ -e /dev/dri/card1 ] && echo present || echo gone)" gone
if [ $HDA = 1 ]; then
  expect "the audio function's driver is unbound" "$(drv "$A")" ""
fi
expect "gpuctl set auto on the port" "$(cat "$P/power/control") $(cat "$P/d3cold_allowed")" "auto 1"
echo "== gpuctl status (integrated, powered off)"
gpuctl status
gpuctl status --json >/tmp/s1.json
contains "status --json: power_off state off" "$(cat /tmp/s1.json)" '"state": "off"'
contains "status --json: power_off power_state D3cold" "$(grep -A8 '"power_off": {' /tmp/s1.json)" '"power_state": "D3cold"'
contains "status names what was unbound" "$(cat /tmp/s1.json)" "\"$G=virtio-pci\""
if [ $HDA = 1 ]; then
  contains "status: audio unbound first, then the GPU" "$(tr -d ' \n' </tmp/s1.json)" "\"unbound\":[\"${A##*/}=snd_hda_intel\",\"$G=virtio-pci\"]"
fi

# ------------------------------------------------------------ hybrid: back
t0=$(ms)
gpuctl set hybrid >/dev/null
got=$(wait_node /dev/dri/card1)
t1=$(ms)
expect "hybrid: the DRM node is back" "$got" present
echo "TIME set-hybrid-to-node $((t1 - t0)) ms"
expect "hybrid: virtio-pci bound again, D0" "$(drv "$D") $(ps)" "virtio-pci D0"
if [ $HDA = 1 ]; then
  expect "hybrid: snd_hda_intel bound again, its control node back" \
    "$(drv "$A") $(wait_node /dev/snd/controlC0)" "snd_hda_intel present"
fi
# The node appears during the bind; the attributes are put back right after it returns.
wc_i=0
while [ "$(cat "$D/power/control")" != on ] && [ $wc_i -lt 20 ]; do usleep 100000; wc_i=$((wc_i + 1)); done
expect "hybrid: power/control put back" "$(cat "$D/power/control") $(cat "$P/d3cold_allowed")" "on 0"
usleep 500000
contains "hybrid: an open of the card works" "$(vmopen /dev/dri/card1)" "ok"
gpuctl status --json >/tmp/s2.json
contains "hybrid: no power-off in status" "$(grep '"power_off"' /tmp/s2.json | tail -n1)" '"power_off": null'

# ------------------------------------------------------------ a holder
holdopen holder /dev/dri/card1 >/tmp/hold.out &
hpid=$!
apid=
if [ $HDA = 1 ]; then
  # What PipeWire does: hold the card's control node.
  holdopen pipewire /dev/snd/controlC0 >/tmp/hold-snd.out &
  apid=$!
fi
usleep 500000
gpuctl set integrated --force >/dev/null
sleep 3
expect "a holder: the block is in force but the GPU stays in D0, bound" "$(ps) $(drv "$D")" "D0 virtio-pci"
contains "a holder: new opens are denied" "$(vmopen /dev/dri/card1)" "EPERM"
gpuctl status >/tmp/st3.txt
echo "== gpuctl status (integrated, a process holds card1)"
cat /tmp/st3.txt
contains "a holder: the refusal names it" "$(cat /tmp/st3.txt)" "holder (pid $hpid)"
if [ -n "$apid" ]; then
  contains "a holder of the audio function's control node is named too" "$(cat /tmp/st3.txt)" "pipewire (pid $apid) on /dev/snd/controlC0"
  kill "$apid"
  wait "$apid" 2>/dev/null
  sleep 3
  expect "the audio holder gone, the card holder left: still refused, D0" "$(ps)" D0
fi
kill "$hpid"
wait "$hpid" 2>/dev/null
expect "the holder exits: the power-off follows" "$(wait_ps D3cold)" D3cold

# ------------------------------------------------------------ someone rebinds
off1=$(cmos 115)
echo "$G" >/sys/bus/pci/drivers_probe
echo "guest: after drivers_probe: $(drv "$D")"
usleep 300000
expect "a rebind by someone else: powered off again" "$(wait_ps D3cold)" D3cold
expect "a rebind by someone else: _OFF called again" "$(cmos 115)" "$((off1 + 1))"
expect "a rebind by someone else: unbound again" "$(drv "$D")" ""

# ------------------------------------------------------------ daemon stop
stop_daemon
expect "daemon stopped: the driver is bound again" "$(drv "$D")" virtio-pci
expect "daemon stopped: the DRM node is back" "$(wait_node /dev/dri/card1)" present
rec() { [ -e "$GPUCTL_STATE_DIR/poweroff.json" ] && echo present || echo absent; }
expect "daemon stopped: the record is gone" "$(rec)" absent

# ------------------------------------------------------------ boot with integrated saved, kill -9
if start_daemon /tmp/daemon2.log; then
  # The daemon answers only after the saved mode and its power-off are in force.
  expect "start with integrated saved: unbound before the socket answers" "$(drv "$D")" ""
  expect "start with integrated saved: D3cold" "$(wait_ps D3cold)" D3cold
  diag
  kill -9 "$dpid"
  wait "$dpid" 2>/dev/null
  dpid=
  expect "kill -9: the record is left" "$(rec)" present
  echo "== gpuctl poweroff-restore (the unit's ExecStopPost)"
  gpuctl poweroff-restore
  expect "kill -9, then poweroff-restore: bound again" "$(drv "$D")" virtio-pci
  expect "kill -9, then poweroff-restore: the node is back" "$(wait_node /dev/dri/card1)" present
else
  fail "daemon restarts" "$(cat /tmp/daemon2.log)"
fi
echo "== daemon log"
sed 's/^/daemon| /' /tmp/daemon1.log /tmp/daemon2.log
finish
