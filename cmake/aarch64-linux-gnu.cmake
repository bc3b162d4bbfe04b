# Cross-compiling for AArch64 Linux on a Debian x86-64 machine: Debian's
# crossbuild-essential-arm64 (aarch64-linux-gnu-g++) and the :arm64 multiarch
# -dev packages (libraries in /usr/lib/aarch64-linux-gnu, headers shared in
# /usr/include). scripts/arm64 installs them and builds with this file; the
# result runs under qemu-aarch64 here and natively on an ARM machine.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Programs (python3, nm) come from the build machine; libraries and packages
# only from the arm64 multiarch directories.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# pkg-config reads the arm64 .pc files, never the build machine's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
# The tests run under qemu-user (binfmt or explicit) with the arm64 runtime libraries.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static -L /usr/aarch64-linux-gnu)
