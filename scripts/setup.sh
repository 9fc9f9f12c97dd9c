#!/usr/bin/env bash
# Set up, build and run the Deep Optimizer States runtime on a fresh machine.
#
#   scripts/setup.sh run  [dos-train options]   install what is missing, build, run dos-train
#   scripts/setup.sh test [meson test options]  install what is missing, build, run the test suite
#   scripts/setup.sh deps                       only install/build the dependencies
#   scripts/setup.sh build                      dependencies + build, nothing run
#
# What it does, in order (every step says what it does, and skips itself when already done):
#  1. Debian packages: meson, ninja-build, pkg-config, g++, make, patch, libhwloc-dev, libcmocka-dev,
#     nlohmann-json3-dev, libcli11-dev, libxxhash-dev (checkpoint checksums, header only),
#     libopenmpi-dev, openmpi-bin, through apt-get when the machine has it and a network; for
#     `test`, python3-torch, python3-numpy and libopenblas0-pthread when no python3 imports torch,
#     python3-matplotlib when no python3 imports matplotlib (the PNGs of dos_compare.py and
#     gpu-train.sh), locales when de_DE's locale source is missing (the model test's decimal comma),
#     and slurm-wlm and munge when slurmctld is missing.
#  2. The cache folder .deps/cache (git-ignored): StarPU's Debian source tarball and the .deb files of the
#     header/test libraries, filled when online. On a machine without a network (the GPU machine) the
#     script builds from that folder alone: carry .deps/cache there.
#  3. StarPU: a site's own StarPU (pkg-config starpu-1.4 or starpu-1.3, e.g. from `module load starpu`)
#     is used as it is. Otherwise StarPU 1.3.10 is built from Debian's source package `starpu`
#     1.3.10+dfsg into .deps/starpu-1.3.10[-cuda], with CUDA when nvcc is present, and four patches
#     (two small changes for CUDA 13 in scripts/starpu-1.3.10-cuda13.patch; NVML energy profiling only on request, as
#     StarPU 1.4.5 does, in scripts/starpu-1.3.10-energy.patch; device buffers from CUDA's stream-ordered
#     allocator, whose free does not wait for the whole GPU as cudaFree does, in
#     scripts/starpu-1.3.10-malloc-async.patch; no cudaDeviceReset after the bus calibration, which
#     destroyed the CUDA memory of an application that had started CUDA first (PyTorch), in
#     scripts/starpu-1.3.10-bus-no-reset.patch). DOS_BUILD_STARPU=1 forces our own build.
#  4. meson setup + compile into build/ (-Dcuda=auto).
# Environment: DOS_BUILD_DIR (default build), MESON_OPTIONS (extra `meson setup` options).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=$ROOT/.deps
CACHE=$DEPS/cache
SYSROOT=$DEPS/sysroot
BUILD=${DOS_BUILD_DIR:-$ROOT/build}
STARPU_VERSION=1.3.10
STARPU_TARBALL=starpu_${STARPU_VERSION}+dfsg.orig.tar.gz
CACHE_DEBS="libcmocka0 libcmocka-dev nlohmann-json3-dev libcli11-dev libxxhash0 libxxhash-dev"
APT_PACKAGES="meson ninja-build pkg-config g++ make libhwloc-dev libcmocka-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libopenmpi-dev openmpi-bin"

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

cmd=${1:-run}
[ $# -gt 0 ] && shift
case "$cmd" in run|test|deps|build) ;; -h|--help|help) sed -n '2,29p' "$0"; exit 0 ;;
  *) die "unknown command '$cmd': use run, test, deps or build (scripts/setup.sh --help)" ;; esac

mkdir -p "$CACHE"
# what this script adds to the search paths, for .deps/env.sh (which adds the same at source time)
env_path_add="" env_pkg_add="" env_ld_add=""
if [ -d /usr/local/cuda/bin ]; then
  env_path_add=/usr/local/cuda/bin
  case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) PATH=$PATH:/usr/local/cuda/bin ;; esac
