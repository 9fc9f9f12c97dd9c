"""ctypes declarations of the runtime's C ABI (``runtime/dos_c.h``, ``libdos_c.so``).

Nothing here imports torch: the binding talks to the runtime through plain C types and raw
pointers, so the same shared library serves any torch version (Debian's 1.13, pip's 2.x).

The library is looked up, in order, at:

1. ``$DOS_C_LIBRARY`` (a full path to ``libdos_c.so``);
2. ``libdos_c.so`` next to this file (a copy put there by hand);
3. the library directory ``meson install`` put it in, as recorded in ``_paths.py`` (generated at
   install time): first relative to where this package is now (an install with ``--destdir``, a
   moved prefix), then as configured;
4. ``<repository>/build/libdos_c.so`` (what ``scripts/setup.sh build`` produces);
5. ``lib/``, ``lib/<multiarch>/`` and ``lib64/`` under ``sys.prefix`` (a package installed
   with ``pip`` or by hand next to a ``meson install`` into the same prefix).

Errors raised: :class:`DosError` (a subclass of ``RuntimeError``) for runtime failures and
``ValueError`` for bad input reported by the library; ``OSError`` when the library cannot be found
or loaded.
"""

import ctypes
import os
import sys
import sysconfig
import threading

ABI_VERSION = 1

DTYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}
MEMORY_HOST = 0
MEMORY_CUDA = 1

_E_INVALID = -1


class DosError(RuntimeError):
    """A failure inside the runtime (StarPU, memory, a previous failed step); the message is the
    runtime's own."""


class StepStats(ctypes.Structure):
    """What one update phase did (``dos_step_stats`` of ``dos_c.h``).

    Fields: ``seconds`` (wall time of the phase, s), ``params`` (elements updated),
    ``subgroups_cpu`` / ``subgroups_gpu`` (Adam tasks run on a CPU / CUDA worker), ``bytes_h2d`` /
    ``bytes_d2h`` (bytes moved host->device / device->host), ``step`` (largest subgroup step count),
    ``cpu_busy_seconds`` / ``gpu_busy_seconds`` (worker time executing tasks, s),
    ``planned_streamed`` / ``planned_resident`` (subgroups the plan put on the GPU),
    ``predicted_seconds`` / ``lower_bound_seconds`` (the ``dos`` model's figures, s; 0 otherwise).
    """

    _fields_ = [
        ("seconds", ctypes.c_double),
        ("params", ctypes.c_uint64),
        ("subgroups_cpu", ctypes.c_uint64),
        ("subgroups_gpu", ctypes.c_uint64),
        ("bytes_h2d", ctypes.c_uint64),
        ("bytes_d2h", ctypes.c_uint64),
        ("step", ctypes.c_int64),
        ("cpu_busy_seconds", ctypes.c_double),
        ("gpu_busy_seconds", ctypes.c_double),
        ("planned_streamed", ctypes.c_uint64),
        ("planned_resident", ctypes.c_uint64),
        ("predicted_seconds", ctypes.c_double),
        ("lower_bound_seconds", ctypes.c_double),
    ]

    def as_dict(self):
        """The fields as a plain ``dict`` (name -> int or float)."""
        return {name: getattr(self, name) for name, _ in self._fields_}


_lib = None
_lib_lock = threading.Lock()


def library_path():
    """The path of ``libdos_c.so`` that :func:`lib` loads (see the module's docstring for the
    search order). Raises ``OSError`` naming every place looked at when none exists."""
    env = os.environ.get("DOS_C_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise OSError(f"DOS_C_LIBRARY={env} is not a file")
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "libdos_c.so")]
    candidates += _installed_candidates(here)
    candidates.append(os.path.join(os.path.dirname(os.path.dirname(here)), "build", "libdos_c.so"))
    multiarch = sysconfig.get_config_var("MULTIARCH")
    for d in ["lib"] + ([os.path.join("lib", multiarch)] if multiarch else []) + ["lib64"]:
        c = os.path.join(sys.prefix, d, "libdos_c.so")
        if c not in candidates:
            candidates.append(c)
    for c in candidates:
        if os.path.isfile(c):
            return c
    raise OSError(
        "cannot find the runtime's C library libdos_c.so (looked at $DOS_C_LIBRARY, "
        + ", ".join(candidates)
        + "): build it with scripts/setup.sh build (or meson compile -C BUILD) and set DOS_C_LIBRARY=BUILD/libdos_c.so, or install it with meson install -C BUILD"
    )


