# shellcheck shell=bash disable=SC2034  # the variables set here are for the runners
# Sourced by the tier-3 host runners (guest-tests.sh, power-tests.sh, auto-tests.sh): where
# things are, the error exit, option parsing, the C compiler and the static guest helpers,
# the kernel, and the guest's result line. Not run on its own.
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
