"""The process's runtime: one StarPU instance per process, shared by every optimizer.

StarPU runs once per process, so the scheduling policy and the worker set are process-wide: the
first :class:`~deep_optimizer_states.DeepOptimizerStates` (or a call of :func:`get_runtime`) starts
the runtime with its options, later ones share it and must ask for the same policy (or none).
:func:`shutdown` stops it (it also runs at interpreter exit).
"""

import atexit
import ctypes
import os
import re
import subprocess
import sys
import threading
import warnings
import weakref

from . import _capi

_lock = threading.RLock()
_runtime = None
# live optimizers, closed by shutdown() before the runtime stops (they hold StarPU data)
_optimizers = weakref.WeakSet()

DEFAULT_POLICY = "dos"


class Runtime:
    """A started runtime (do not construct directly: use :func:`get_runtime`).

    Attributes: ``policy`` (str, as requested: ``"cpu"``, ``"gpu"``, ``"dos"``, ``"static:R"`` or a
    StarPU built-in such as ``"dmda"``), ``running_policy`` (str, as StarPU reports it),
    ``cpu_workers`` / ``cuda_workers`` (int, StarPU workers), ``cpu_threads`` (int, OpenMP threads
    of each CPU worker's Adam codelet), ``options`` (the tuple it was started with: policy,
    cpu_threads, cpu_workers, ncuda, caller_cores), ``gpu_memory_limit`` (int, bytes: what StarPU
    may allocate on each GPU, from ``$STARPU_LIMIT_CUDA_MEM`` as it started; 0: no limit but
    StarPU's own, 90% of the device).
    """

    def __init__(self, policy, cpu_threads, cpu_workers, ncuda, verbose, caller_cores=0, gpu_memory_limit=0):
        L = _capi.lib()
        h = ctypes.c_void_p()
        before = os.environ.get(_LIMIT_ENV)
        if gpu_memory_limit > 0 and gpu_memory_limit >= 0.9 * _device_memory():
            gpu_memory_limit = 0  # StarPU's own limit, 90% of the device, is the smaller
        if gpu_memory_limit > 0:
            _set_starpu_limit(gpu_memory_limit)
        self.gpu_memory_limit = _starpu_limit()
        try:
            _capi.check(
                L.dos_runtime_create_for_caller(policy.encode(), int(cpu_threads), int(caller_cores), int(cpu_workers),
                                                int(ncuda), int(bool(verbose)), ctypes.byref(h)),
                f"starting the runtime with policy '{policy}'",
            )
        finally:
            # StarPU has read it while starting: the process's environment goes back to what it was, so
            # that neither a later runtime (after shutdown()) nor a child process inherits these budgets
            if gpu_memory_limit > 0:
                if before is None:
                    os.environ.pop(_LIMIT_ENV, None)
                else:
                    os.environ[_LIMIT_ENV] = before
        self._h = h
        self.policy = policy
        self.options = (policy, int(cpu_threads), int(cpu_workers), int(ncuda), int(caller_cores))
        buf = ctypes.create_string_buffer(128)
        _capi.check(L.dos_runtime_running_policy(h, buf, 128), "reading the runtime's policy")
        self.running_policy = buf.value.decode()
        cw, gw, th = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_int()
        _capi.check(L.dos_runtime_workers(h, ctypes.byref(cw), ctypes.byref(gw), ctypes.byref(th)), "reading the runtime's workers")
        self.cpu_workers, self.cuda_workers, self.cpu_threads = cw.value, gw.value, th.value

    @property
    def handle(self):
        """The C handle (``ctypes.c_void_p``); raises :class:`~deep_optimizer_states.DosError` once
        the runtime was shut down."""
        if self._h is None:
            raise _capi.DosError("the runtime was shut down")
        return self._h

    @property
    def alive(self):
        """True until :func:`shutdown`."""
        return self._h is not None

    def _close(self):
        if self._h is not None:
            _capi.lib().dos_runtime_destroy(self._h)
            self._h = None

    def __repr__(self):
        state = "running" if self.alive else "shut down"
        return (f"Runtime(policy={self.policy!r}, StarPU runs {self.running_policy!r}, {self.cpu_workers} CPU "
                f"worker(s) x {self.cpu_threads} threads, {self.cuda_workers} CUDA worker(s), {state})")


_LIMIT_ENV = "STARPU_LIMIT_CUDA_MEM"
_MAX_LIMIT = (2 ** 31 - 1) << 20  # StarPU reads the MiB into an int


