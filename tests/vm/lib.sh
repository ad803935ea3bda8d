# shellcheck shell=bash disable=SC2034  # the variables set here are for the runners
# Sourced by the tier-3 host runners (guest-tests.sh, auto-tests.sh, power-tests.sh,
# poweroff-tests.sh): where things are, the error exit, option parsing, the C compiler and
# the static guest helpers, the kernel and its extra modules, a direct QEMU boot, and the
# guest's result line. Not run on its own.
#
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Sets: here (tests/vm), repo (the checkout).

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
die() { echo "vm: error: $*" >&2; exit 2; }

# vm_args HELP USAGE [--only] -- "$@": parses the runners' common options, -v and -h (which
# prints lines HELP, e.g. 2,17, of the runner's header), and --only LABEL (repeatable) when
# given. Sets verbose, only (array) and bin, which must be an executable; USAGE is the
# usage line's options.
vm_args() {
  local help=$1 usage=$2 allow_only=0
  shift 2
  [[ $1 == --only ]] && { allow_only=1; shift; }
  [[ $1 == -- ]] && shift
  verbose=0 bin='' only=()
  while [[ $# -gt 0 ]]; do
    case $1 in
      -v|--verbose) verbose=1; shift ;;
      --only) [[ $allow_only == 1 ]] || die "unknown option: $1 (see --help)"
              only+=("${2:?}"); shift 2 ;;
      -h|--help) sed -n "${help}p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
      -*) die "unknown option: $1 (see --help)" ;;
      *) [[ -z $bin ]] || die "one binary only"; bin=$1; shift ;;
    esac
  done
  [[ -n $bin ]] || die "usage: $0 $usage BIN (the static gpuctl)"
  [[ -x $bin ]] || die "$bin is not an executable"
}

# vm_cc: sets cc to $CC, else gcc, else clang.
vm_cc() {
  cc=${CC:-}
  if [[ -z $cc ]]; then
    for c in gcc clang; do command -v "$c" >/dev/null && { cc=$c; break; }; done
  fi
  [[ -n $cc ]] || die "no C compiler for the guest helpers (apt-get install gcc libc6-dev)"
}

# vm_static DIR NAME...: builds tests/vm/NAME.c into DIR/NAME, static (the guest has no libc).
vm_static() {
  local dir=$1 n
  shift
  [[ -n ${cc:-} ]] || vm_cc
  for n in "$@"; do
    "$cc" -static -O2 -Wall -Wextra -Werror -o "$dir/$n" "$here/$n.c" \
      || die "building $n.c with $cc -static failed (static glibc: package libc6-dev)"
  done
}

# vm_kernel: fetches (or finds cached) the stock kernel; sets kdir and what its kernel.env
# says (KVER, PKG, PKG_VERSION, ...).
vm_kernel() {
  kdir=$("$here/fetch-kernel.sh" | tail -n1) || die "fetch-kernel.sh failed"
  # shellcheck disable=SC1091
  . "$kdir/kernel.env"
}

