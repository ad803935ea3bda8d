#!/bin/sh
# Tier-3 guest checks of the automatic modes (busybox sh, /test.sh in the VM booted by
# tests/vm/auto-tests.sh with tests/vm/ssdt-power.asl). The AC adapter is real ACPI: the
# guest writes CMOS byte 0x70 (1 = AC, 0 = battery) and the firmware notifies the kernel's
# ac driver, which sends the power_supply uevents the daemon follows.
#
# Needs /bin/gpuctl, /bin/vmopen, /bin/uevmon and the ac/battery modules under
# /lib/modules/KVER/extra. Prints "PASS name" / "FAIL name: details" / "SKIP name: why",
# the daemon's log when anything failed, and last "N passed, M failed, K skipped".

export GPUCTL_STATE_DIR=/tmp/state GPUCTL_CONFIG=/tmp/gpuctl.toml
unset NOTIFY_SOCKET GPUCTL_SOCKET DRI_PRIME __NV_PRIME_RENDER_OFFLOAD
mkdir -p "$GPUCTL_STATE_DIR"
C1=/dev/dri/card1
CONN=/sys/class/drm/card1-Virtual-2
KV=$(uname -r)

# shellcheck source=tests/vm/guest-lib.sh
. /guest-lib.sh

# cmos_w INDEX VALUE (decimal): one 2-byte write to /dev/port 0x70, so the kernel does
# outb(INDEX, 0x70); outb(VALUE, 0x71) back to back (no window for the firmware's poll).
cmos_w() {
  # shellcheck disable=SC2059  # the format is the two bytes, as octal escapes
  printf "\\$(printf %03o "$1")\\$(printf %03o "$2")" | dd of=/dev/port bs=2 seek=56 count=1 2>/dev/null
}

# plug on|off: force the virtio connector's state, then send the uevent the kernel sends on
# a real monitor plug (change@…/card1, from the kernel: QEMU's forced state sends none).
plug() {
  echo "$1" >"$CONN/status"
  echo change >/sys/class/drm/card1/uevent
}

# The mode, from the daemon.
mode() { gpuctl get --json 2>/dev/null | sed -n 's/^  "mode": "\(.*\)",*$/\1/p'; }
# Opens card1 (ok / EPERM), without asking the daemon anything: a client request would
# make it re-read the hardware, and these checks prove it acts on kernel events alone.
card1() { /bin/vmopen "$C1" | sed 's/.* //'; }

# wait_card1 WANT MS: until card1 opens as WANT; prints the milliseconds it took, or "timeout".
wait_card1() {
  wc_t0=$(now_ms)
  while [ "$(card1)" != "$1" ]; do
    [ $(($(now_ms) - wc_t0)) -lt "$2" ] || { echo timeout; return 1; }
    usleep 50000
  done
  echo $(($(now_ms) - wc_t0))
}

# wait_mode WANT MS: until `gpuctl get` says WANT.
wait_mode() {
  wm_t0=$(now_ms)
  while [ "$(mode)" != "$1" ]; do
    [ $(($(now_ms) - wm_t0)) -lt "$2" ] || return 1
    usleep 100000
  done
}

# adp_events: ADP1 uevents seen so far.
adp_events() { grep -c 'power_supply/ADP1 ' /tmp/uev.log; }

# wait_adp N0 ONLINE MS: until an ADP1 uevent after the first N0 says ONLINE; prints its
# time (uptime ms) or "timeout".
wait_adp() {
  wa_t0=$(now_ms)
  while :; do
    wa_line=$(grep 'power_supply/ADP1 ' /tmp/uev.log | tail -n +"$(($1 + 1))" | grep "POWER_SUPPLY_ONLINE=$2" | head -n1)
    if [ -n "$wa_line" ]; then
      echo "$wa_line" | awk '{ split($2, t, "."); printf "%d\n", t[1] * 1000 + t[2] }'
      return 0
    fi
    [ $(($(now_ms) - wa_t0)) -lt "$3" ] || { echo timeout; return 1; }
    usleep 50000
  done
}

auto_events() { grep -c '"reason":"auto"' /tmp/ev.log; }

dpid=''
finish() {
  if [ "$failed" -gt 0 ]; then
    echo "---- daemon log ----"
    sed 's/^/daemon| /' /tmp/daemon.log
    echo "---- uevents ----"
    sed 's/^/uevent| /' /tmp/uev.log | tail -n 40
    echo "---- mode events ----"
    sed 's/^/event| /' /tmp/ev.log
  fi
  [ -n "$dpid" ] && kill "$dpid" 2>/dev/null
  results
  exit
}