def _starpu_limit():
    """Bytes StarPU may allocate on each GPU as ``$STARPU_LIMIT_CUDA_MEM`` (MiB) says; 0 when it is
    unset or not a positive whole number (StarPU's own limit, 90% of the device, then applies, or
    StarPU refuses the value)."""
    m = re.fullmatch(r"\s*\+?([0-9]+)", os.environ.get(_LIMIT_ENV, ""))  # what StarPU's strtol takes whole
    return int(m.group(1)) << 20 if m and int(m.group(1)) > 0 else 0


def _device_memory():
    """Bytes of CUDA device 0 when torch has already started CUDA in this process (asking would
    start it otherwise); infinity when not known."""
    if not _cuda_started():
        return float("inf")
    try:
        return sys.modules["torch"].cuda.get_device_properties(0).total_memory
    except Exception:
        return float("inf")


def _user_stacklevel():
    """The ``stacklevel`` for :func:`warnings.warn` called from this package that names the first
    frame outside it (the caller's line)."""
    here = os.path.dirname(os.path.abspath(__file__))
    f, level = sys._getframe(1), 1
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == here:
        f, level = f.f_back, level + 1
    return level


def _set_starpu_limit(limit):
    """Sets ``$STARPU_LIMIT_CUDA_MEM`` to ``limit`` bytes (rounded up to MiB) for the StarPU about to
    start, with a warning when the environment said otherwise (the GPU budgets win, as
    ``dos::RuntimeOptions::gpu_memory_limit`` does in C++)."""
    mib = min(-(-int(limit) >> 20), _MAX_LIMIT >> 20)
    have = _starpu_limit()
    if os.environ.get(_LIMIT_ENV) is not None and have != mib << 20:
        warnings.warn(f"{_LIMIT_ENV}={os.environ[_LIMIT_ENV]} is replaced by the GPU budgets' {mib} MiB for this "
                      "runtime", stacklevel=_user_stacklevel())
    os.environ[_LIMIT_ENV] = str(mib)


def get_runtime(policy=None, cpu_threads=0, cpu_workers=0, ncuda=-1, verbose=False, caller_cores=None,
                gpu_memory_limit=None):
    """Returns the process's runtime, starting it on the first call.

    Arguments (see ``dos::RuntimeOptions`` in ``runtime/dos.h``):
      policy (str or None): scheduling policy; None means the running runtime's, or ``"dos"`` when
        none runs yet. On a machine without a CUDA worker, ``dos`` runs every update on the CPU.
      cpu_threads (int): OpenMP threads of the CPU Adam codelet; 0: ``$OMP_NUM_THREADS`` or every
        core but one per CUDA worker and but ``caller_cores``.
      cpu_workers (int): StarPU CPU workers; 0: one (an OpenMP team).
      ncuda (int): CUDA workers; -1: one per visible device; 0: none.
      verbose (bool): print the runtime's choices on stderr.
      caller_cores (int or None): with automatic ``cpu_threads`` (and no ``$OMP_NUM_THREADS``, which
        wins), cores left to this process's own threads (>= 0): 1 for an update overlapped with
        backward or the next forward, whose CPU Adam otherwise shares every core with the threads
        that launch the model's kernels. None (default): 0 when starting, and no demand on a
        running runtime.
      gpu_memory_limit (int or None): bytes StarPU may allocate on each GPU, in [1, (2**31 - 1) MiB] (set as
        ``$STARPU_LIMIT_CUDA_MEM``, rounded up to MiB, while StarPU starts; the environment is
        restored afterwards). StarPU keeps the
        device buffers it freed for reuse and StarPU 1.3 cannot hand them back, so without a limit
        its cache grows to what the update phases ever held at once, up to 90% of the device. An
        optimizer given ``gpu_update_budget`` that starts the runtime sets it from its budgets;
        give it here when the runtime must serve several optimizers. None (default): no demand
        (``$STARPU_LIMIT_CUDA_MEM`` or StarPU's own limit when starting).

    When torch has started CUDA in this process and the StarPU underneath resets the GPUs after
    calibrating its bus (:func:`bus_calibration_resets`), StarPU is first started in a child
    process (:func:`calibrate_bus_apart`), so that no calibration happens here.

    Raises ``ValueError`` for an argument of the wrong type or range (each named), when a runtime
    already runs with a different policy or worker options
    (StarPU runs once per process: call :func:`shutdown` first), for an unknown policy, more CPU
    workers asked for (``cpu_workers``, or ``$STARPU_NCPU``, which StarPU lets win) than StarPU
    starts (at most one per core it counts), or a ``gpu_memory_limit`` out of range; warns (``UserWarning``) when a running runtime with CUDA
    workers has a GPU memory limit lower than ``gpu_memory_limit`` (for an optimizer's request:
    plus the live optimizers'), or none;
    :class:`~deep_optimizer_states.DosError` when StarPU cannot start (here or in that child); ``OSError`` when
    ``libdos_c.so`` cannot be loaded.
    """
    if gpu_memory_limit is not None and not _capi.int_in(gpu_memory_limit, 1, _MAX_LIMIT):
        raise ValueError(f"gpu_memory_limit must be None or an integer in [1, (2**31 - 1) MiB] (bytes StarPU may "
                         f"allocate on each GPU; StarPU reads MiB into an int), got {gpu_memory_limit!r}")
    return _get_runtime(policy, cpu_threads, cpu_workers, ncuda, verbose, caller_cores, 0, gpu_memory_limit or 0)


