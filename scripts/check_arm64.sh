#!/usr/bin/env bash
# Opt-in check of the Arm NEON path on an x86-64 Debian machine (docs/performance.md "Checking the NEON path on
# x86-64"): cross-compiles src/core, src/ops and the kernels' unit tests for aarch64 (HLM_KERNELS_ONLY, a portable
# build: Highway compiles its NEON and fallback targets and dispatches at run time) into build/arm64, then runs
# every test of that binary on the best target (NEON) and the SIMD kernel suites again on the fallback, under
# qemu user-mode emulation. Not part of CI. Installing the packages needs root.
#
#   scripts/check_arm64.sh           # install what is missing, configure, build, test
#   JOBS=1 scripts/check_arm64.sh    # build with fewer jobs (default 2)
#
# Packages: the cross compiler and qemu (amd64), and the target's libraries through Debian multiarch
# (dpkg --add-architecture arm64). apt only adds packages here: the script stops if apt would remove or upgrade
# any installed package (the native build must keep working). libdnnl-dev:arm64 cannot be installed beside
# libdnnl-dev (their dnnl_config.h differ), so its headers and CMake files are unpacked into build/arm64/deps
# and point at the library of libdnnl2:arm64, which installs beside the amd64 one.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build/arm64
DEPS=$BUILD/deps
HOST_PACKAGES=(g++-aarch64-linux-gnu qemu-user)
# The tests run on the multiarch runtime (loader, libc, libstdc++, OpenMP): cmake/toolchain-aarch64.cmake.
TARGET_PACKAGES=(libhwy-dev:arm64 libdnnl2:arm64 libfmt-dev:arm64 libgtest-dev:arm64 libc6:arm64 libstdc++6:arm64
                 libgomp1:arm64)

say() { echo "check_arm64: $*" >&2; }

install_packages() {
  local missing=() p
  for p in "${HOST_PACKAGES[@]}" "${TARGET_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  [ "$(id -u)" -eq 0 ] || { say "missing packages ${missing[*]}: run as root (or install them)"; exit 2; }
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    say "adding the dpkg architecture arm64 (multiarch)"
    dpkg --add-architecture arm64
  fi
  apt-get update -qq || true
  # Refuse anything but new packages: an upgrade of an amd64 library (Multi-Arch: same versions must agree) or a
  # removal (a -dev package that is not co-installable) would change the native build.
  local plan
  plan=$(apt-get -s install --no-install-recommends "${missing[@]}")
  if grep -qE '^(Remv|Inst [^ ]+ \[)' <<<"$plan"; then
    grep -E '^(Remv|Inst [^ ]+ \[)' <<<"$plan" >&2
    say "apt would remove or upgrade the packages above to install ${missing[*]}; stopping (nothing changed)"
    exit 2
  fi
  say "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# oneDNN's headers and CMake package for arm64, unpacked beside the build (same version as libdnnl2:arm64).
unpack_dnnl_dev() {
  local version deb
  version=$(dpkg-query -W -f='${Version}' libdnnl2:arm64)
  [ -f "$DEPS/version" ] && [ "$(cat "$DEPS/version")" = "$version" ] && return 0
  rm -rf "$DEPS" && mkdir -p "$DEPS"
  say "unpacking libdnnl-dev:arm64 $version into $DEPS"
  # apt downloads as the _apt user where it can write; a folder of root's is fine too (apt says so, harmlessly).
  (cd "$DEPS" && apt-get download -qq "libdnnl-dev:arm64=$version" 2>&1 | grep -v 'unsandboxed' >&2 || true)
  deb=$(ls "$DEPS"/libdnnl-dev_*_arm64.deb)
  dpkg-deb -x "$deb" "$DEPS/root"
  # Its CMake package names the library beside itself; the library is the installed one.
  local lib=/usr/lib/aarch64-linux-gnu
  for so in "$lib"/libdnnl.so.*; do ln -sf "$so" "$DEPS/root$lib/"; done
  echo "$version" >"$DEPS/version"
}

install_packages
unpack_dnnl_dev

LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchain-aarch64.cmake" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O3 -DNDEBUG" -DHLM_NATIVE=OFF -DHLM_KERNELS_ONLY=ON \
  -Ddnnl_DIR="$PWD/$DEPS/root/usr/lib/aarch64-linux-gnu/cmake/dnnl" "${LAUNCHER[@]}" >/dev/null
start=$SECONDS
cmake --build "$BUILD" -j "${JOBS:-2}"
say "built in $((SECONDS - start)) s: $(file -b "$BUILD/hybridlm_kernel_tests" | cut -d, -f1-2)"

# Each test binary run goes through the toolchain's emulator (qemu-aarch64); -V shows the tests and the target.
start=$SECONDS
status=0
ctest --test-dir "$BUILD" -V --output-on-failure || status=$?
say "tests under $(qemu-aarch64 --version | head -n1) took $((SECONDS - start)) s; ctest status $status"
exit "$status"
