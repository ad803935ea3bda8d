# shellcheck shell=sh
# Sourced by tests/vm/guest.sh when the kernel command line has RESCUE=1 or RESCUE=2
# (tests/vm/guest-tests.sh, boots "rescue" and "rescue-next"): the boot-time rescue
# (issue 20) on a real /proc/cmdline, across a real reboot.
#
#   RESCUE=1  booted with gpuctl.mode=hybrid: the daemon comes up hybrid (the dGPU opens);
#             `set integrated --force` is the user's choice (saved); a daemon restart in
#             the same boot is hybrid again and the saved state still says integrated.
#             Prints the state file between STATE-JSON-BEGIN/END for the next boot.
#   RESCUE=2  booted without the word, with that state file: integrated is back.
# Uses guest.sh's helpers (pass/fail/check/opens/contains/start_daemon/stop_daemon/finish).

rescue_get() { gpuctl get --json 2>&1 | tr '\n' ' '; }

case ${RESCUE:-} in
1)
  contains "rescue: the word is on /proc/cmdline" "$(cat /proc/cmdline)" "gpuctl.mode=hybrid"
  if start_daemon /tmp/daemon-1.log; then
    g=$(rescue_get)
    contains "rescue: this boot is hybrid" "$g" '"mode": "hybrid"'
    contains "rescue: get says why" "$g" "kernel command line"
    opens "rescue: the dGPU opens" :: "$C1=ok" "$R1=ok"
    if out=$(gpuctl set integrated --force 2>&1); then
      pass "rescue: the user's set integrated --force"
    else
      fail "rescue: the user's set integrated --force" "$out"
    fi
    opens "rescue: integrated blocks it" :: "$C1=$EXPECT_ERRNO"
    stop_daemon TERM
    if start_daemon /tmp/daemon-2.log; then
      contains "rescue: a restart in this boot is hybrid again" "$(rescue_get)" '"mode": "hybrid"'
      opens "rescue: the dGPU opens again" :: "$C1=ok"
      stop_daemon TERM
    else
      fail "rescue: daemon restart" "$(cat /tmp/daemon-2.log)"
    fi
    contains "rescue: the saved state says integrated" \
      "$(tr -d ' \n' <"$GPUCTL_STATE_DIR/state.json")" '"mode":"integrated"'
    contains "rescue: the daemon logged the word" "$(cat /tmp/daemon-1.log)" "gpuctl.mode=hybrid"
    echo STATE-JSON-BEGIN
    cat "$GPUCTL_STATE_DIR/state.json"
    echo
    echo STATE-JSON-END
  else
    fail "rescue: daemon start" "$(cat /tmp/daemon-1.log)"
  fi
  ;;
2)
  # The state the rescue boot saved (guest-tests.sh took it from that boot's console).
  [ -f /etc/gpuctl-vm/state.json ] && cp /etc/gpuctl-vm/state.json "$GPUCTL_STATE_DIR/state.json"
  case $(cat /proc/cmdline) in
    *gpuctl.*) fail "rescue-next: no gpuctl word" "$(cat /proc/cmdline)" ;;
    *) pass "rescue-next: no gpuctl word" ;;
  esac
  if [ -s "$GPUCTL_STATE_DIR/state.json" ] && start_daemon /tmp/daemon-1.log; then
    g=$(rescue_get)
    contains "rescue-next: the saved mode is back" "$g" '"mode": "integrated"'
    case $g in *"kernel command line"*) fail "rescue-next: no rescue note" "$g" ;;
      *) pass "rescue-next: no rescue note" ;; esac
    opens "rescue-next: the dGPU is blocked" :: "$C1=$EXPECT_ERRNO" "$C0=ok"
  else
    fail "rescue-next: the state file from the rescue boot, and a daemon" \
      "$(ls -l "$GPUCTL_STATE_DIR" 2>&1; cat /tmp/daemon-1.log 2>&1)"
  fi
  ;;
*) fail "rescue" "RESCUE=${RESCUE:-} is not 1 or 2" ;;
esac
finish