def _check_runtime_args(policy, cpu_threads, cpu_workers, ncuda, verbose):
    """Raises ``ValueError`` naming the argument unless ``policy`` is None or a non-blank str,
    ``cpu_threads`` an integer in [0, 4 x the machine's cores] (the runtime warns, when verbose,
    above the cores this process may use: an affinity narrowed by ``OMP_PROC_BIND`` may be
    intended), ``cpu_workers`` an integer >= 0, ``ncuda`` an integer >= -1 and ``verbose`` a bool
    (the runtime would otherwise start a thread per requested core, or read a string's truth)."""
    if policy is not None and (not isinstance(policy, str) or not policy.strip()):
        raise ValueError(f"policy must be None (the default) or a policy's name such as 'dos', 'cpu', 'static:0.5' or "
                         f"'dmda', got {policy!r}")
    machine = os.cpu_count() or 1
    if not _capi.int_in(cpu_threads, 0, 4 * machine):
        raise ValueError(f"cpu_threads must be an integer in [0, {4 * machine}] (OpenMP threads of the CPU Adam; 0: "
                         f"automatic; this machine has {machine} cores), got {cpu_threads!r}")
    if not _capi.int_in(cpu_workers, 0):
        raise ValueError(f"cpu_workers must be an integer >= 0 (StarPU CPU workers; 0: automatic), got {cpu_workers!r}")
    if not _capi.int_in(ncuda, -1):
        raise ValueError(f"ncuda must be an integer >= -1 (CUDA workers; -1: one per visible GPU), got {ncuda!r}")
    if not isinstance(verbose, bool):
        raise ValueError(f"verbose must be True or False, got {verbose!r}")


def _check_caller_cores(caller_cores):
    """Raises ``ValueError`` unless ``caller_cores`` is None or an integer >= 0."""
    if caller_cores is not None and not _capi.int_in(caller_cores, 0):
        raise ValueError(f"caller_cores must be None or an integer >= 0 (cores left to this process's threads), "
                         f"got {caller_cores!r}")


def _get_runtime(policy, cpu_threads, cpu_workers, ncuda, verbose, caller_cores, preferred_caller_cores,
                 gpu_memory_limit=0, count_live=False):
    """get_runtime, with ``preferred_caller_cores``: the caller cores to start with when
    ``caller_cores`` is None (no demand on a running runtime); ``gpu_memory_limit``: bytes, 0 for
    no demand; ``count_live``: it is one more optimizer's, to which the live optimizers' requests
    add (else it is the whole demand)."""
    global _runtime
    _check_runtime_args(policy, cpu_threads, cpu_workers, ncuda, verbose)
    _check_caller_cores(caller_cores)
    with _lock:
        if _runtime is not None and _runtime.alive:
            have = _runtime.options
            want = (policy, int(cpu_threads), int(cpu_workers), int(ncuda), caller_cores)
            defaults = (None, 0, 0, -1, None)
            for name, h, w, d in zip(("policy", "cpu_threads", "cpu_workers", "ncuda", "caller_cores"), have, want,
                                     defaults):
                if w != d and w != h:
                    raise ValueError(
                        f"the runtime already runs with {name}={h!r} and one runtime serves the whole process "
                        f"(StarPU runs once per process): ask for {name}={h!r}, or leave it out, or call "
                        f"deep_optimizer_states.shutdown() first (it closes every optimizer), got {name}={w!r}"
                    )
            # what the live optimizers asked for stays on the GPU while this one runs (resident state)
            asked = sum(getattr(o, "_gpu_request", 0) for o in list(_optimizers)
                        if not getattr(o, "_closed", True)) if count_live else 0
            have, want = _runtime.gpu_memory_limit, -(-(gpu_memory_limit + asked) >> 20) << 20  # StarPU counts MiB
            if gpu_memory_limit > 0 and _runtime.cuda_workers > 0 and (have == 0 or have < want):
                what = f"{have >> 20} MiB" if have else "no limit but StarPU's own (90% of the device)"
                warnings.warn(f"the running runtime lets StarPU allocate {what} on each GPU, and these GPU budgets want "
                              f"{want >> 20} MiB with the live optimizers': StarPU's cache of device buffers is not "
                              "bounded by them. Start the runtime with get_runtime(gpu_memory_limit=...) covering "
                              "every optimizer's budgets, before the first optimizer", stacklevel=_user_stacklevel())
            return _runtime
        if _cuda_started() and bus_calibration_resets():
            calibrate_bus_apart(verbose)
        cores = preferred_caller_cores if caller_cores is None else caller_cores
        _runtime = Runtime(policy or DEFAULT_POLICY, cpu_threads, cpu_workers, ncuda, verbose, cores, gpu_memory_limit)
        return _runtime


