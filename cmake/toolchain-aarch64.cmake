# Cross-compiling for 64-bit Arm (aarch64, NEON) on an x86-64 Debian machine: the compiler from
# g++-aarch64-linux-gnu, the target's libraries from Debian multiarch (/usr/lib/aarch64-linux-gnu, packages
# PKG:arm64), and the binaries run under qemu user-mode emulation (qemu-user). scripts/check_arm64.sh uses it.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# find_library / find_package search lib/aarch64-linux-gnu under /usr (and never the host's x86_64 folder).
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# How ctest (and anything CMake runs at build time) starts a target binary: qemu, with / as its prefix, so the loader,
# C library and OpenMP runtime are the multiarch arm64 packages (libc6:arm64, libgomp1:arm64), one consistent set.
# (-L /usr/aarch64-linux-gnu would pair the cross toolchain's loader with the multiarch libc the loader finds
# through ld.so.cache; with that mix the first OpenMP parallel region hung.)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)
