#!/usr/bin/env bash
# Fails when the build used a file from a Debian package that scripts/setup.sh does not install: neither
# named in its PACKAGES list nor pulled in by their Depends/Pre-Depends (Recommends do not count:
# setup.sh installs with --no-install-recommends, so a machine that happens to have a recommended
# package would hide the gap — that is how a missing OpenCL once reached a fresh machine).
# Usage: scripts/check_packages.sh [BUILD_DIR]   (after a build; default build/release; CI also checks
# build/readers-asan, the clang build of its sanitizer stage)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
[ -f "$BUILD/CMakeCache.txt" ] || { echo "check_packages: $BUILD/CMakeCache.txt not found: build first" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# 1. Files the build used: headers (compiler depfiles), what configure found (CMakeCache paths, package
#    config folders), what the link lines name, and the shared libraries the binaries load.
{
  find "$BUILD" -name '*.o.d' -exec cat {} + | tr ' \\' '\n\n' | grep '^/usr/' || true
  grep -E '^[A-Za-z0-9_]+:(FILEPATH|PATH)=/usr/' "$BUILD/CMakeCache.txt" | sed 's/^[^=]*=//' | while read -r p; do
    # A package config folder: its *Config.cmake names the package; add-ons that other packages drop
    # into the same folder are OPTIONAL includes, and what a config really pulls in shows up as cache
    # paths or link lines (dnnl-config's OpenCL_LIBRARY, for one).
    if [ -d "$p" ]; then find "$p" -maxdepth 1 -type f \( -name '*Config.cmake' -o -name '*-config.cmake' \); else echo "$p"; fi
  done
  find "$BUILD" -name link.txt -exec cat {} + | tr ' ' '\n' | grep -E '^/usr/.*\.(so|a)(\..*)?$' || true
  for bin in "$BUILD"/hybridlm "$BUILD"/hybridlm_tests "$BUILD"/hybridlm_microbench "$BUILD"/hybridlm_reader_tests \
             "$BUILD"/fuzz_*; do
    # `if`, not `[ ] &&`: a binary this preset does not build (fuzz_* in release) must not end the loop false.
    if [ -x "$bin" ]; then ldd "$bin" | awk '$3 ~ /^\// {print $3}'; fi
  done
} | grep -v '^$' | sort -u > "$tmp/files"

# 2. The package that owns each file: one dpkg call for all (dpkg knows paths as installed, so ask for
#    the resolved path too: /usr/lib/x/libfoo.so may be a link into /lib).
while read -r f; do [ -e "$f" ] && { echo "$f"; readlink -f "$f"; }; done < "$tmp/files" | sort -u > "$tmp/paths"
xargs -a "$tmp/paths" -d '\n' dpkg -S 2>/dev/null | grep -v '^diversion by' \
  | sed -E 's/^([^:,]+)[^ ]* (.*)$/\1\t\2/' | sort -u > "$tmp/owners" || true

# 3. What setup.sh guarantees: its list, closed under Depends / Pre-Depends (with the arch suffix dropped).
./scripts/setup.sh --list-packages > "$tmp/listed"
apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
  --no-enhances $(cat "$tmp/listed") 2>/dev/null | grep -v '^ ' | tr -d '<>' | sed 's/:.*//' | sort -u > "$tmp/closure"
# Essential packages are on every Debian system.
dpkg-query -W -f='${Package} ${Essential}\n' | awk '$2 == "yes" {print $1}' >> "$tmp/closure"
sort -u -o "$tmp/closure" "$tmp/closure"

bad=0
while IFS=$'\t' read -r pkg f; do
  base=${pkg%%:*}
  if ! grep -qx "$base" "$tmp/closure"; then
    echo "check_packages: the build uses $f from package '$base', which scripts/setup.sh does not install (add it to PACKAGES)" >&2
    bad=1
  fi
done < <(sort -u -k1,1 "$tmp/owners")
n_files=$(wc -l < "$tmp/files"); n_pkgs=$(cut -f1 "$tmp/owners" | sort -u | wc -l)
if ((bad)); then exit 1; fi
echo "check_packages: ok ($n_files files from $n_pkgs packages, all installed by scripts/setup.sh)"