def _installed_candidates(here):
    """Where ``meson install`` put ``libdos_c.so`` according to ``_paths.py`` (none in the source
    tree, where that file does not exist): the configured library directory taken relative to the
    configured package directory and applied to ``here``, then the configured one itself."""
    try:
        from . import _paths
    except ImportError:
        return []
    relative = os.path.relpath(_paths.LIBDIR, _paths.PACKAGE_DIR)
    moved = os.path.normpath(os.path.join(here, relative, "libdos_c.so"))
    configured = os.path.join(_paths.LIBDIR, "libdos_c.so")
    return [moved] if moved == configured else [moved, configured]


def lib():
    """The loaded library with its argument and result types declared (loaded once per process).
    Raises ``OSError`` when it cannot be found or loaded, ``DosError`` when its ABI version or
    ``dos_step_stats`` layout differs from this binding's."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        L = ctypes.CDLL(library_path())
        c_size_p = ctypes.POINTER(ctypes.c_size_t)
        c_void_pp = ctypes.POINTER(ctypes.c_void_p)
        sigs = {
            "dos_c_abi_version": (ctypes.c_int, []),
            "dos_step_stats_size": (ctypes.c_size_t, []),
            "dos_last_error": (ctypes.c_char_p, []),
            "dos_runtime_create": (
                ctypes.c_int,
                [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, c_void_pp],
            ),
            "dos_runtime_destroy": (None, [ctypes.c_void_p]),
            "dos_runtime_running_policy": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
            "dos_runtime_workers": (
                ctypes.c_int,
                [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                 ctypes.POINTER(ctypes.c_int)],
            ),
            "dos_optimizer_create": (
                ctypes.c_int,
                [ctypes.c_void_p, ctypes.c_size_t, c_void_pp, c_void_pp, c_size_p, ctypes.c_int, ctypes.c_int,
                 ctypes.c_size_t, ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_double,
                 ctypes.c_double, ctypes.c_int, ctypes.c_int, c_void_pp],
            ),
            "dos_optimizer_destroy": (None, [ctypes.c_void_p]),
            "dos_optimizer_set_hyper": (
                ctypes.c_int,
                [ctypes.c_void_p, ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_double,
                 ctypes.c_double, ctypes.c_int],
            ),
            "dos_optimizer_step": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(StepStats)]),
            "dos_optimizer_num_params": (ctypes.c_size_t, [ctypes.c_void_p]),
            "dos_optimizer_num_subgroups": (ctypes.c_size_t, [ctypes.c_void_p]),
            "dos_optimizer_subgroup_sizes": (ctypes.c_int, [ctypes.c_void_p, c_size_p]),
            "dos_optimizer_step_counts": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]),
            "dos_optimizer_read_state": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
            "dos_optimizer_load_state": (
                ctypes.c_int,
                [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                 ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t],
            ),
        }
        for name, (res, args) in sigs.items():
            f = getattr(L, name)
            f.restype = res
            f.argtypes = args
        if L.dos_c_abi_version() != ABI_VERSION:
            raise DosError(
                f"{library_path()} has C ABI version {L.dos_c_abi_version()}, this binding needs {ABI_VERSION}: "
                "rebuild the library or use the binding of the same commit"
            )
        if L.dos_step_stats_size() != ctypes.sizeof(StepStats):
            raise DosError("dos_step_stats layout differs between libdos_c.so and the binding: rebuild")
        _lib = L
        return L


def check(ret, what):
    """Raises for a nonzero status of a C call: ``ValueError`` for bad input (DOS_E_INVALID),
    :class:`DosError` otherwise; the message is ``what: <the runtime's message>``."""
    if ret == 0:
        return
    msg = lib().dos_last_error().decode("utf-8", "replace")
    if ret == _E_INVALID:
        raise ValueError(f"{what}: {msg}")
    raise DosError(f"{what}: {msg}")
