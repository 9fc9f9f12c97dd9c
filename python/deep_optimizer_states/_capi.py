"""ctypes declarations of the runtime's C ABI (``runtime/dos_c.h``, ``libdos_c.so``).

Nothing here imports torch: the binding talks to the runtime through plain C types and raw
pointers, so the same shared library serves any torch version (Debian's 1.13, pip's 2.x).

The library is looked up, in order, at:

1. ``$DOS_C_LIBRARY`` (a full path to ``libdos_c.so``);
2. ``libdos_c.so`` next to this file (where ``pip install .`` puts it, with ``libdos.so`` beside
   it: pyproject.toml builds the project with ``-Dpython_wheel=true``; or a copy put there by hand);
3. the library directory ``meson install`` put it in, as recorded in ``_paths.py`` (generated at
   install time): first relative to where this package is now (an install with ``--destdir``, a
   moved prefix), then as configured;
4. ``<repository>/build/libdos_c.so`` (what ``scripts/setup.sh build`` produces);
5. ``lib/``, ``lib/<multiarch>/`` and ``lib64/`` under ``sys.prefix`` (a package installed
   with ``pip`` or by hand next to a ``meson install`` into the same prefix).

Where the loader cannot find a library the runtime needs (StarPU's, from a ``pip install .`` wheel,
which carries no run path to it), it is loaded from the folders the build recorded in
``_paths.py``. Errors raised: :class:`DosError` (a subclass of ``RuntimeError``) for runtime failures and
``ValueError`` for bad input reported by the library; ``OSError`` when the library cannot be found
or loaded.
"""

import ctypes
import os
import sys
import sysconfig
import threading
import time

ABI_VERSION = 14

DTYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}
MEMORY_HOST = 0
MEMORY_CUDA = 1
SUBMIT_ORDER_CODES = {"plan": 0, "cpu_first": 1}
#: Verdicts of ``dos_optimizer_finish_step`` (``DOS_VERDICT_*``).
VERDICT_KEEP = 0
VERDICT_CHANGED = 1
VERDICT_SKIP = 2

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
    ``predicted_seconds`` / ``lower_bound_seconds`` (the ``dos`` model's figures, s; 0 otherwise; the
    prediction counts the phase's set-up before its first submission as measured);
    the overlapped update's: ``exposed_seconds`` (s the caller waited for after its gradients were
    final: the whole phase for a plain step), ``speculated`` (subgroups updated speculatively
    during backward), ``hidden_params`` (elements whose speculative update had ended when the step
    was finished), ``redone`` (speculative updates redone because gradients changed after being
    declared final), ``overlapped`` / ``skipped`` (0 or 1); the late binding's (``tail_subgroups``):
    ``tail_bound`` (subgroups whose side was decided while the phase ran) and ``tail_moved`` (of
    them, those that went to the other side than the plan's); ``refinement_held`` (1: the rates'
    refinement held the phase as an outlier, its measured / predicted ratio more than 1.3x off the
    last phase's under the same plan after two steady phases, and refined nothing from it);
    ``plan_seconds`` (s the phase's start spent on its plan: deciding it, or waiting for the
    decision made when the phase before ended; 0 without a model's plan) and
    ``plan_decided_ahead`` (1: the phase took a decision made before it began); the runtime's own
    gradient downloads (the model's gradients on the GPU copied into the host staging of the
    subgroups the plan updates on the CPU; ``DOS_COPY_BY``): ``longest_download_seconds`` (s, the
    phase's download by the copy engine that took longest from its issue to its end) and
    ``longest_download_bytes`` (its bytes), both 0 when none went by the copy engine (no GPU,
    gradients in host memory or staged by StarPU tasks, no subgroup a plan puts on the CPU, or every
    download by the kernel); ``downloads_dodge_writebacks`` (1: the phase's downloads issued while a
    streamed state was on its way home went by the kernel: always under ``DOS_COPY_BY=auto``, under
    ``adaptive``, the default, once the rule turned after a download of the process starved; said
    of every phase, one that downloaded nothing too; 0 otherwise). Since C ABI 14.
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
        ("exposed_seconds", ctypes.c_double),
        ("speculated", ctypes.c_uint64),
        ("hidden_params", ctypes.c_uint64),
        ("redone", ctypes.c_uint64),
        ("overlapped", ctypes.c_int32),
        ("skipped", ctypes.c_int32),
        ("tail_bound", ctypes.c_uint64),
        ("tail_moved", ctypes.c_uint64),
        ("refinement_held", ctypes.c_int32),
        ("plan_seconds", ctypes.c_double),
        ("plan_decided_ahead", ctypes.c_int32),
        ("longest_download_seconds", ctypes.c_double),
        ("longest_download_bytes", ctypes.c_uint64),
        ("downloads_dodge_writebacks", ctypes.c_int32),
    ]

    def as_dict(self):
        """The fields as a plain ``dict`` (name -> int or float)."""
        return {name: getattr(self, name) for name, _ in self._fields_}


class TimelineTask(ctypes.Structure):
    """One task of an update phase (``dos_timeline_task`` of ``dos_c.h``): ``lane`` (0 CPU worker,
    1 CUDA worker, 2 and 3 the runtime's own host-to-device and device-to-host copies, 4 a streamed
    subgroup's state write-back), ``kind`` (0 Adam, 1 speculative Adam, 2 gradient gather, 3 parameter
    write-back, 4 state write-back), ``subgroup`` (its index), ``start`` / ``end`` (seconds since the phase began)."""

    _fields_ = [("lane", ctypes.c_int32), ("kind", ctypes.c_int32), ("subgroup", ctypes.c_uint64),
                ("start", ctypes.c_double), ("end", ctypes.c_double)]


LANE_NAMES = {0: "cpu", 1: "gpu", 2: "h2d", 3: "d2h", 4: "writeback"}
TASK_NAMES = {0: "adam", 1: "adam_spec", 2: "gather", 3: "scatter", 4: "state"}


def last_timeline(handle):
    """The tasks of the last ended phase of the runtime optimizer ``handle``
    (``dos_optimizer_last_timeline``): ``(started_at, tasks)``, ``started_at`` in seconds on the
    runtime's clock (:func:`clock_seconds`), ``tasks`` a list of dicts ``lane`` ("cpu"/"gpu"/"h2d"/"d2h"/"writeback"),
    ``what`` ("adam", "adam_spec", "gather", "scatter", "state"), ``subgroup`` (int), ``start`` and ``end``
    (float seconds since the phase began). Empty without a timeline. Raises :class:`DosError` or
    ``ValueError`` as :func:`check`."""
    L = lib()
    count, started = ctypes.c_size_t(0), ctypes.c_double(0)
    check(L.dos_optimizer_last_timeline(handle, None, 0, ctypes.byref(count), ctypes.byref(started)),
          "reading the phase's timeline")
    n = count.value
    buf = (TimelineTask * max(n, 1))()
    check(L.dos_optimizer_last_timeline(handle, buf, n, ctypes.byref(count), None), "reading the phase's timeline")
    return started.value, [dict(lane=LANE_NAMES.get(t.lane, str(t.lane)), what=TASK_NAMES.get(t.kind, str(t.kind)),
                                subgroup=int(t.subgroup), start=t.start, end=t.end) for t in buf[:n]]


def clock_offset():
    """The runtime's clock (``dos_clock_seconds``) minus ``time.perf_counter()``, seconds, read at
    once (the midpoint of two perf_counter readings around the runtime's): add a runtime time minus
    this to get a perf_counter time. Meaningful while a runtime runs."""
    t1 = time.perf_counter()
    c = lib().dos_clock_seconds()
    t2 = time.perf_counter()
    return c - 0.5 * (t1 + t2)


class Rates(ctypes.Structure):
    """The resource model's rates (``dos_rates`` of ``dos_c.h``): ``U_c``, ``U_c_dma``, ``U_g``,
    ``D_c`` in parameters/s, ``B_h2d``, ``B_d2h`` in bytes/s. All zero means "calibrate"."""

    _fields_ = [(name, ctypes.c_double) for name in ("U_c", "U_c_dma", "U_g", "D_c", "B_h2d", "B_d2h")]


class OptimizerOptions(ctypes.Structure):
    """An optimizer's options (``struct dos_optimizer_options`` of ``dos_c.h``, where every field's
    unit, default and range are documented). Build one with :func:`optimizer_options`, which fills
    the library's defaults first; ``size`` and ``version`` are the library's to set."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("version", ctypes.c_int),
        ("lr", ctypes.c_double),
        ("beta1", ctypes.c_double),
        ("beta2", ctypes.c_double),
        ("eps", ctypes.c_double),
        ("weight_decay", ctypes.c_double),
        ("decoupled", ctypes.c_int),
        ("subgroup_size", ctypes.c_size_t),
        ("dtype", ctypes.c_int),
        ("memory", ctypes.c_int),
        ("gpu_resident_budget", ctypes.c_int64),
        ("gpu_update_budget", ctypes.c_uint64),
        ("stream_lookahead", ctypes.c_int),
        ("eager_writeback", ctypes.c_int),
        ("native_grads", ctypes.c_int),
        ("urgent_writeback", ctypes.c_int),
        ("submit_order", ctypes.c_int),
        ("rates", Rates),
        ("recalibrate", ctypes.c_int),
        ("verbose", ctypes.c_int),
        ("speculation_budget", ctypes.c_int64),
        ("speculate_streamed", ctypes.c_int),
        ("tail_subgroups", ctypes.c_int),
        ("compact_master", ctypes.c_int),
    ]


def int_in(value, low, high=None):
    """Whether ``value`` is an ``int`` (a ``bool`` is not one here) in [``low``, ``high``], with no
    upper bound when ``high`` is None: the check of an integer option before it crosses into C,
    whose callers raise ``ValueError`` with the option's own range and unit. Never raises."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value and (high is None or value <= high)


def optimizer_options(**fields):
    """A :class:`OptimizerOptions` holding the library's defaults (``dos_optimizer_options_init``)
    with ``fields`` set over them: field name -> value (booleans as ``bool`` or 0/1; ``dtype`` as
    ``"fp32"``/``"fp16"``/``"bf16"`` or its code; ``submit_order`` as ``"plan"``/``"cpu_first"`` or
    its code; ``rates`` as a :class:`Rates` or a dict of its fields).

    Raises ``TypeError`` for a field name the struct does not have (``size`` and ``version``
    included) and ``ValueError`` (from the library, naming the field and its range) only later, at
    ``dos_optimizer_create``; ``OSError`` / :class:`DosError` as :func:`lib`.
    """
    L = lib()
    o = OptimizerOptions()
    check(L.dos_optimizer_options_init(ctypes.byref(o)), "filling the optimizer options' defaults")
    names = {name for name, _ in OptimizerOptions._fields_} - {"size", "version"}
    for name, value in fields.items():
        if name not in names:
            raise TypeError(f"dos_optimizer_options has no field {name!r} (fields: {', '.join(sorted(names))})")
        if name == "dtype" and isinstance(value, str):
            value = DTYPE_CODES[value]
        elif name == "submit_order" and isinstance(value, str):
            value = SUBMIT_ORDER_CODES[value]
        elif name == "rates" and not isinstance(value, Rates):
            value = dict(value)
            rate_names = [n for n, _ in Rates._fields_]
            if set(value) - set(rate_names):
                raise TypeError(f"rates take {', '.join(rate_names)}, not {', '.join(sorted(set(value) - set(rate_names)))}"
                                " (link_share, in a rates file, is not part of the C ABI: given rates start with 1, the"
                                " placeholder of no measure, whose first measure the dos policy takes whole)")
            value = Rates(**value)
        elif isinstance(value, bool):
            value = int(value)
        setattr(o, name, value)
    return o


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


def _dependency_dirs():
    """The folders of the libraries the runtime needs (StarPU's, CUDA's) that lie outside the
    loader's own, as the build recorded them in ``_paths.py`` (``DEP_LIBDIRS``); [] without it."""
    try:
        from . import _paths
    except ImportError:
        return []
    return [d for d in getattr(_paths, "DEP_LIBDIRS", "").split(":") if d]


def _load_with_dependencies(path):
    """``ctypes.CDLL(path)``; when the loader cannot find a library it needs (``libstarpu-1.3.so.9:
    cannot open shared object file``: a ``pip install .`` wheel carries no run path to StarPU's
    folder), that library is loaded first from the folders the build recorded
    (:func:`_dependency_dirs`, with ``RTLD_GLOBAL`` so that the next attempt finds it), and the load
    tried again. Raises the loader's ``OSError`` when a needed library is in none of them."""
    for _ in range(8):
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            missing = str(e).split(": cannot open shared object file")[0].rsplit(": ", 1)[-1].strip()
            found = [os.path.join(d, missing) for d in _dependency_dirs() if os.path.exists(os.path.join(d, missing))]
            if "cannot open shared object file" not in str(e) or not found:
                raise
            ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(path)


def lib():
    """The loaded library with its argument and result types declared (loaded once per process).
    Raises ``OSError`` when it cannot be found or loaded, ``DosError`` when its ABI version or the
    layout of ``dos_step_stats`` or ``dos_optimizer_options`` differs from this binding's."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        L = _load_with_dependencies(library_path())
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
            "dos_runtime_create_for_caller": (
                ctypes.c_int,
                [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, c_void_pp],
            ),
            "dos_gpu_memory_for_budgets": (
                ctypes.c_int,
                [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int64,
                 ctypes.c_int, c_size_p],
            ),
            "dos_starpu_device_margin": (ctypes.c_size_t, []),
            "dos_runtime_destroy": (None, [ctypes.c_void_p]),
            "dos_runtime_running_policy": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
            "dos_runtime_workers": (
                ctypes.c_int,
                [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                 ctypes.POINTER(ctypes.c_int)],
            ),
            "dos_optimizer_options_size": (ctypes.c_size_t, []),
            "dos_optimizer_options_init": (ctypes.c_int, [ctypes.POINTER(OptimizerOptions)]),
            "dos_optimizer_create": (
                ctypes.c_int,
                [ctypes.c_void_p, ctypes.c_size_t, c_void_pp, c_void_pp, c_size_p, ctypes.POINTER(OptimizerOptions),
                 c_void_pp],
            ),
            "dos_optimizer_destroy": (None, [ctypes.c_void_p]),
            "dos_optimizer_set_hyper": (
                ctypes.c_int,
                [ctypes.c_void_p, ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_double,
                 ctypes.c_double, ctypes.c_int],
            ),
            "dos_optimizer_step": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(StepStats)]),
            "dos_optimizer_begin_step": (ctypes.c_int, [ctypes.c_void_p]),
            "dos_optimizer_gradients_final": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]),
            "dos_optimizer_finish_step": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(StepStats)]),
            "dos_optimizer_step_open": (ctypes.c_int, [ctypes.c_void_p]),
            "dos_optimizer_finish_step_async": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
            "dos_optimizer_step_async": (ctypes.c_int, [ctypes.c_void_p]),
            "dos_optimizer_wait_parameters": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]),
            "dos_optimizer_wait_step": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(StepStats)]),
            "dos_optimizer_set_timeline": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
            "dos_optimizer_last_timeline": (
                ctypes.c_int,
                [ctypes.c_void_p, ctypes.POINTER(TimelineTask), ctypes.c_size_t, c_size_p,
                 ctypes.POINTER(ctypes.c_double)],
            ),
            "dos_clock_seconds": (ctypes.c_double, []),
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
            "dos_optimizer_set_gradients": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]),
            "dos_optimizer_read_masters": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                                          ctypes.c_void_p]),
            "dos_optimizer_write_masters": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                                           ctypes.c_void_p]),
        }
        # the version first: a library of another version may lack some of the functions below
        L.dos_c_abi_version.restype, L.dos_c_abi_version.argtypes = ctypes.c_int, []
        if L.dos_c_abi_version() != ABI_VERSION:
            raise DosError(
                f"{library_path()} has C ABI version {L.dos_c_abi_version()}, this binding needs {ABI_VERSION}: "
                "rebuild the library or use the binding of the same commit"
            )
        for name, (res, args) in sigs.items():
            f = getattr(L, name)
            f.restype = res
            f.argtypes = args
        if L.dos_step_stats_size() != ctypes.sizeof(StepStats):
            raise DosError("dos_step_stats layout differs between libdos_c.so and the binding: rebuild")
        if L.dos_optimizer_options_size() != ctypes.sizeof(OptimizerOptions):
            raise DosError("dos_optimizer_options layout differs between libdos_c.so and the binding: rebuild")
        _lib = L
        return L


def check(ret, what):
    """Raises for a nonzero status of a C call: ``ValueError`` for bad input (DOS_E_INVALID),
    :class:`DosError` otherwise; the message is ``what: <the runtime's message>``, ``what`` saying
    what the binding was doing (the runtime's message begins with the C call's name)."""
    if ret == 0:
        return
    msg = lib().dos_last_error().decode("utf-8", "replace")
    if ret == _E_INVALID:
        raise ValueError(f"{what}: {msg}")
    raise DosError(f"{what}: {msg}")
