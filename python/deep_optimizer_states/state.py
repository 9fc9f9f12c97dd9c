"""The state of :class:`~deep_optimizer_states.optimizer.DeepOptimizerStates`: its subgroups' step
counts, ``state_dict()`` and ``load_state_dict()``. A mixin: the optimizer's constructor sets up what
these methods read (``_buckets``, ``param_groups``, ``steps_taken``, ``skipped_steps``, ...).
"""

import ctypes

import torch

from . import _capi
from .gradients import _describe

#: The ``format`` tag of :meth:`DeepOptimizerStates.state_dict`'s ``"dos"`` section.
STATE_FORMAT = "deep_optimizer_states/1"
#: The largest subgroup size and step count accepted (2**53: exact in a double, far beyond any model).
_MAX_COUNT = 2 ** 53


class _State:
    """The optimizer's step counts, state_dict() and load_state_dict()."""

    def _settle(self):
        """Before reading or replacing the state: raises ``RuntimeError`` after :meth:`close`,
        waits for a phase the last step left running (:meth:`overlap_forward`) and drops the updates
        speculated since the last step (``overlap=True``), so that the state is the last step's."""
        self._check_open()
        self.wait()
        self._drop_open_phases()

    def subgroup_steps(self):
        """Step count of every subgroup, one list of ints per bucket (in bucket order). Drops the
        updates speculated since the last step (``overlap=True``)."""
        self._settle()
        return [self._bucket_steps(b) for b in self._buckets]

    @staticmethod
    def _bucket_steps(b):
        """The step count of every subgroup of bucket ``b`` (list of ints)."""
        a = (ctypes.c_int64 * len(b.subgroup_sizes))()
        _capi.check(_capi.lib().dos_optimizer_step_counts(b.handle, a), f"reading the step counts of {b.describe()}")
        return list(a)

    def _read_state(self, b, which):
        """Part ``which`` (0: fp32 masters, 1: exp_avg, 2: exp_avg_sq) of bucket ``b``'s state, as a
        flat fp32 tensor of ``b.num_params`` elements in host memory."""
        t = torch.empty(b.num_params, dtype=torch.float32)
        _capi.check(_capi.lib().dos_optimizer_read_state(b.handle, which, ctypes.c_void_p(t.data_ptr())),
                    f"reading {('master', 'exp_avg', 'exp_avg_sq')[which]} of {b.describe()}")
        return t

    def _load_bucket(self, b, master, exp_avg, exp_avg_sq, steps):
        """Replaces bucket ``b``'s state (flat fp32 host tensors of ``b.num_params`` elements, the
        subgroups' step counts) and writes the masters, rounded to the parameters' dtype, into the
        parameters. A failure marks the optimizer broken (the state may be half-written) and raises
        :class:`DosError`."""
        L = _capi.lib()
        if b.device.type == "cuda":
            torch.cuda.synchronize(b.device)  # the runtime writes the parameters on its own streams
        a = (ctypes.c_int64 * len(steps))(*steps)
        ret = L.dos_optimizer_load_state(b.handle, ctypes.c_void_p(master.data_ptr()),
                                         ctypes.c_void_p(exp_avg.data_ptr()), ctypes.c_void_p(exp_avg_sq.data_ptr()),
                                         a, len(steps))
        if ret != 0:
            self._broken = L.dos_last_error().decode("utf-8", "replace")
            _capi.check(ret, f"loading the state of {b.describe()}")
        b.note_param_versions()

    def _params_as_masters(self, b):
        """Bucket ``b``'s parameters as they are now, as one flat fp32 host tensor (the masters they
        stand for): each copied to the host in its own dtype and converted there, so that no fp32
        copy is made on the device."""
        out = torch.empty(b.num_params, dtype=torch.float32)
        for p, off, n in zip(b.params, b.offsets, b.numels):
            if n:
                out.narrow(0, off, n).copy_(p.detach().reshape(-1).cpu())
        return out

    def refresh_masters(self):
        """Takes the fp32 masters from the parameters now, by the rule the optimizer applies by itself
        to parameters written in place (see :meth:`_sync_masters`): for writes torch does not count
        in a parameter's version counter, such as ``p.data.copy_(...)`` or a collective writing
        into the parameter's memory, which the optimizer cannot see. The moments and step counts
        stay. Drops the updates speculated since the last step (``overlap=True``). Costs about 8
        bytes of host memory per element of the largest parameter, for the moment. Raises
        ``RuntimeError`` after :meth:`close`, and (``compact_master=True``) when a bf16 bucket has
        been updated or has loaded a state: its masters are rebuilt from the parameters, and the
        values the runtime last wrote there, which the rule compares with, are gone (nothing is
        changed then; before the first update or load the rule holds and this runs)."""
        self._settle()
        self._refuse_compact_writes("refresh_masters()", force=True)
        for b in self._buckets:
            self._sync_masters(b, force=True)

    def _compact_pristine(self, b):
        """Whether compact bucket ``b``'s masters are its parameters exactly (every low half and
        rounding bit zero, as at construction): nothing updated (no step taken, every subgroup of
        ``b`` at step 0) and no state loaded since construction or the last fresh one (which loads
        the parameters as masters). Reads the step counts only when the counters leave it open."""
        if self.steps_taken or self._state_loaded:
            return False
        return all(s == 0 for s in self._bucket_steps(b))

    def _compact_writes_lost(self, b, force=False):
        """The indices (into ``b.params``) of bucket ``b``'s parameters written in place since the
        runtime last matched them (every one with ``force``) that its compact master cannot follow
        (:meth:`_refuse_compact_writes`): empty for a full bucket, a pristine one
        (:meth:`_compact_pristine`) or one with nothing written. Changes nothing."""
        if not b.compact:
            return []
        written = [j for j in range(len(b.params)) if b.numels[j] and (force or b.param_written(j))]
        return [] if not written or self._compact_pristine(b) else written

    def _refuse_compact_writes(self, what, force=False, buckets=None):
        """Raises ``RuntimeError`` (``what``: the call refused, for the message) when a bucket of
        ``buckets`` (default: every one) keeps the compact master (``compact_master=True``), is not
        pristine (:meth:`_compact_pristine`), and has a parameter written in place since the runtime
        last matched it (every parameter with ``force``, as :meth:`refresh_masters` asks). Such a
        bucket's masters are rebuilt from the parameters, so the value the runtime last wrote into
        a written parameter, which :meth:`_sync_masters`' rule compares with, is gone: applying the
        rule would silently give other bits than ``compact_master=False``. Changes nothing."""
        for b in self._buckets if buckets is None else buckets:
            written = self._compact_writes_lost(b, force)
            if not written:
                continue
            why = ("the compact master (compact_master=True) keeps each fp32 master as its low 16 bits and a rounding "
                   "bit beside the bf16 parameter itself, so the value the runtime last wrote there, which the rule "
                   "for parameters written in place compares with, is gone once the parameter is overwritten; "
                   "going on would silently give other bits than compact_master=False. Nothing was changed")
            if force:
                raise RuntimeError(
                    f"{what} cannot take the masters of {b.describe()} from its parameters after an update or a "
                    f"state load: {why}. Load a whole state with load_state_dict() instead, or build the optimizer "
                    "with compact_master=False to write parameters outside torch's view")
            j = written[0]
            raise RuntimeError(
                f"{what}: {_describe(b.indices[j], b.params[j])} was written in place (or by another optimizer) after "
                f"its bucket ({b.describe()}) was updated or loaded a state: {why}. To go on, load a state with "
                "load_state_dict() (when resuming, load the model's state_dict before the optimizer's), or build the "
                "optimizer with compact_master=False to write parameters in place between steps")

    def _sync_masters(self, b, force=False):
        """Takes bucket ``b``'s fp32 masters from its parameters where one was written in place since
        the runtime last matched them (``model.load_state_dict`` after the optimizer was built,
        ``p.copy_`` under ``torch.no_grad()``; every parameter with ``force``): the parameters are
        what the update starts from, as with ``torch.optim``. Element by element, over the
        parameters written only: where a parameter still holds its master rounded to its dtype
        (round to nearest even, as the runtime writes it) the master stays, with the bits a 16-bit
        parameter cannot hold (so that loading a model checkpoint and its optimizer checkpoint in
        either order resumes the same); elsewhere the master becomes the parameter's value. The
        moments, the step counts and the parameters stay. No phase may be open. Returns True when
        masters changed. Reads and writes the masters of the written parameters only (their range,
        ``dos_optimizer_read_masters`` / ``_write_masters``): about 8 bytes of host memory per
        element of those parameters, for the moment. A compact bucket (``compact_master=True``) that
        is not pristine raises ``RuntimeError`` instead, changing nothing
        (:meth:`_refuse_compact_writes`); a pristine one follows the rule with the same bits as the
        full master (its masters are its parameters)."""
        self._refuse_compact_writes("taking the masters from parameters written in place", force, [b])
        L = _capi.lib()
        changed = False
        for j, p in enumerate(b.params):
            n = b.numels[j]
            if not n or not (force or b.param_written(j)):
                continue
            off = b.offsets[j]
            seg = torch.empty(n, dtype=torch.float32)
            _capi.check(L.dos_optimizer_read_masters(b.handle, off, off + n, ctypes.c_void_p(seg.data_ptr())),
                        f"reading the masters of parameter {b.indices[j]}")
            now = p.detach().reshape(-1).cpu().float()
            if b.compact and not bool(torch.isfinite(now).all()):
                # a compact bucket's masters are rebuilt from the parameters, so an inf or NaN written
                # there would show in both and be taken silently: the write the full form makes is
                # made, for the runtime to refuse as it refuses the full form's (nothing written)
                nowc = now.contiguous()
                self._runtime_call(L.dos_optimizer_write_masters(b.handle, off, off + n, ctypes.c_void_p(nowc.data_ptr())),
                                   f"writing the masters of parameter {b.indices[j]}")
            held = seg.to(b.dtype).float()
            differs = (now != held) & ~(torch.isnan(now) & torch.isnan(held))  # NaN for NaN: no write
            if bool(differs.any()):
                seg[differs] = now[differs]
                self._runtime_call(L.dos_optimizer_write_masters(b.handle, off, off + n, ctypes.c_void_p(seg.data_ptr())),
                                   f"writing the masters of parameter {b.indices[j]}")
                changed = True
        b.note_param_versions()
        return changed

    def _pristine(self, steps=None):
        """Whether nothing has been updated or loaded yet: no step taken (skipped ones change
        nothing), every subgroup at step 0, and no state loaded since construction or the last fresh
        one (a state loaded with step counts 0 may carry masters that are not the parameters).
        ``steps``: :meth:`subgroup_steps` when the caller has read it already."""
        if self.steps_taken or self._state_loaded:
            return False
        return all(s == 0 for bs in (self.subgroup_steps() if steps is None else steps) for s in bs)

    def state_dict(self):
        """The whole optimizer state, as torch tensors in host memory (a dict that ``torch.save``
        writes and :meth:`load_state_dict` takes back):

        - ``"state"``: per parameter index (``state_dict`` numbering: the order of the parameters
          over the groups), a dict of fp32 tensors of the parameter's shape: ``"master"`` (the fp32
          master parameters), ``"exp_avg"``, ``"exp_avg_sq"``;
        - ``"param_groups"``: the groups' hyper-parameters, ``"params"`` holding indices;
        - ``"dos"``: ``format`` (:data:`STATE_FORMAT`), ``buckets`` (per bucket: its group, parameter
          indices, dtype, device type, shapes, ``subgroup_size``, ``subgroup_sizes`` and
          ``subgroup_steps``: each subgroup's step count), ``steps_taken`` and ``skipped_steps``.

        The tensors of one bucket are views of one flat tensor (saved once by ``torch.save``).
        Costs 12 bytes of host memory per parameter. The masters saved follow the parameters
        written in place since the last step, as the next step's would. Before anything has been
        updated or loaded (no step taken; skipped ones change nothing) ``"state"`` is empty, as ``torch.optim``'s is: the moments are zero and
        the masters are the parameters (frameworks that move an optimizer's state to the GPU and
        back when they prepare it, as ``accelerate`` does under the Hugging Face Trainer, then move
        nothing). Raises ``RuntimeError`` after :meth:`close`, and (``compact_master=True``) when a
        bf16 parameter was written in place after its bucket's first update or load (see
        :meth:`step`); ``ValueError`` when ``param_groups``
        was edited by hand after construction (the state would not match the groups listed).
        Drops the updates speculated since the last step (``overlap=True``): the state is the one
        before them.
        """
        self._settle()
        self._check_groups()
        groups = []
        i = 0
        for g in self.param_groups:
            entry = {k: v for k, v in g.items() if k != "params"}
            entry["params"] = list(range(i, i + len(g["params"])))
            i += len(g["params"])
            groups.append(entry)
        state = {}
        buckets = []
        steps = self.subgroup_steps()
        fresh = self._pristine(steps)
        if not fresh:
            self._refuse_compact_writes("state_dict()")  # before any bucket's masters follow their parameters
        for b, bsteps in zip(self._buckets, steps):
            if not fresh:
                self._sync_masters(b)  # a parameter written since the last step is saved as written
                parts = {name: self._read_state(b, which)
                         for which, name in ((0, "master"), (1, "exp_avg"), (2, "exp_avg_sq"))}
                off = 0
                for idx, shape, n in zip(b.indices, b.shapes, b.numels):
                    state[idx] = {name: t.narrow(0, off, n).view(shape) for name, t in parts.items()}
                    off += n
            buckets.append(dict(group=b.group_index, params=list(b.indices), dtype=str(b.dtype),
                                device=b.device.type, shapes=[list(s) for s in b.shapes],
                                subgroup_size=self.subgroup_size, subgroup_sizes=list(b.subgroup_sizes),
                                subgroup_steps=bsteps))
        return {
            "state": state,
            "param_groups": groups,
            "dos": dict(format=STATE_FORMAT, buckets=buckets, steps_taken=self.steps_taken,
                        skipped_steps=self.skipped_steps),
        }

    def _layout(self):
        return [dict(group=b.group_index, params=list(b.indices), dtype=str(b.dtype), device=b.device.type,
                     shapes=[list(s) for s in b.shapes], subgroup_size=self.subgroup_size,
                     subgroup_sizes=list(b.subgroup_sizes)) for b in self._buckets]

    def load_state_dict(self, state_dict):
        """Replaces the whole state with one from :meth:`state_dict` (of an optimizer over the same
        model: same groups, parameter shapes, dtypes, devices and subgroup size), including every
        subgroup's step count and the groups' hyper-parameters, ``decoupled`` among them, as
        ``torch.optim``'s ``load_state_dict`` replaces every group key (a state dict saved as Adam makes
        this optimizer Adam) (the parameters may live on another
        device than when it was saved); then writes the master parameters,
        rounded to each parameter's dtype, into the parameters. Training continues bit-identically
        to a run that never stopped.

        Everything is checked before anything changes: ``ValueError`` naming the first difference
        when the state dict is not one of ours or was saved from a different model (another
        parameter count, shape, dtype or subgroup size), its structure is damaged (a group that is
        not a dict, buckets that are not dicts), a state tensor is missing, not fp32, sparse or on
        the meta device, ``master`` or ``exp_avg`` holds an inf or NaN, ``exp_avg_sq`` an inf, NaN or negative
        value (the message names the parameter, the tensor, the element and the value), a step count
        is not an integer in [0, 2**53], or ``steps_taken``/``skipped_steps`` is not an
        integer in [0, 2**53], or this optimizer's ``param_groups`` was edited by hand after
        construction; the optimizer and the parameters are then untouched. Drops the
        updates speculated since the last step (``overlap=True``).

        An empty ``"state"`` (the state dict of an optimizer that had updated nothing, every step
        count 0) means a fresh state, as for ``torch.optim``: zero moments, step counts 0, the
        masters taken from the parameters as they are (which keep their values).
        """
        self._settle()
        self._check_groups()
        if not isinstance(state_dict, dict) or not isinstance(state_dict.get("dos"), dict) \
                or state_dict["dos"].get("format") != STATE_FORMAT:
            raise ValueError(f"not a DeepOptimizerStates state dict (no 'dos' section of format {STATE_FORMAT!r}): "
                             "load the state dict of a DeepOptimizerStates optimizer")
        dos = state_dict["dos"]
        groups = state_dict.get("param_groups")
        state = state_dict.get("state")
        if not isinstance(groups, list) or not isinstance(state, dict):
            raise ValueError("malformed state dict: 'param_groups' must be a list and 'state' a dict")
        for gi, g in enumerate(groups):
            if not isinstance(g, dict):
                raise ValueError(f"malformed state dict: param_groups[{gi}] must be a dict, got {type(g).__name__}")
            if not isinstance(g.get("params", []), (list, tuple)):
                raise ValueError(f"malformed state dict: param_groups[{gi}]['params'] must be a list of parameter "
                                 f"indices, got {type(g.get('params')).__name__}")
        buckets = dos.get("buckets", [])
        if not isinstance(buckets, (list, tuple)) or not all(isinstance(bk, dict) for bk in buckets):
            raise ValueError("malformed state dict: its 'dos' section's 'buckets' must be a list of dicts, got "
                             f"{buckets!r:.80}")
        here_counts = [len(g["params"]) for g in self.param_groups]
        there_counts = [len(g.get("params", [])) for g in groups]
        if here_counts != there_counts:
            raise ValueError(f"the state dict was saved from a different model: parameters per group {there_counts} "
                             f"in the state dict, {here_counts} here")
        there = [{k: v for k, v in bk.items() if k != "subgroup_steps"} for bk in buckets]
        here = self._layout()
        if len(there) != len(here):
            raise ValueError(f"the state dict was saved from a different model: {len(there)} (group, dtype, device) "
                             f"buckets in the state dict, {len(here)} here")
        for k, (t, h) in enumerate(zip(there, here)):
            # the device may differ (the state is in host memory either way): a run saved on the GPU
            # resumes on the CPU and back
            for key in ("group", "params", "dtype", "shapes", "subgroup_size", "subgroup_sizes"):
                if t.get(key) != h[key]:
                    raise ValueError(f"the state dict was saved from a different model or configuration: bucket {k} "
                                     f"({self._buckets[k].describe()}) has {key} {t.get(key)!r} in the state dict, "
                                     f"{h[key]!r} here")
        for key in ("steps_taken", "skipped_steps"):
            v = dos.get(key, 0)
            if not _capi.int_in(v, 0, _MAX_COUNT):
                raise ValueError(f"the state dict's {key} must be an integer in [0, 2**53], got {v!r}")
        flat = []
        fresh = not state  # an optimizer's state dict before it updated anything
        for k, (bk, b) in enumerate(zip(buckets, self._buckets)):
            steps = bk.get("subgroup_steps")
            # beyond 2**53 a step count is damage (and the C side's int64 would wrap 2**64 to 0)
            if not isinstance(steps, (list, tuple)) or len(steps) != len(b.subgroup_sizes) \
                    or not all(_capi.int_in(s, 0, _MAX_COUNT) for s in steps):
                raise ValueError(f"bucket {k}: subgroup_steps must be {len(b.subgroup_sizes)} integers >= 0 and at most "
                                 f"2**53, got {steps!r}")
            if fresh:
                if any(steps) or dos.get("steps_taken", 0):
                    raise ValueError(f"the state dict has no state tensors but its step counts are not all 0 (bucket {k}: "
                                     f"{steps!r}): only an optimizer that updated nothing saves an empty 'state'; the "
                                     "state dict is damaged")
                flat.append(None)
                continue
            parts = {}
            for name in ("master", "exp_avg", "exp_avg_sq"):
                pieces = []
                for idx, n, shape in zip(b.indices, b.numels, b.shapes):
                    t = state.get(idx, {}).get(name) if isinstance(state.get(idx), dict) else None
                    if not isinstance(t, torch.Tensor):
                        raise ValueError(f"the state dict has no {name!r} tensor for parameter {idx}")
                    if t.layout != torch.strided or t.device.type == "meta":
                        raise ValueError(f"the state dict's {name!r} of parameter {idx} is a {t.layout} tensor on "
                                         f"{t.device}: expected a dense tensor holding values (torch.strided, on the "
                                         "CPU or a GPU)")
                    if t.dtype != torch.float32 or tuple(t.shape) != tuple(shape):
                        raise ValueError(f"the state dict's {name!r} of parameter {idx} is {t.dtype} of shape "
                                         f"{list(t.shape)}; expected torch.float32 of the parameter's shape "
                                         f"{list(shape)} ({n} elements)")
                    flat_t = t.detach().reshape(-1).cpu()
                    bad = ~torch.isfinite(flat_t)
                    if name == "exp_avg_sq":
                        bad |= flat_t < 0
                    if bool(bad.any()):
                        at = int(bad.nonzero()[0, 0])
                        raise ValueError(f"the state dict's {name!r} of parameter {idx} holds {float(flat_t[at])!r} at "
                                         f"element {at} ({'exp_avg_sq must be finite and >= 0' if name == 'exp_avg_sq' else 'must be finite'}): "
                                         "the state dict is damaged or its run diverged")
                    pieces.append(flat_t)
                parts[name] = torch.cat(pieces).contiguous() if pieces else torch.empty(0)
            flat.append((parts, list(steps)))
        for gi, g in enumerate(groups):  # the hyper-parameters to take over, checked first too
            merged = dict(self.param_groups[gi])
            merged.update({k: v for k, v in g.items() if k != "params"})
            self._group_hyper(gi, merged)

        # a fresh state into an optimizer that has updated (or loaded) something: the parameters as
        # masters, taken before anything changes (zero moments and steps)
        reset = fresh and not self._pristine()
        if reset:
            flat = [(dict(master=self._params_as_masters(b), exp_avg=torch.zeros(b.num_params),
                          exp_avg_sq=torch.zeros(b.num_params)), [0] * len(b.subgroup_sizes)) for b in self._buckets]

        # everything checked: apply
        for b, loaded in zip(self._buckets, flat):
            if loaded is not None:
                self._load_bucket(b, loaded[0]["master"], loaded[0]["exp_avg"], loaded[0]["exp_avg_sq"], loaded[1])
            # (into an optimizer that has updated nothing, a fresh state changes nothing: its
            # masters are taken from the parameters at the next step when they were written since)
        self._state_loaded = not fresh
        for gi, g in enumerate(groups):
            for k, v in g.items():
                if k != "params":
                    self.param_groups[gi][k] = v
        self.steps_taken = int(dos.get("steps_taken", 0))
        self.skipped_steps = int(dos.get("skipped_steps", 0))