fi
export PATH

SUDO=""
# sudo only where it can be used: without a password, or at a terminal where it can ask for one
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1 && { [ -t 0 ] || sudo -n true 2>/dev/null; }; then SUDO=sudo; fi
can_admin() { [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; }
have_apt() { command -v apt-get >/dev/null 2>&1 && [ -r /etc/debian_version ]; }
online() { have_apt && timeout 20 $SUDO apt-get update -qq >/dev/null 2>&1; }
APT_UPDATED=""
apt_update_once() {
  if [ -z "$APT_UPDATED" ]; then
    if online; then APT_UPDATED=yes; else APT_UPDATED=no; fi
  fi
  [ "$APT_UPDATED" = yes ]
}

# ---- 1. Debian packages -------------------------------------------------------------------------
# What is missing is decided by what works (a command on PATH, a pkg-config module), not by dpkg's
# database, so that tools from elsewhere (a site module, a Python venv's meson) count as present.
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing="$missing $2"; }
need_pc() { { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists "$1" 2>/dev/null; } || missing="$missing $2"; }
missing=""
need_cmd meson meson; need_cmd ninja ninja-build; need_cmd pkg-config pkg-config; need_cmd g++ g++
need_cmd make make; need_cmd patch patch
need_pc hwloc libhwloc-dev; need_pc cmocka libcmocka-dev; need_pc nlohmann_json nlohmann-json3-dev; need_pc CLI11 libcli11-dev
need_pc libxxhash libxxhash-dev
need_cmd mpicxx libopenmpi-dev; need_cmd mpirun openmpi-bin  # dos-train as MPI ranks (optional for the build)
if [ -z "$missing" ]; then
  say "build tools and libraries already present"
elif have_apt && apt_update_once; then
  say "installing Debian packages:$missing"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null 2>&1 \
    || say "apt-get install failed for some of:$missing (continuing with .deps/cache where it can help)"
else
  say "no package manager or no network: not installing$missing (using what is here and .deps/cache)"
fi

# The PyTorch binding's test (tests/test_pytorch.py) needs a Python that imports torch: Debian's
# python3-torch (1.13, CPU) for /usr/bin/python3 (the python3 first on PATH may be a separate install
# that does not see Debian's packages), with OpenBLAS, without which Debian's torch multiplies
# matrices with the reference BLAS (16x slower here). Only for `test`, only when no python3 imports
# torch, without the recommended packages (libtorch-dev, a toolchain: not needed).
if [ "$cmd" = test ] && ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1 \
   && ! python3 -c 'import torch' >/dev/null 2>&1; then
  if have_apt && apt_update_once; then
    say "installing Debian packages for the PyTorch test: python3-torch python3-numpy libopenblas0-pthread"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-torch python3-numpy \
      libopenblas0-pthread >/dev/null 2>&1 || say "apt-get install python3-torch failed: the PyTorch test will skip"
  else
    say "no package manager or no network: not installing python3-torch (the PyTorch test will skip)"
  fi
fi

# The plots of examples/dos_compare.py (compare.png) and scripts/gpu-train.sh (train_gpt.png) need
# matplotlib: Debian's python3-matplotlib for /usr/bin/python3, only for `test`, only when no python3
# imports it (without it the scripts write their tables and say that no PNG was drawn).
if [ "$cmd" = test ] && ! /usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1 \
   && ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
  if have_apt && apt_update_once; then
    say "installing Debian's python3-matplotlib for the comparison plots"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-matplotlib >/dev/null 2>&1 \
      || say "apt-get install python3-matplotlib failed: the comparison scripts will write no PNG"
  else
    say "no package manager or no network: not installing python3-matplotlib (the comparison scripts will write no PNG)"
  fi
fi

