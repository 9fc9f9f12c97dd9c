#!/usr/bin/env bash
# `meson install` into a temporary folder (--destdir; the build's own prefix is left as it is),
# then, from what was installed only: a C++ program (tests/install_consumer.cpp) compiled and
# linked with `pkg-config --cflags --libs dos` runs one AdamW step and checks it; dos_c.pc finds
# dos_c.h; the installed Python package finds the installed libdos_c.so without DOS_C_LIBRARY
# (skipped, with a message, when the Python given cannot import torch).
# Usage: e2e_install.sh MESON BUILD_DIR CXX CONSUMER_SOURCE PYTHON
set -euo pipefail
meson=$1 build=$2 cxx=$3 consumer=$4 python=$5

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$meson" install -C "$build" --no-rebuild --quiet --destdir "$tmp/root" > "$tmp/install.log" 2>&1 \
  || { cat "$tmp/install.log" >&2; fail "meson install --destdir failed"; }

# The prefix the build was configured with, and where it landed under the destdir
prefix=$("$meson" introspect "$build" --buildoptions | "$python" -c \
  'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
root=$tmp/root$prefix
pc=$(find "$root" -name dos.pc -path '*/pkgconfig/*' | head -1)
[ -n "$pc" ] || fail "no dos.pc installed under $root"
pcdir=$(dirname "$pc")
libdir=$(dirname "$pcdir")
for f in dos/dos.h dos/dos_c.h dos/phase_sim.h dos/resource_model.h dos/adam.h dos/dtype.h dos/plan.h \
         dos/policy.h dos/comm.h dos/partition.h dos/parallel.h; do
  [ -f "$root/include/$f" ] || fail "header include/$f not installed"
done
for f in "$libdir/libdos.so" "$libdir/libdos_c.so" "$pcdir/dos_c.pc" "$root/bin/dos-train" "$root/bin/dos-bench"; do
  [ -f "$f" ] || fail "${f#"$tmp"/root} not installed"
done

# meson test puts the build folder, which holds libraries of the same names, on LD_LIBRARY_PATH:
# take it off, so that what runs below can only have the installed ones.
build_real=$(cd "$build" && pwd -P)
ld_path=
IFS=: read -ra entries <<< "${LD_LIBRARY_PATH:-}"
for e in "${entries[@]}"; do
  [ -n "$e" ] && [ "$(cd "$e" 2>/dev/null && pwd -P)" != "$build_real" ] && ld_path=${ld_path:+$ld_path:}$e
done
export LD_LIBRARY_PATH=$ld_path

# The installed program starts with no LD_LIBRARY_PATH at all: its run path names the installed
# libraries and StarPU's folder (where that is outside the loader's own).
env -u LD_LIBRARY_PATH STARPU_SILENT=1 "$root/bin/dos-train" --preset tiny --iterations 1 --quiet > "$tmp/train.log" 2>&1 \
  || { cat "$tmp/train.log" >&2; fail "the installed dos-train did not start without LD_LIBRARY_PATH"; }
echo "the installed dos-train ran without LD_LIBRARY_PATH"
# The loader here may find CUDA's runtime through ld.so.conf; a site's CUDA module does not put it
# there, so the installed library's own run path must name a folder that holds it.
if command -v readelf >/dev/null; then
  cudart=$(readelf -d "$libdir/libdos.so" | sed -n 's/.*NEEDED.*\[\(libcudart[^]]*\)\]/\1/p')
  if [ -n "$cudart" ]; then
    runpath=$(readelf -d "$libdir/libdos.so" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
    found=
    IFS=: read -ra dirs <<< "$runpath"
    for d in "${dirs[@]}"; do [ -e "$d/$cudart" ] && found=$d; done
    if [ -z "$found" ]; then  # a cudart in the loader's own folders needs no run path
      sys=$(ldconfig -p 2>/dev/null | sed -n "s/.*$cudart.*=> \(.*\)/\1/p" | head -1)
      case "$sys" in /lib/*|/usr/lib/*|/lib64/*|/usr/lib64/*) found="the loader's own ${sys%/*}" ;; esac
    fi
    [ -n "$found" ] || fail "libdos.so needs $cudart, but its run path ($runpath) names no folder holding it"
    echo "libdos.so finds $cudart in $found"
  fi
fi

# The .pc files say prefix=$prefix, where a real install puts them; point them at the destdir copy.
sed -i "s#^prefix=.*#prefix=$root#" "$pcdir"/dos.pc "$pcdir"/dos_c.pc
export PKG_CONFIG_PATH=$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
flags=$(pkg-config --cflags --libs dos) || fail "pkg-config --cflags --libs dos failed"
echo "pkg-config --cflags --libs dos: $flags"
case " $flags " in *" -I$root/include/dos "*) ;; *) fail "dos.pc's flags do not name the installed headers";; esac
# the public headers include each other by name, with no relative path out of include/dos/
grep -l '#include "\.\./' "$root/include/dos/"*.h && fail "an installed header includes by a relative path"

# Compiled away from the source tree: only the installed headers can be found.
mkdir "$tmp/consumer"
cp "$consumer" "$tmp/consumer/main.cpp"
# shellcheck disable=SC2086  # the flags are words
(cd "$tmp/consumer" && "$cxx" -std=c++17 -o consumer main.cpp $flags) || fail "the consumer did not build with dos.pc's flags"
LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} STARPU_SILENT=1 "$tmp/consumer/consumer" \
  || fail "the consumer built against the installed library failed"

# The C ABI: its header through dos_c.pc
printf '#include <dos_c.h>\nint main(void) { return DOS_C_ABI_VERSION > 0 ? 0 : 1; }\n' > "$tmp/consumer/c_abi.cpp"
c_flags=$(pkg-config --cflags dos_c) || fail "pkg-config --cflags dos_c failed"
# shellcheck disable=SC2086  # the flags are words
(cd "$tmp/consumer" && "$cxx" -c -o c_abi.o c_abi.cpp $c_flags) || fail "dos_c.h not found through dos_c.pc"

# The Python package, from the installed copy, without DOS_C_LIBRARY
init=$(find "$root" -path '*/deep_optimizer_states/__init__.py' | head -1)
[ -n "$init" ] || fail "the Python package deep_optimizer_states was not installed under $root"
if ! "$python" -c 'import torch' > /dev/null 2>&1; then
  echo "SKIP (Python part): $python cannot import torch; the C++ part passed"
  exit 0
fi
site=$(dirname "$(dirname "$init")")
(cd "$tmp" && env -u DOS_C_LIBRARY PYTHONPATH="$site" STARPU_SILENT=1 "$python" - "$libdir/libdos_c.so" "$site" <<'PY') \
  || fail "the installed Python package did not load the installed libdos_c.so"
import os, sys
import deep_optimizer_states as dos
from deep_optimizer_states import _capi
want, site = (os.path.realpath(p) for p in sys.argv[1:3])
assert os.path.realpath(dos.__file__).startswith(site + os.sep), f"imported {dos.__file__}, not the installed package in {site}"
got = os.path.realpath(dos.library_path())
assert got == want, f"library_path() is {got}, expected the installed {want}"
version = _capi.lib().dos_c_abi_version()
assert version == _capi.ABI_VERSION, f"ABI version {version}, expected {_capi.ABI_VERSION}"
# libdos.so, which libdos_c.so needs, found beside it (its run path), not elsewhere
with open("/proc/self/maps") as maps:
    loaded = {os.path.realpath(line.split()[-1]) for line in maps if line.rstrip().endswith("/libdos.so")}
beside = os.path.join(os.path.dirname(want), "libdos.so")
assert loaded == {beside}, f"libdos.so loaded from {sorted(loaded)}, expected {beside}"
print(f"Python: deep_optimizer_states from {site} loaded {got} (C ABI {version})")
PY
echo "PASS"