def leaves_no_caller_core(rt):
    """Whether the runtime ``rt``'s CPU Adam takes every core the GPUs leave (automatic
    ``cpu_threads``, no ``$OMP_NUM_THREADS`` > 0, ``caller_cores`` 0, more than one thread): an
    overlapped update then shares cores with the threads that launch the model's kernels."""
    lead = re.match(r"\s*[+-]?\d+", os.environ.get("OMP_NUM_THREADS", ""))  # read as the runtime's atoi does
    omp = int(lead.group()) if lead else 0
    return rt.options[1] == 0 and rt.options[4] == 0 and omp <= 0 and rt.cpu_threads * max(1, rt.cpu_workers) > 1


def _cuda_started():
    """Whether torch has started CUDA in this process (False when torch is not imported)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def bus_calibration_resets():
    """Whether the StarPU under ``libdos_c.so`` resets each GPU (``cudaDeviceReset``) after
    calibrating the bus, as StarPU 1.3 does unless built by ``scripts/setup.sh`` (whose patch
    exports ``starpu_dos_bus_calibration_keeps_context``). The reset destroys the CUDA memory of
    everything that started CUDA in the process before StarPU (a PyTorch model): its next kernel
    faults on an illegal address."""
    return not hasattr(_capi.lib(), "starpu_dos_bus_calibration_keeps_context")


_BUS_ADVICE = ("start the runtime (deep_optimizer_states.get_runtime()) before torch starts CUDA (before the model "
               "goes to the GPU), or use the StarPU that scripts/setup.sh builds (DOS_BUILD_STARPU=1), which does "
               "not reset the GPUs")


def calibrate_bus_apart(verbose=False):
    """Starts and stops StarPU in a child process (the runtime with no CUDA worker: StarPU measures
    the bus of every visible GPU all the same), so that whatever bus calibration StarPU would make
    at start-up (none on file for this host, a file that no longer matches the visible devices or
    cores, ``STARPU_BUS_CALIBRATE=1``) is made there and kept on file; StarPU then starts in this
    process without calibrating, so without resetting the GPUs under the caller's CUDA memory
    (:func:`bus_calibration_resets`). :func:`get_runtime` calls it before starting the runtime
    when torch has started CUDA in this process and the StarPU underneath resets. Seconds: a
    Python start-up, a StarPU start-up and, when one is due, the bus measurement (2-5 in all).
    Raises :class:`~deep_optimizer_states.DosError` when the child fails (for example GPUs in an
    exclusive compute mode, where a second process cannot use them), with the end of its
    output."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import ctypes, sys\n"
            f"sys.path.insert(0, {package_parent!r})\n"
            "from deep_optimizer_states import _capi\n"
            "L, h = _capi.lib(), ctypes.c_void_p()\n"
            "_capi.check(L.dos_runtime_create(b'cpu', 1, 1, 0, 0, ctypes.byref(h)), 'starting StarPU')\n"
            "L.dos_runtime_destroy(h)\n")
    if verbose:
        print("[dos] this StarPU resets the GPUs after calibrating the bus, and CUDA already runs here: starting "
              "StarPU in a child process first, so that any calibration is made there", file=sys.stderr, flush=True)
    try:
        r = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise _capi.DosError(f"starting StarPU in a child process failed ({e}); {_BUS_ADVICE}") from None
    if r.returncode != 0:
        tail = "\n".join(r.stdout.splitlines()[-8:])
        raise _capi.DosError(f"starting StarPU in a child process failed (exit status {r.returncode}); {_BUS_ADVICE}. "
                             f"Its output ended with:\n{tail}")


def current_runtime():
    """The running runtime, or None when none was started (or it was shut down)."""
    with _lock:
        return _runtime if _runtime is not None and _runtime.alive else None


def _register(opt):
    _optimizers.add(opt)


def shutdown():
    """Closes every live optimizer (their state is freed; further use raises) and stops the runtime.
    A later :func:`get_runtime` starts a new one. Runs at interpreter exit too."""
    global _runtime
    with _lock:
        for opt in list(_optimizers):
            opt.close()
        if _runtime is not None:
            _runtime._close()
            _runtime = None


atexit.register(shutdown)
