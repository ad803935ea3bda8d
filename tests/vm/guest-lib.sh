# shellcheck shell=sh
# The checks' helpers of every tier-3 guest script (busybox sh), installed by mkinitramfs.sh
# as /guest-lib.sh and sourced first: the counters and the PASS/FAIL/SKIP lines that the
# host's vm_report (tests/vm/lib.sh) reads back, and waiting for a daemon. Not run on its own.

passed=0 failed=0 skipped=0
pass() { passed=$((passed + 1)); echo "PASS $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1: $2"; }
skip() { skipped=$((skipped + 1)); echo "SKIP $1: $2"; }
# expect NAME GOT WANT
expect() { if [ "$2" = "$3" ]; then pass "$1"; else fail "$1" "got \"$2\", want \"$3\""; fi; }
# contains NAME HAYSTACK NEEDLE
contains() { case $2 in *"$3"*) pass "$1" ;; *) fail "$1" "\"$3\" not in: $2" ;; esac; }
now_ms() { awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime; }
# results: the guest's last word (vm_counts reads it); returns 1 if anything failed.
results() {
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" = 0 ]
}

# await_daemon PID TENTHS: until `gpuctl get` answers (0), PID is gone or TENTHS × 0.1 s
# have passed (1).
await_daemon() {
  ad_i=0
  while [ "$ad_i" -lt "$2" ]; do
    gpuctl get >/dev/null 2>&1 && return 0
    kill -0 "$1" 2>/dev/null || return 1
    usleep 100000
    ad_i=$((ad_i + 1))
  done
  return 1
}