# vm_counts LOG: reads the guest's last word, "N passed, M failed, K skipped", into np, nf
# and ns; fails when the log has none (the guest never finished).
vm_counts() {
  local counts
  counts=$(grep -aoE '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$1" 2>/dev/null \
    | tail -n1 || true)
  [[ -n $counts ]] || return 1
  read -r np _ nf _ ns _ <<<"${counts//,/}"
}

# vm_modules NAME FILE...: the kernel package's modules FILE (paths below
# lib/modules/KVER/kernel/, in the order the guest loads them), extracted once into
# target/vm/NAME-modules-KVER (after vm_kernel). Sets adds (mkinitramfs.sh options placing
# each at /lib/modules/KVER/extra/) and order (their names, space-separated, load order).
vm_modules() {
  local name=$1 mods f b x paths=()
  shift
  local deb=${GPUCTL_VM_CACHE:-$repo/.cache/vm}/debs/${PKG}_${PKG_VERSION}_amd64.deb
  mods=$repo/target/vm/$name-modules-$KVER
  adds=() order=''
  for f in "$@"; do
    [[ -f $mods/$(basename "$f") ]] || { paths+=("./lib/modules/$KVER/kernel/$f"); }
  done
  if [[ ${#paths[@]} -gt 0 ]]; then
    [[ -f $deb ]] || die "$deb not found (fetch-kernel.sh keeps the package there)"
    x=$(mktemp -d)
    mkdir -p "$mods"
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$x" "${paths[@]}" \
      || { rm -rf "$x"; die "extracting the $name modules from $deb failed"; }
    for f in "${paths[@]}"; do cp "$x/$f" "$mods/"; done
    rm -rf "$x"
  fi
  for f in "$@"; do
    b=$(basename "$f")
    adds+=(--add "$mods/$b:/lib/modules/$KVER/extra/$b")
    order+="${b%.ko} "
  done
}

# vm_boot LABEL TIMEOUT LOG QEMU-ARGS...: boots QEMU (GPUCTL_VM_QEMU, else
# qemu-system-x86_64) with TIMEOUT seconds, the console into LOG (and on stdout with -v),
# then vm_report with the guest's exit marker as its status. For runners that build their
# own machine; the others boot through run.sh.
vm_boot() {
  local label=$1 limit=$2 log=$3 qemu=${GPUCTL_VM_QEMU:-qemu-system-x86_64} t0 marker rc
  shift 3
  command -v "$qemu" >/dev/null || die "$qemu not found (apt-get install qemu-system-x86)"
  t0=$SECONDS
  set +e
  if [[ $verbose == 1 ]]; then
    timeout -k 5 "$limit" "$qemu" "$@" </dev/null 2>&1 | sed -u 's/\r//g' | tee "$log"
  else
    timeout -k 5 "$limit" "$qemu" "$@" </dev/null 2>&1 | sed -u 's/\r//g' >"$log"
  fi
  set -e
  marker=$(grep -aoE 'GPUCTL-VM-EXIT [0-9]+' "$log" | tail -n1 || true)
  rc=${marker#GPUCTL-VM-EXIT }
  vm_report "$label" "$log" "${rc:-unknown}" $((SECONDS - t0))
}

# vm_report LABEL LOG STATUS SECS [ERRFILE]: the runner's line for one boot,
# "vm: LABEL: N passed, M failed[, K skipped] (Ts)", from the guest's result in LOG; a boot
# with no result, or one whose STATUS (the guest's exit) is not 0 while nothing failed,
# counts as failed. Shows the FAIL/SKIP, daemon and guest lines (with -v the console was
# shown already), and ERRFILE's text when there is no result. Sets np, nf, ns; returns 1 when
# anything failed.
vm_report() {
  local label=$1 log=$2 status=$3 secs=$4 err=${5:-} line
  if ! vm_counts "$log"; then
    np=0 nf=1 ns=0
    echo "vm: $label: 0 passed, 1 failed (no result from the guest: exit $status; ${secs}s)"
    if [[ -n $err && -s $err ]]; then sed 's/^/  /' "$err"; else tail -n 40 "$log" | sed 's/^/  | /'; fi
    return 1
  fi
  line="vm: $label: $np passed, $nf failed"
  [[ $ns == 0 ]] || line+=", $ns skipped"
  if [[ $status != 0 && $nf == 0 ]]; then
    line+=" (but the guest exited $status)"
    nf=1
  fi
  echo "$line (${secs}s)"
  [[ $verbose == 0 ]] || { [[ $nf == 0 ]]; return; }
  if [[ $nf != 0 ]]; then
    grep -aE '^(FAIL|SKIP) |^daemon\| |^---- |^guest: ' "$log" | sed 's/^/  /' || true
    echo "  (console log: $log)"
    return 1
  fi
  grep -aE '^SKIP ' "$log" | sed 's/^/  /' || true
}
