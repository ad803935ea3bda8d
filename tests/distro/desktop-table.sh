#!/usr/bin/env bash
# Prints the desktop clients' results of the last distro boots (target/distro/desktop-*.txt,
# written by boot.sh from guest/checks-desktop's TABLE lines) as the Markdown table in
# docs/DESKTOP-CLIENTS.md, with the guest's package versions from the cached root.
#
# Usage: tests/distro/desktop-table.sh [ROOT]   (ROOT: the cached Debian root; default: the
#        one boot.sh uses for guest-packages)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${GPUCTL_DISTRO_CACHE:-/var/cache/gpuctl-test}
root=${1:-$cache/bookworm-root-$(paste -sd, "$here/guest-packages" | tr -d '\n' | sha256sum | cut -c1-12)}
echo "Guest packages (Debian 12):"
echo
dpkg-query --admindir="$root/var/lib/dpkg" -W -f '`${Package}` ${Version}, ' \
  systemd weston switcheroo-control mesa-utils libegl-mesa0 mesa-vulkan-drivers vulkan-tools \
  libdrm-tests pipewire wireplumber pciutils | sed 's/, $/\n/'
echo
echo '| backend | mode | client | result |'
echo '|---|---|---|---|'
for f in "$repo"/target/distro/desktop-main.txt "$repo"/target/distro/desktop-fallback.txt; do
  [[ -s $f ]] || continue
  # Mesa's loader complains about bochs (the boot GPU has no Mesa driver): noise here.
  # Extension names caught by an earlier version of the eglinfo pattern: noise too.
  sed -E 's/MESA-LOADER: [^;]*;//g; s/failed to load driver: bochs-drm;//g;
    s/EGL_KHR_create_context[a-z_]*//g; s/[[:space:]]+/ /g' "$f" |
    awk -F'|' '{ r = $4; if (length(r) > 320) r = substr(r, 1, 317) "…";
      printf "| %s | %s | `%s` | %s |\n", $1, $2, $3, r }'
done