# The model test's locale case (a decimal comma, compiled by localedef into a folder of its own)
# needs the locale sources of Debian's locales: only for `test`, only when de_DE's is missing.
if [ "$cmd" = test ] && { ! command -v localedef >/dev/null 2>&1 || [ ! -r /usr/share/i18n/locales/de_DE ]; }; then
  if have_apt && apt_update_once; then
    say "installing Debian's locales for the model test's decimal-comma case"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends locales >/dev/null 2>&1 \
      || say "apt-get install locales failed: the model test's locale case will skip"
  else
    say "no package manager or no network: not installing locales (the model test's locale case will skip)"
  fi
fi

# The Slurm test (tests/e2e_slurm.sh) starts a private single-node Slurm: Debian's slurm-wlm and
# munge, only for `test`, only when slurmctld is missing.
if [ "$cmd" = test ] && ! command -v slurmctld >/dev/null 2>&1 && [ ! -x /usr/sbin/slurmctld ]; then
  if have_apt && apt_update_once; then
    say "installing Debian packages for the Slurm test: slurm-wlm munge"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null 2>&1 \
      || say "apt-get install slurm-wlm munge failed: the Slurm test will skip"
  else
    say "no package manager or no network: not installing slurm-wlm (the Slurm test will skip)"
  fi
fi

# ---- 2. the cache folder ------------------------------------------------------------------------
# a site's own StarPU (section 3) needs no source tarball
if command -v nvcc >/dev/null 2>&1; then STARPU_PREFIX=$DEPS/starpu-$STARPU_VERSION-cuda; WITH_CUDA=1
else STARPU_PREFIX=$DEPS/starpu-$STARPU_VERSION; WITH_CUDA=0; fi
site_starpu=""
if [ "${DOS_BUILD_STARPU:-0}" != 1 ]; then
  for m in starpu-1.4 starpu-1.3; do
    if pkg-config --exists "$m" 2>/dev/null && [ "$(pkg-config --variable=prefix "$m")" != "$STARPU_PREFIX" ]; then
      site_starpu="$m $(pkg-config --modversion "$m") at $(pkg-config --variable=prefix "$m")"; break
    fi
  done
