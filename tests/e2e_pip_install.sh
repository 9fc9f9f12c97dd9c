#!/usr/bin/env bash
# `pip install .` (pyproject.toml, meson-python) into a temporary prefix, then, from the installed
# copy only (another working folder, no DOS_C_LIBRARY, the repository's python/ not on the path):
# the package loads the libdos_c.so inside it, and StarPU without LD_LIBRARY_PATH, and one AdamW step
# on the CPU equals torch.optim.AdamW's.
# Exits 77 (skip) when the Python has no meson-python (Debian: python3-mesonpy) or no torch.
# Not in meson's test list: the wheel build compiles the libraries again (about 2.5 min on the
# 2-core CI machine with CUDA). Run it by hand from the repository root, with StarPU's .pc on
# PKG_CONFIG_PATH (. .deps/env.sh):
#   tests/e2e_pip_install.sh [PYTHON]        # default /usr/bin/python3 (Debian's, with python3-mesonpy)
set -euo pipefail
python=${1:-/usr/bin/python3}
src=$(cd "$(dirname "$0")/.." && pwd)

"$python" -c 'import mesonpy' > /dev/null 2>&1 || { echo "SKIP: $python cannot import mesonpy (apt-get install python3-mesonpy)"; exit 77; }
"$python" -c 'import torch' > /dev/null 2>&1 || { echo "SKIP: $python cannot import torch"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# pip >= 23 on Debian 12 refuses to install next to the system's packages (PEP 668) without this
extra=()
if "$python" -m pip install --help 2>/dev/null | grep -q -- --break-system-packages; then
  extra+=(--break-system-packages)
fi
(cd "$src" && "$python" -m pip install --no-build-isolation --no-deps --no-cache-dir "${extra[@]}" \
  --prefix "$tmp/prefix" . > "$tmp/pip.log" 2>&1) || { tail -40 "$tmp/pip.log" >&2; fail "pip install . failed"; }

init=$(find "$tmp/prefix" -path '*/deep_optimizer_states/__init__.py' | head -1)
[ -n "$init" ] || fail "pip installed no deep_optimizer_states under $tmp/prefix"
pkg=$(dirname "$init")
site=$(dirname "$pkg")
for f in libdos.so libdos_c.so _paths.py; do
  [ -f "$pkg/$f" ] || fail "$f is not in the installed package $pkg"
done

# no LD_LIBRARY_PATH either: the wheel's libraries carry no run path to StarPU's folder (meson-python
# 0.12 leaves install_rpath out), so the package must find StarPU from what the build recorded
(cd "$tmp" && env -u DOS_C_LIBRARY -u LD_LIBRARY_PATH PYTHONPATH="$site" STARPU_SILENT=1 "$python" - "$site" <<'PY') \
  || fail "the pip-installed package did not run a step"
import os, sys
import torch
import deep_optimizer_states as dos
site = os.path.realpath(sys.argv[1])
here = os.path.dirname(os.path.realpath(dos.__file__))
assert here.startswith(site + os.sep), f"imported {dos.__file__}, not the pip-installed package in {site}"
lib = os.path.realpath(dos.library_path())
assert lib == os.path.join(here, "libdos_c.so"), f"library_path() is {lib}, not the copy inside the package"
torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(1000))
ref = torch.nn.Parameter(w.detach().clone())
opt = dos.DeepOptimizerStates([w], lr=1e-2, weight_decay=0.1, policy="cpu", ncuda=0, subgroup_size=300)
torch_opt = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.1)
g = torch.randn(1000)
w.grad, ref.grad = g.clone(), g.clone()
opt.step()
torch_opt.step()
err = (w.detach() - ref.detach()).abs().max().item()
assert err <= 1e-6, f"parameters differ from torch.optim.AdamW's by {err}"
print(f"pip-installed package {here} loaded {lib}; one AdamW step on the CPU within {err:.1e} of torch.optim.AdamW")
PY
echo "PASS"
