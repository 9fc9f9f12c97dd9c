"""The process's runtime: one StarPU instance per process, shared by every optimizer.

StarPU runs once per process, so the scheduling policy and the worker set are process-wide: the
first :class:`~deep_optimizer_states.DeepOptimizerStates` (or a call of :func:`get_runtime`) starts
the runtime with its options, later ones share it and must ask for the same policy (or none).
:func:`shutdown` stops it (it also runs at interpreter exit).
"""

import atexit
import ctypes
import threading
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
    of each CPU worker's Adam codelet), ``options`` (the tuple it was started with).
    """

    def __init__(self, policy, cpu_threads, cpu_workers, ncuda, verbose):
        L = _capi.lib()
        h = ctypes.c_void_p()
        _capi.check(
            L.dos_runtime_create(policy.encode(), int(cpu_threads), int(cpu_workers), int(ncuda), int(bool(verbose)),
                                 ctypes.byref(h)),
            f"starting the runtime with policy '{policy}'",
        )
        self._h = h
        self.policy = policy
        self.options = (policy, int(cpu_threads), int(cpu_workers), int(ncuda))
        buf = ctypes.create_string_buffer(128)
        _capi.check(L.dos_runtime_running_policy(h, buf, 128), "dos_runtime_running_policy")
        self.running_policy = buf.value.decode()
        cw, gw, th = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_int()
        _capi.check(L.dos_runtime_workers(h, ctypes.byref(cw), ctypes.byref(gw), ctypes.byref(th)), "dos_runtime_workers")
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


def get_runtime(policy=None, cpu_threads=0, cpu_workers=0, ncuda=-1, verbose=False):
    """Returns the process's runtime, starting it on the first call.

    Arguments (see ``dos::RuntimeOptions`` in ``runtime/dos.h``):
      policy (str or None): scheduling policy; None means the running runtime's, or ``"dos"`` when
        none runs yet. On a machine without a CUDA worker, ``dos`` runs every update on the CPU.
      cpu_threads (int): OpenMP threads of the CPU Adam codelet; 0: ``$OMP_NUM_THREADS`` or every
        core but one per CUDA worker.
      cpu_workers (int): StarPU CPU workers; 0: one (an OpenMP team).
      ncuda (int): CUDA workers; -1: one per visible device; 0: none.
      verbose (bool): print the runtime's choices on stderr.

    Raises ``ValueError`` when a runtime already runs with a different policy or worker options
    (StarPU runs once per process: call :func:`shutdown` first) or for an unknown policy;
    :class:`~deep_optimizer_states.DosError` when StarPU cannot start; ``OSError`` when
    ``libdos_c.so`` cannot be loaded.
    """
    global _runtime
    with _lock:
        if _runtime is not None and _runtime.alive:
            have = _runtime.options
            want = (policy, int(cpu_threads), int(cpu_workers), int(ncuda))
            defaults = (None, 0, 0, -1)
            for name, h, w, d in zip(("policy", "cpu_threads", "cpu_workers", "ncuda"), have, want, defaults):
                if w != d and w != h:
                    raise ValueError(
                        f"the runtime already runs with {name}={h!r} and one runtime serves the whole process "
                        f"(StarPU runs once per process): ask for {name}={h!r}, or leave it out, or call "
                        f"deep_optimizer_states.shutdown() first (it closes every optimizer), got {name}={w!r}"
                    )
            return _runtime
        _runtime = Runtime(policy or DEFAULT_POLICY, cpu_threads, cpu_workers, ncuda, verbose)
        return _runtime


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