fi
deb_src_entry() {
  # apt-get source needs a deb-src entry: derive it from the machine's own Debian `deb` entry.
  if apt-get indextargets 2>/dev/null | grep -q 'Created-By: Sources'; then return 0; fi
  local f=/etc/apt/sources.list.d/dos-deb-src.sources
  if ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1; then
    say "adding a deb-src entry ($f) derived from the machine's deb entry"
    # deb822 stanzas: keep those that point at Debian's archive, change the type
    awk 'BEGIN{RS="";ORS="\n\n"} /Types:[^\n]*deb/ && /debian/ {sub(/Types:[^\n]*/,"Types: deb-src"); print}' \
      /etc/apt/sources.list.d/*.sources | $SUDO tee "$f" >/dev/null
  else
    f=/etc/apt/sources.list.d/dos-deb-src.list
    say "adding a deb-src entry ($f) derived from /etc/apt/sources.list"
    grep -E '^deb ' /etc/apt/sources.list | grep debian | sed 's/^deb /deb-src /' | $SUDO tee "$f" >/dev/null
  fi
  APT_UPDATED=""; apt_update_once || true
}
if [ -z "$site_starpu" ] && [ ! -f "$CACHE/$STARPU_TARBALL" ] && have_apt && ! can_admin; then
  # apt-get update and a deb-src entry need root: without root or a usable sudo, try what apt's
  # lists allow, and say why it failed
  say "not root and no usable sudo: fetching StarPU's source with apt's lists as they are"
  why=$(cd "$CACHE" && apt-get source --download-only "starpu=${STARPU_VERSION}+dfsg-2" 2>&1 >/dev/null) || {
    why=$(printf '%s\n' "$why" | grep -E '^(E|W):' | tail -1)
    if apt-get indextargets 2>/dev/null | grep -q 'Created-By: Sources'; then
      die "StarPU's source tarball is not in $CACHE and apt-get source failed (${why:-no message}: no network?): run this on a machine with a network, or copy .deps/cache from one that has it, or use a site StarPU (module load starpu), then run this again"
    else
      die "StarPU's source tarball is not in $CACHE, and apt has no source (deb-src) lists, which need root or sudo to add (you are uid $(id -u)): run scripts/setup.sh deps as root once, copy .deps/cache from a machine that has it, or use a site StarPU (module load starpu), then run this again"
    fi
  }
fi
if [ -z "$site_starpu" ] && [ ! -f "$CACHE/$STARPU_TARBALL" ]; then
  have_apt && apt_update_once || die "StarPU's source tarball is not in $CACHE and this machine cannot fetch it: run scripts/setup.sh deps on an online Debian machine and carry .deps/cache"
  deb_src_entry
  say "fetching Debian's source package starpu ${STARPU_VERSION}+dfsg into .deps/cache"
  (cd "$CACHE" && apt-get source --download-only "starpu=${STARPU_VERSION}+dfsg-2" >/dev/null 2>&1 \
     || apt-get source --download-only starpu >/dev/null 2>&1) || die "apt-get source starpu failed"
  [ -f "$CACHE/$STARPU_TARBALL" ] || die "apt-get source did not bring $STARPU_TARBALL (is Debian 12's archive in the apt sources?)"
fi
for d in $CACHE_DEBS; do
  # without root, apt-get download works with apt's lists as they are (no apt-get update)
  if ! ls "$CACHE"/${d}_*.deb >/dev/null 2>&1 && have_apt && { ! can_admin || apt_update_once; }; then
    say "caching $d .deb for offline machines"
    (cd "$CACHE" && apt-get download "$d" >/dev/null 2>&1) || say "could not download $d (offline machines will lack it)"
  fi
done

# Offline machines: take the libraries that pkg-config cannot find from the cached .deb files.
PKG_CONFIG_PATH=${PKG_CONFIG_PATH:-}
for pc in cmocka:libcmocka nlohmann_json:nlohmann-json3-dev CLI11:libcli11-dev libxxhash:libxxhash; do
  mod=${pc%%:*}; pkgs=${pc#*:}
  if ! pkg-config --exists "$mod" 2>/dev/null; then
    mkdir -p "$SYSROOT"
    for deb in "$CACHE"/${pkgs}*.deb; do
      [ -f "$deb" ] || die "$mod is missing and $CACHE holds no ${pkgs}*.deb: run scripts/setup.sh deps on an online Debian machine first"
      say "unpacking $(basename "$deb") into .deps/sysroot"
      dpkg -x "$deb" "$SYSROOT"
    done
  fi
done
if [ -d "$SYSROOT" ]; then
  # the .pc files of the unpacked packages say prefix=/usr: point them at the sysroot
  for pcdir in "$SYSROOT"/usr/lib/*/pkgconfig "$SYSROOT"/usr/share/pkgconfig; do
    [ -d "$pcdir" ] || continue
    sed -i -e "s#^prefix=/usr\$#prefix=$SYSROOT/usr#" -e "s#-I/usr/#-I$SYSROOT/usr/#g" -e "s#-L/usr/#-L$SYSROOT/usr/#g" "$pcdir"/*.pc
    PKG_CONFIG_PATH=$pcdir:$PKG_CONFIG_PATH
    env_pkg_add=$pcdir${env_pkg_add:+:$env_pkg_add}
  done
  sysroot_lib=$(ls -d "$SYSROOT"/usr/lib/*-linux-gnu 2>/dev/null | head -1)
  LD_LIBRARY_PATH=$sysroot_lib:${LD_LIBRARY_PATH:-}
  env_ld_add=$sysroot_lib
  export LD_LIBRARY_PATH
fi

# ---- 3. StarPU ----------------------------------------------------------------------------------
STARPU_PATCHES="starpu-1.3.10-cuda13.patch starpu-1.3.10-energy.patch starpu-1.3.10-malloc-async.patch starpu-1.3.10-bus-no-reset.patch"
stamp_want="starpu $STARPU_VERSION cuda=$WITH_CUDA patch=$(cd "$ROOT/scripts" && cat $STARPU_PATCHES | cksum | cut -d' ' -f1)"
[ $WITH_CUDA = 1 ] && stamp_want="$stamp_want cuda-rpath"  # libstarpu's run path names CUDA's folder
if [ -n "$site_starpu" ]; then
  say "using the site's StarPU: $site_starpu"
elif [ -f "$STARPU_PREFIX/.dos-stamp" ] && [ "$(cat "$STARPU_PREFIX/.dos-stamp")" = "$stamp_want" ]; then
  say "StarPU $STARPU_VERSION already built in ${STARPU_PREFIX#$ROOT/} (cuda=$WITH_CUDA)"
else
  src=$DEPS/src/starpu-$STARPU_VERSION-cuda$WITH_CUDA
  say "building StarPU $STARPU_VERSION (cuda=$WITH_CUDA) into ${STARPU_PREFIX#$ROOT/}: 1-2 minutes on 2 cores"
  rm -rf "$src" "$STARPU_PREFIX"; mkdir -p "$src"
  tar xzf "$CACHE/$STARPU_TARBALL" -C "$src" --strip-components=1
  cuda_opts="--disable-cuda"
  if [ $WITH_CUDA = 1 ]; then
    say "applying scripts/starpu-1.3.10-cuda13.patch (CUDA 13 removed computeMode and the legacy cuBLAS API)"
    (cd "$src" && patch -p1 -s < "$ROOT/scripts/starpu-1.3.10-cuda13.patch")
    say "applying scripts/starpu-1.3.10-energy.patch (NVML energy reads around every CUDA task only with STARPU_ENERGY_PROFILING=1)"
    (cd "$src" && patch -p1 -s < "$ROOT/scripts/starpu-1.3.10-energy.patch")
    say "applying scripts/starpu-1.3.10-malloc-async.patch (device buffers from cudaMallocAsync/cudaFreeAsync: cudaFree waited for the whole GPU)"
    (cd "$src" && patch -p1 -s < "$ROOT/scripts/starpu-1.3.10-malloc-async.patch")
    say "applying scripts/starpu-1.3.10-bus-no-reset.patch (the bus calibration reset the GPU under the application's CUDA memory)"
    (cd "$src" && patch -p1 -s < "$ROOT/scripts/starpu-1.3.10-bus-no-reset.patch")
    cuda_dir=$(dirname "$(dirname "$(command -v nvcc)")")
    cuda_opts="--enable-cuda --with-cuda-dir=$cuda_dir"
    # libstarpu's own run path names CUDA's libraries (cudart, cuBLAS, cuSPARSE): a program's run
    # path does not serve its libraries' needs, and a site's CUDA module may be unloaded at run time
    # (the toolkit's library folder, as meson.build finds it: scripts/cuda-libdir.sh)
    cuda_libdir=$("$ROOT/scripts/cuda-libdir.sh" "$(command -v nvcc)")
    if [ -n "$cuda_libdir" ]; then starpu_ldflags="-Wl,-rpath,$cuda_libdir"; fi
  fi
  (cd "$src" && LDFLAGS="${starpu_ldflags:-} ${LDFLAGS:-}" ./configure --prefix="$STARPU_PREFIX" $cuda_opts --disable-static --disable-build-doc \
      --disable-build-examples --disable-build-tests --disable-fortran --disable-socl --disable-starpufft \
      --disable-mpi --disable-opencl --disable-starpurm --disable-glpk > "$src/configure.out" 2>&1) \
    || die "StarPU configure failed: see ${src#$ROOT/}/configure.out"
  (cd "$src" && make -j"$(nproc)" > "$src/make.out" 2>&1 && make install >> "$src/make.out" 2>&1) \
    || die "StarPU build failed: see ${src#$ROOT/}/make.out"
  echo "$stamp_want" > "$STARPU_PREFIX/.dos-stamp"
  say "StarPU installed in ${STARPU_PREFIX#$ROOT/} ($(du -sh "$STARPU_PREFIX" | cut -f1))"
fi
if [ -z "$site_starpu" ]; then
  PKG_CONFIG_PATH=$STARPU_PREFIX/lib/pkgconfig:$PKG_CONFIG_PATH
  LD_LIBRARY_PATH=$STARPU_PREFIX/lib:${LD_LIBRARY_PATH:-}
  env_pkg_add=$STARPU_PREFIX/lib/pkgconfig${env_pkg_add:+:$env_pkg_add}
  env_ld_add=$STARPU_PREFIX/lib${env_ld_add:+:$env_ld_add}
  export LD_LIBRARY_PATH
fi
export PKG_CONFIG_PATH
# An environment file for running the binaries by hand: `. .deps/env.sh`. It adds this script's
# folders to the variables as they are when it is sourced (a later `module load` is kept), each
# once, with no empty entry (which would make the loader search the current folder).
env_line() {  # env_line VAR DIR first|last: a POSIX sh line that adds DIR to VAR unless it is there
  if [ "$3" = first ]; then
    printf 'case ":${%s:-}:" in *":%s:"*) ;; *) %s="%s${%s:+:$%s}"; export %s ;; esac\n' "$1" "$2" "$1" "$2" "$1" "$1" "$1"
  else
    printf 'case ":${%s:-}:" in *":%s:"*) ;; *) %s="${%s:+$%s:}%s"; export %s ;; esac\n' "$1" "$2" "$1" "$1" "$1" "$2" "$1"
  fi
}
{
  echo "# written by scripts/setup.sh: adds the project's folders to PATH, PKG_CONFIG_PATH and LD_LIBRARY_PATH"
  [ -n "$env_path_add" ] && env_line PATH "$env_path_add" last
  IFS=: read -ra dirs <<< "$env_pkg_add"
  for ((k = ${#dirs[@]} - 1; k >= 0; k--)); do [ -n "${dirs[k]}" ] && env_line PKG_CONFIG_PATH "${dirs[k]}" first; done
  IFS=: read -ra dirs <<< "$env_ld_add"
  for ((k = ${#dirs[@]} - 1; k >= 0; k--)); do [ -n "${dirs[k]}" ] && env_line LD_LIBRARY_PATH "${dirs[k]}" first; done
  true
} > "$DEPS/env.sh"
[ "$cmd" = deps ] && { say "dependencies ready; '. .deps/env.sh' sets PKG_CONFIG_PATH and LD_LIBRARY_PATH"; exit 0; }

# ---- 4. build -----------------------------------------------------------------------------------
if [ ! -f "$BUILD/build.ninja" ]; then
  say "meson setup ${BUILD#$ROOT/}${MESON_OPTIONS:+ $MESON_OPTIONS}"
  meson setup "$BUILD" "$ROOT" --buildtype=release ${MESON_OPTIONS:-} > "$DEPS/meson-setup.out" 2>&1 \
    || { cat "$DEPS/meson-setup.out"; die "meson setup failed"; }
  grep -E "^\s*(CUDA|StarPU|OpenMP)" "$DEPS/meson-setup.out" | sed 's/^ */[setup]   /' || true
else
  say "meson setup: ${BUILD#$ROOT/} already configured"
fi
say "compiling (meson compile -C ${BUILD#$ROOT/})"
meson compile -C "$BUILD" > "$DEPS/meson-compile.out" 2>&1 || { tail -50 "$DEPS/meson-compile.out"; die "compile failed"; }
[ "$cmd" = build ] && { say "built: ${BUILD#$ROOT/}/examples/dos-train"; exit 0; }

case "$cmd" in
  run)  say "running ${BUILD#$ROOT/}/examples/dos-train${*:+ $*}"; exec "$BUILD/examples/dos-train" "$@" ;;
  test) say "running the tests (meson test -C ${BUILD#$ROOT/})"; exec meson test -C "$BUILD" --print-errorlogs "$@" ;;
esac