# ---------------------------------------------------------------- a real AC adapter
insmod "/lib/modules/$KV/extra/ac.ko" || fail "insmod ac" "failed"
insmod "/lib/modules/$KV/extra/battery.ko" cache_time=0 || fail "insmod battery" "failed"
AC='' BAT=''
for d in /sys/class/power_supply/*; do
  case $(cat "$d/type" 2>/dev/null) in
    Mains) AC=$d ;;
    Battery) BAT=$d ;;
  esac
done
if [ -z "$AC" ] || [ -z "$BAT" ]; then
  fail "ACPI AC adapter and battery" "power_supply: $(ls /sys/class/power_supply 2>&1); the SSDT did not load?"
  finish
fi
pass "ACPI AC adapter ${AC##*/} and battery ${BAT##*/} (real kernel drivers)"

# QEMU reports the virtio GPU's only connector connected: force it off (the DRM connector's
# `status` file), so the virtio GPU is a plain offload GPU until the display test.
echo off >"$CONN/status"
expect "virtio connector forced off" "$(cat "$CONN/status")" disconnected

# On battery before the daemon starts (reading `online` makes the firmware notice at once).
cmos_w 112 0
expect "AC offline before the daemon starts" "$(cat "$AC/online")" 0

/bin/uevmon SUBSYSTEM=power_supply SUBSYSTEM=drm >/tmp/uev.log 2>&1 &
# power_off = never: the virtio GPU (virtio-pci, no runtime PM) would otherwise be unbound
# while integrated (issue 19; tests/vm/poweroff-tests.sh) and card1 would go away.
cat >"$GPUCTL_CONFIG" <<'EOF'
power_off = "never"

[auto]
on_battery = "integrated"
on_ac = "hybrid"
EOF

# ---------------------------------------------------------------- start on battery
gpuctl daemon --backend cgroup 2>/tmp/daemon.log &
dpid=$!
first='' i=0
while [ $i -lt 100 ]; do
  first=$(mode)
  [ -n "$first" ] && break
  kill -0 "$dpid" 2>/dev/null || break
  usleep 100000
  i=$((i + 1))
done
[ -n "$first" ] || { fail "daemon ready" "no answer in 10 s"; finish; }
expect "start on battery: the daemon's first answer is integrated" "$first" integrated
expect "start on battery: card1 blocked from the start" "$(card1)" EPERM
la=$(grep -n 'auto: mode integrated' /tmp/daemon.log | head -n1 | cut -d: -f1)
ls=$(grep -n 'started: ' /tmp/daemon.log | head -n1 | cut -d: -f1)
if [ -n "$la" ] && [ -n "$ls" ] && [ "$la" -lt "$ls" ]; then
  pass "start on battery: the rule was applied before the daemon started serving (log line $la < $ls)"
else
  fail "start on battery: rule applied before serving" "auto line ${la:-none}, started line ${ls:-none}"
fi
# The kernel accepted the uevent socket filter (its size is bounded by net.core.optmem_max,
# 20 KiB by default before Linux 6.9); without it the daemon still works, every uevent waking it.
if grep -q 'uevent socket filter' /tmp/daemon.log; then
  fail "the uevent socket filter is attached" "$(grep 'uevent socket filter' /tmp/daemon.log)"
else
  pass "the uevent socket filter is attached (Linux $(uname -r), optmem_max $(cat /proc/sys/net/core/optmem_max))"
fi
gpuctl status | sed 's/^/      /'
gpuctl auto | sed 's/^/      /'

gpuctl events --json >/tmp/ev.log 2>&1 &
epid=$!
usleep 300000

# ---------------------------------------------------------------- AC in
n0=$(adp_events)
cmos_w 112 1
t_ev=$(wait_adp "$n0" 1 5000)
if [ "$t_ev" = timeout ]; then
  fail "AC in: kernel uevent" "no ADP1 uevent with POWER_SUPPLY_ONLINE=1 in 5 s"
else
  pass "AC in: the kernel sent a power_supply uevent (ONLINE=1)"
  took=$(wait_card1 ok 5000)
  if [ "$took" = timeout ]; then
    fail "AC in: hybrid within 2 s of the uevent" "card1 still blocked 5 s later"
  else
    lat=$(($(now_ms) - t_ev))
    if [ "$lat" -le 2000 ]; then pass "AC in: hybrid ${lat} ms after the uevent (<= 2000)"
    else fail "AC in: hybrid within 2 s of the uevent" "took ${lat} ms"; fi
  fi
  expect "AC in: mode hybrid" "$(mode)" hybrid
  contains "AC in: the daemon says why" "$(grep 'auto: mode hybrid' /tmp/daemon.log)" "auto: on AC; after power_supply uevent"
fi

# ---------------------------------------------------------------- a manual choice stands until the next flip
gpuctl set smart >/dev/null 2>&1
expect "manual: set smart on AC" "$(mode)" smart
cmos_w 113 40
n1=$(grep -c 'power_supply/BAT0 ' /tmp/uev.log)
i=0
while [ "$(grep -c 'power_supply/BAT0 ' /tmp/uev.log)" = "$n1" ] && [ $i -lt 40 ]; do usleep 100000; i=$((i + 1)); done
usleep 2000000
expect "manual: still smart after a battery uevent (same power source) and 2 s" "$(mode)" smart
n0=$(adp_events)
cmos_w 112 0
t_ev=$(wait_adp "$n0" 0 5000)
if wait_mode integrated 4000; then
  pass "manual: the next flip (AC out) ends it: integrated"
else
  fail "manual: the next flip ends it" "mode $(mode) (uevent at $t_ev)"
fi
contains "manual: the daemon says so" "$(cat /tmp/daemon.log)" "the manual choice gives way to the rules"

# ---------------------------------------------------------------- fast flips
# Each flip is read back at once (the firmware notices on a read): one uevent per flip,
# 150 ms apart, like a flapping connector. burst N: N flips from the current state.
burst() {
  e0=$(auto_events) a0=$(adp_events)
  v=$((1 - $(cat "$AC/online"))) i=0
  while [ $i -lt "$1" ]; do
    cmos_w 112 $v
    cat "$AC/online" >/dev/null
    v=$((1 - v)) i=$((i + 1))
    usleep 150000
  done
  # Settled: no new ADP1 uevent for 2.5 s.
  last=$(adp_events) quiet=0
  while [ $quiet -lt 25 ]; do
    usleep 100000
    now=$(adp_events)
    if [ "$now" = "$last" ]; then quiet=$((quiet + 1)); else last=$now quiet=0; fi
  done
  uevents=$((last - a0)) changes=$(($(auto_events) - e0))
  echo "      $1 flips: $uevents ADP1 uevent(s), $changes mode change(s)"
}
# 10 flips end where they started (on battery): at most a few changes, back to integrated.
burst 10
if [ "$uevents" -ge 5 ]; then pass "10 fast flips: the kernel sent $uevents ADP1 uevents"
else fail "10 fast flips: a burst of uevents" "only $uevents ADP1 uevent(s)"; fi
if [ "$changes" -le 3 ]; then pass "10 fast flips: $changes mode change(s) (<= 3)"
else fail "10 fast flips: a few mode changes at most" "$changes changes"; fi
expect "10 fast flips: AC ends offline" "$(cat "$AC/online")" 0
expect "10 fast flips: ends in the on_battery mode" "$(mode)/$(card1)" integrated/EPERM
# 9 flips end on the other side (AC): the result must follow.
burst 9
if [ "$changes" -ge 1 ] && [ "$changes" -le 3 ]; then pass "9 fast flips: $changes mode change(s) (1 to 3)"
else fail "9 fast flips: between 1 and 3 mode changes" "$changes changes"; fi
expect "9 fast flips: AC ends online" "$(cat "$AC/online")" 1
expect "9 fast flips: ends in the on_ac mode" "$(mode)/$(card1)" hybrid/ok
# Back on battery for what follows.
n0=$(adp_events)
cmos_w 112 0
wait_adp "$n0" 0 5000 >/dev/null
wait_mode integrated 4000

# ---------------------------------------------------------------- rules off: nothing changes
gpuctl auto off >/dev/null
e0=$(auto_events) n0=$(adp_events)
cmos_w 112 1
t_ev=$(wait_adp "$n0" 1 5000)
usleep 2500000
expect "auto off: AC in changes nothing" "$(mode)/$(card1)" integrated/EPERM
expect "auto off: no mode event" "$(($(auto_events) - e0))" 0
gpuctl auto on >/dev/null
expect "auto on: the AC rule applies at once" "$(mode)" hybrid

# ---------------------------------------------------------------- external display
n0=$(adp_events)
cmos_w 112 0
wait_adp "$n0" 0 5000 >/dev/null
wait_mode integrated 4000
expect "display: on battery, integrated" "$(card1)" EPERM
plug on
took=$(wait_card1 ok 4000)
if [ "$took" = timeout ]; then
  fail "display plugged into the blocked GPU: unblocked" "card1 still blocked after 4 s (connector $(cat "$CONN/status"))"
else
  pass "display plugged into the blocked GPU: unblocked in ${took} ms (no client request)"
fi
if grep -q 'UEVENT [0-9.]* add@/devices/pci0000:00/0000:00:03.0/drm/card1 ' /tmp/uev.log; then
  pass "display: an add uevent on card1 tells compositors to take the GPU"
else
  fail "display: add uevent on card1" "$(grep card1 /tmp/uev.log | tail -n 3)"
fi
st=$(gpuctl status)
contains "display: status says why" "$st" "why:      auto: external display GPU 1 Virtual-2"
echo "$st" | sed 's/^/      /'
plug off
took=$(wait_card1 EPERM 4000)
if [ "$took" = timeout ]; then fail "display unplugged: back to integrated" "card1 still opens"
else pass "display unplugged: back to the rule's mode in ${took} ms"; fi

# ---------------------------------------------------------------- split session
# A display server that took the GPU while the display was connected keeps it open after
# the unplug: neither the rule nor a plain `set` may block it under its feet.
plug on
wait_card1 ok 4000 >/dev/null
/bin/holdopen gnome-shell "$C1" >/tmp/hold.log 2>&1 &
hpid=$!
usleep 300000
contains "split session: a stand-in compositor holds card1" "$(cat /tmp/hold.log)" "as gnome-shell (pid $hpid)"
plug off
usleep 1500000
expect "split session: unplugged, but card1 stays unblocked" "$(card1)" ok
st=$(gpuctl status)
contains "split session: status names the holder" "$st" "held open by the display server gnome-shell (pid $hpid)"
out=$(gpuctl set integrated 2>&1)
rc=$?
expect "split session: set integrated refused (exit 4)" "$rc" 4
contains "split session: the refusal names the holder" "$out" "gnome-shell (pid $hpid)"
out=$(gpuctl set integrated --force 2>&1)
expect "split session: --force blocks it" "$?/$(card1)" 0/EPERM
kill "$hpid"
wait "$hpid" 2>/dev/null
gpuctl auto on >/dev/null
expect "split session: holder gone, auto on: integrated" "$(mode)/$(card1)" integrated/EPERM

# ---------------------------------------------------------------- resume
# A change while nobody reads the adapter and the firmware's poll is off sends no uevent.
# The daemon's timerfd (cancel-on-set) fires on a clock set and on every resume.
tz=''
for z in /sys/class/thermal/thermal_zone*; do
  [ -w "$z/mode" ] && { echo disabled >"$z/mode"; tz="$tz $z"; }
done
n0=$(adp_events)
cmos_w 112 1
usleep 2000000
if [ "$(adp_events)" != "$n0" ]; then
  skip "clock set" "the firmware still reported the change (thermal zone poll not disabled)"
else
  expect "clock set: a silent AC change is not seen yet" "$(card1)" EPERM
  date -s "@$(date +%s)" >/dev/null
  took=$(wait_card1 ok 4000)
  if [ "$took" = timeout ]; then fail "clock set: re-evaluated" "card1 still blocked"
  else pass "clock set: re-evaluated, hybrid in ${took} ms"; fi
fi
# A real suspend to RAM (S3) and resume: the host presses the wake-up button (QMP).
if grep -qw mem /sys/power/state; then
  cmos_w 112 0
  n_clock=$(grep -c 'auto: the clock was set or the machine resumed' /tmp/daemon.log)
  echo "GPUCTL-SUSPEND (AC unplugged while nobody looks; the host wakes us in 2 s)"
  t0=$(date +%s)
  if echo mem >/sys/power/state; then
    pass "suspend to RAM and resume ($(($(date +%s) - t0)) s wall)"
    took=$(wait_card1 EPERM 5000)
    if [ "$took" = timeout ]; then fail "resume: the rules re-evaluated" "card1 still opens (mode $(mode))"
    else pass "resume: on battery now, integrated ${took} ms after the resume"; fi
    if [ "$(grep -c 'auto: the clock was set or the machine resumed' /tmp/daemon.log)" -gt "$n_clock" ]; then
      pass "resume: the daemon's resume watch fired"
    else
      fail "resume: the daemon's resume watch fired" "no log line after the resume"
    fi
  else
    skip "suspend to RAM" "echo mem > /sys/power/state failed"
  fi
else
  skip "suspend to RAM" "not offered: $(cat /sys/power/state)"
fi
for z in $tz; do echo enabled >"$z/mode"; done
contains "resume: the daemon says why" "$(cat /tmp/daemon.log)" "after resume or clock change"

contains "mode events: auto with the reason" "$(cat /tmp/ev.log)" '"reason":"auto","detail":"auto: on battery"'
kill "$epid" 2>/dev/null
kill "$dpid"
wait "$dpid"
expect "SIGTERM: daemon exits 0" "$?" 0
dpid=''
grep 'auto: ' /tmp/daemon.log | sed 's/^/daemon| /'
finish
