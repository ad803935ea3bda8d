#!/usr/bin/env bash
# Tier 3 (make test-vm): boot Debian's stock kernel three times and run tests/vm/guest.sh
# against the static gpuctl binary, with a real VGA (default GPU) and a real virtio GPU
# (offload GPU):
#
#   lsm            default kernel command line (BPF LSM active), daemon --backend lsm
#   cgroup         default kernel command line, daemon --backend cgroup
#   auto-fallback  lsm= list without bpf, daemon --backend auto (must pick cgroup);
#                  daemon --backend lsm must fail with a clear message
#   rescue         gpuctl.mode=hybrid on the command line (tests/vm/rescue.sh): this boot
#                  is hybrid, the saved state is not touched; the state file it saved is
#                  taken from its console for
#   rescue-next    the next boot, without the word: the saved mode is back
#
# Usage: tests/vm/guest-tests.sh [-v] [--only LABEL]... BIN
#   -v            stream every guest's console (default: one summary line per boot, plus
#                 the FAIL lines and the daemon's log of a boot that failed)
#   --only LABEL  run only this boot (repeatable)
# Prints "vm: LABEL: N passed, M failed[, K skipped]" per boot; exits 1 if any check or
# boot failed, 2 on a setup error. Console logs: target/vm/guest-LABEL.log.
set -euo pipefail

# shellcheck source=tests/vm/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

vm_args 2,17 "[-v] [--only LABEL]" --only -- "$@"
vm_cc

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A snapshot: every boot tests the same binary even if it is rebuilt meanwhile.
cp "$bin" "$tmp/gpuctl"
bin=$tmp/gpuctl
vm_static "$tmp" vmopen

# Real clients (tests/vm/clients.sh): the real bwrap (package bubblewrap) and a libdrm
# probe built against the real libdrm (package libdrm-dev), with the shared libraries they
# load, at the same paths in the guest.
command -v bwrap >/dev/null || die "bwrap not found (apt-get install bubblewrap)"
pkg-config --exists libdrm 2>/dev/null || die "libdrm not found (apt-get install libdrm-dev pkg-config)"
# shellcheck disable=SC2046  # pkg-config prints one flag per word
"$cc" -O2 -Wall -Wextra -Werror $(pkg-config --cflags libdrm) -o "$tmp/drmprobe" \
  "$here/drmprobe.c" $(pkg-config --libs libdrm) || die "building drmprobe.c against libdrm failed"
bwrap_bin=$(command -v bwrap)
client_adds=(--add "$tmp/drmprobe:/bin/drmprobe" --add "$bwrap_bin:/usr/bin/bwrap"
             --add "$here/clients.sh:/clients.sh")
while read -r lib; do
  client_adds+=(--add "$(readlink -f "$lib"):$lib")
done < <(ldd "$tmp/drmprobe" "$bwrap_bin" | grep -oE '/[^ ]+\.so[^ ]*' | sort -u)

no_bpf_lsm="lsm=landlock,lockdown,yama,loadpin,safesetid,integrity,apparmor,selinux,smack,tomoyo"
# label | kernel command-line words (the NAME=value ones become guest.sh's environment)
boots=(
  "lsm|GPUCTL_BACKEND=lsm EXPECT_BACKEND=lsm EXPECT_ERRNO=EPERM"
  "cgroup|GPUCTL_BACKEND=cgroup EXPECT_BACKEND=cgroup EXPECT_ERRNO=EPERM"
  "auto-fallback|$no_bpf_lsm GPUCTL_BACKEND=auto EXPECT_BACKEND=cgroup EXPECT_ERRNO=EPERM EXPECT_LSM_REFUSED=1"
  "rescue|gpuctl.mode=hybrid RESCUE=1 GPUCTL_BACKEND=lsm EXPECT_ERRNO=EPERM"
  "rescue-next|RESCUE=2 GPUCTL_BACKEND=lsm EXPECT_ERRNO=EPERM"
)
client_adds+=(--add "$here/rescue.sh:/rescue.sh")

bad=0 ran=0 total_pass=0 total_fail=0
t_all=$SECONDS
for b in "${boots[@]}"; do
  label=${b%%|*} append=${b#*|}
  if [[ ${#only[@]} -gt 0 && " ${only[*]} " != *" $label "* ]]; then continue; fi
  ran=$((ran + 1))
  log=$repo/target/vm/guest-$label.log
  t0=$SECONDS
  args=(--binary "$bin" --script "$here/guest.sh" --add "$tmp/vmopen:/bin/vmopen" "${client_adds[@]}"
        --name "guest-$label" --log "$log" --timeout 90 --append "$append")
  if [[ $label == rescue-next ]]; then
    # The reboot: what the rescue boot saved, as its console printed it.
    awk '/^STATE-JSON-END/ { p = 0 } p { print } /^STATE-JSON-BEGIN/ { p = 1 }' \
      "$repo/target/vm/guest-rescue.log" >"$tmp/state.json" 2>/dev/null || true
    [[ -s $tmp/state.json ]] && args+=(--add "$tmp/state.json:/etc/gpuctl-vm/state.json")
  fi
  [[ $verbose == 1 ]] || args+=(--quiet)
  set +e
  "$here/run.sh" "${args[@]}" 2>"$tmp/run.err"
  rc=$?
  set -e
  secs=$((SECONDS - t0))
  vm_report "$label" "$log" "$rc" "$secs" "$tmp/run.err" || bad=1
  total_pass=$((total_pass + np))
  total_fail=$((total_fail + nf))
done
[[ $ran -gt 0 ]] || die "no boot matches --only ${only[*]}"
echo "vm: $ran boot(s) in $((SECONDS - t_all))s"
# The plain closing line CI reads.
echo "vm: $total_pass passed, $total_fail failed"
exit "$bad"
