#!/usr/bin/env python3
"""StarPU's bus calibration made apart, in a child process (deep_optimizer_states.runtime's
calibrate_bus_apart: what get_runtime does before starting StarPU when torch has already started
CUDA and the StarPU underneath resets the GPUs after calibrating its bus).

    test_bus_calibration.py

In a fresh StarPU home (XDG_CACHE_HOME set to an empty temporary folder, STARPU_PERF_MODEL_DIR
unset): no bus calibration is there before; after calibrate_bus_apart() exactly one
``<host>.config`` file is in ``.starpu/sampling/bus``, where this process's StarPU then finds it.
Prints whether the StarPU under the library resets the GPUs (the one scripts/setup.sh builds with
CUDA does not). Exits 0 when every check passes, 1 otherwise, 77 (meson's "skip") when the binding
cannot be imported (no torch).
"""

import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

try:
    from deep_optimizer_states import runtime as rtm
except ImportError as e:
    print(f"the binding cannot be imported ({e}): skipped")
    sys.exit(77)


def main():
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            failures.append(what)

    tmp = tempfile.mkdtemp(prefix="dos-bus-")
    try:
        os.environ["XDG_CACHE_HOME"] = tmp  # StarPU's home: its calibrations go under .starpu/sampling
        os.environ.pop("STARPU_PERF_MODEL_DIR", None)
        bus = os.path.join(tmp, ".starpu", "sampling", "bus")
        check(not os.path.isdir(bus), f"a fresh StarPU home has no bus calibration ({bus})")
        try:
            rtm.calibrate_bus_apart()
            made = sorted(f for f in os.listdir(bus) if f.endswith(".config")) if os.path.isdir(bus) else []
            check(len(made) == 1, f"started in a child process, StarPU kept its bus calibration in that home ({made})")
        except Exception as e:  # a failed child: a failure, reported as such
            check(False, f"calibrate_bus_apart raised {type(e).__name__}: {e}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"the StarPU under the library resets the GPUs after calibrating the bus: {rtm.bus_calibration_resets()}")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
