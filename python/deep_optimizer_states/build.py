"""How a ``DeepOptimizerStates`` (``optimizer.py``) builds its runtime side at its first step: the
runtime started or joined, one runtime optimizer per bucket of its parameters (``bucket.py``)."""

import ctypes
import warnings

import torch

from . import _capi
from . import runtime as _rt
from .bucket import DTYPES, buckets_of, gpu_memory_for_buckets
from .param_groups import groups_layout


class _Build:
    """The mixin of ``DeepOptimizerStates`` that builds its buckets' runtime optimizers."""

    def _build(self, hypers, policy, cpu_threads, cpu_workers, ncuda, verbose, caller_cores=None,
               preferred_caller_cores=0):
        """Starts the runtime (or joins the running one, ``runtime._get_runtime``) and creates one
        runtime optimizer per bucket of ``param_groups`` with parameters (``bucket.buckets_of``: one
        per group, dtype and device), with its flat gradient buffer when ``flat_gradients``.
        ``hypers``: each group's hyper-parameters (``param_groups.group_hyper``'s tuples); the
        others as ``DeepOptimizerStates``' arguments of the same names (``preferred_caller_cores``:
        cores asked for the caller's threads when the runtime leaves them free). StarPU's GPU
        memory is asked for the update budgets' worst case (``gpu_memory_for_buckets``). Warns when
        ``compact_master`` finds no bf16 bucket. Raises what the runtime raises (``DosError``),
        having closed every bucket it made."""
        buckets = buckets_of(self.param_groups, self._frozen)

        running = _rt.current_runtime()
        # StarPU's cache of device buffers bounded by the update budgets, for the policies that keep to
        # them (cpu uses no GPU; static:R and StarPU's built-ins place state on the GPU outside them)
        budgeted = (policy or (running.policy if running else None) or _rt.DEFAULT_POLICY) in ("dos", "gpu", "greedy")
        speculative = self._overlap_asked and self.speculate_streamed and self.speculation_budget != 0
        self._gpu_request = gpu_memory_for_buckets(
            buckets, self.subgroup_size, self.gpu_update_budget, self.gpu_resident_budget,
            speculative) if self.gpu_update_budget and budgeted else 0
        self.runtime = _rt._get_runtime(policy, cpu_threads, cpu_workers, ncuda, verbose, caller_cores,
                                        preferred_caller_cores, self._gpu_request, count_live=True)
        L = _capi.lib()
        try:
            for b in buckets:
                if b.num_params == 0:
                    continue  # nothing to update (a group of empty tensors)
                off = 0
                for n in b.numels:
                    b.offsets.append(off)
                    off += n
                if self.flat_gradients:
                    b.flat_grad = torch.zeros(b.num_params, dtype=b.dtype, device=b.device)
                    for p, shape, off, n in zip(b.params, b.shapes, b.offsets, b.numels):
                        v = b.flat_grad.narrow(0, off, n).view(shape)
                        b.views.append(v)
                        # a parameter without a gradient keeps none (as with torch.optim, a step before any
                        # backward then changes nothing); step() points p.grad at its view once it has one
                        if p.grad is not None and p.grad.layout == torch.strided and p.grad.shape == p.shape \
                                and p.grad.dtype == p.dtype:
                            v.copy_(p.grad)
                            p.grad = v
                nt = len(b.params)
                params = (ctypes.c_void_p * nt)(*[p.data_ptr() for p in b.params])
                # without flat buffers the runtime is told each step's gradients at step(); until then
                # it holds the parameters' own addresses, which it never reads as gradients
                grads = (ctypes.c_void_p * nt)(*[v.data_ptr() for v in b.views] if self.flat_gradients
                                               else [p.data_ptr() for p in b.params])
                numels = (ctypes.c_size_t * nt)(*b.numels)
                if b.device.type == "cuda":
                    torch.cuda.synchronize(b.device)  # the runtime reads the parameters on its own streams
                h = ctypes.c_void_p()
                b.compact = self.compact_master and b.dtype == torch.bfloat16  # the runtime refuses other dtypes
                lr, b1, b2, eps, wd, dec = hypers[b.group_index]
                options = _capi.optimizer_options(
                    lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd, decoupled=bool(dec),
                    subgroup_size=self.subgroup_size, dtype=DTYPES[b.dtype],
                    memory=_capi.MEMORY_CUDA if b.device.type == "cuda" else _capi.MEMORY_HOST, verbose=bool(verbose),
                    speculation_budget=-1 if self.speculation_budget is None else self.speculation_budget,
                    speculate_streamed=int(self.speculate_streamed), urgent_writeback=int(self.urgent_writeback),
                    gpu_update_budget=self.gpu_update_budget or 0, tail_subgroups=self.tail_subgroups,
                    compact_master=int(b.compact),
                    gpu_resident_budget=-1 if self.gpu_resident_budget is None else self.gpu_resident_budget)
                _capi.check(
                    L.dos_optimizer_create(self.runtime.handle, nt, params, grads, numels, ctypes.byref(options),
                                           ctypes.byref(h)),
                    f"creating the runtime optimizer for {b.describe()}",
                )
                b.handle = h
                self._buckets.append(b)  # from here on close() frees it
                self._apply_timeline(b)
                b.hyper = hypers[b.group_index]
                ns = L.dos_optimizer_num_subgroups(h)
                sizes = (ctypes.c_size_t * ns)()
                _capi.check(L.dos_optimizer_subgroup_sizes(h, sizes), f"reading the subgroups of {b.describe()}")
                b.subgroup_sizes = list(sizes)
                b.note_param_versions(claim=False)  # building writes nothing
                b.reset_overlap()
        except BaseException:
            self.close()
            raise
        self._built = True
        if self.compact_master and not any(b.compact for b in self._buckets):
            warnings.warn("compact_master=True has no bf16 parameter to act on: every bucket keeps the full master "
                          "(the compact form needs bf16 parameters; with fp32 weights under autocast, keep the weights "
                          "in bf16 to use it)", stacklevel=3)
        # each group's parameters as built: param_groups edited by hand afterwards are refused
        # (_check_groups), since the runtime's state is laid out for these only
        self._built_groups = groups_layout(self.param_groups)
        _rt._register(self)
