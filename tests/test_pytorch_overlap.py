#!/usr/bin/env python3
"""The overlapped update of the PyTorch binding (DeepOptimizerStates(overlap=True)) against the
plain one (overlap=False), bit for bit.

    test_pytorch_overlap.py [--device cpu|cuda]

Exits 77 (meson's "skip") when torch cannot be imported, or with --device cuda when torch sees no
GPU or the runtime has no CUDA worker. The runtime runs the cpu plan (every subgroup on the CPU: the
subgroups that the runtime updates speculatively).

1. Two equal small models (Linear, LayerNorm, GELU, Linear; in two param groups as
   param_groups_no_decay makes them: two buckets; subgroups of 64 elements spanning tensors), fp32
   and bf16, trained on the same data, one optimizer with overlap and one without, through a
   schedule of steps that exercises every path: clipping by max_grad_norm active on some steps and
   not on others, a NaN gradient (the step skipped), gradient accumulation over 2 micro-batches
   (the first such step redone, the next ones kept), back to 1 micro-batch (a plain step, then
   kept again), zero_grad(set_to_none=True) and model.zero_grad(set_to_none=True),
   torch.nn.utils.clip_grad_norm_ before step() (redone), lr changed between backward and step()
   (dropped, the step runs whole), zero_grad() between a backward and the next (dropped), a closure,
   every parameter written in place before the backward (the masters follow: kept) and after it
   (dropped, the step runs whole).
   After every step the parameters must be the same bits; at the end master, exp_avg, exp_avg_sq
   and every subgroup's step count too. The verdict of every step is checked, and at least one step
   must have kept speculative updates and one redone them.
   A third optimizer runs the same schedule with the next forward overlapped too
   (overlap_forward, each layer a block): after each step its phase still runs, a forward reads the
   plain run's parameters bit for bit, its verdicts are the overlapped one's, and its state at the
   end is the plain one's.
2. speculation_budget=0: nothing speculated, the same bits; a bad budget refused; the next forward
   overlapped without the overlap of backward, the same bits; both overlaps with
   urgent_writeback=True, the same bits; a non-bool urgent_writeback refused. timeline=True with both
   overlaps: the same bits, and each phase's timeline holds every subgroup's update; switched on for one
   step between steps, that step's phase alone recorded.
3. The next forward overlapped where modules read parameters in other ways: a transformer encoder
   (attention reading its output projection's weight, the fused fast path in eval, the attention
   called on its own), weight_norm (its pre-hook computes the weight before ours would), a
   parameter unused on some steps, a step without backward, a Llama-like layout with the blocks
   forward_blocks finds (the head tied to the embeddings), a root reading a weight itself (no
   blocks); the same bits as a plain run, and what a forward read while the phase ran equal to what
   it reads after wait(). overlap_forward's and forward_blocks' bad input.
4. Where this torch has no gradient-accumulated hook (simulated), overlap=True warns once and runs
   without overlap.
5. The declarer thread (overlap.py's _Declarer, which tells the runtime of pending CUDA gradients as
   their events complete), on any device, with stand-ins for the optimizer and the events: pending
   gradients of two buckets told in declaration order once their waits return, each once; one
   dropped while its wait runs (as step() drops them) not told; a wait that raises handed over as a
   failure, the next one told; stop() ends the thread; a closed optimizer ends it too.
6. tests/overlap_redo_cases.py, on this device: speculative updates lost and redone with two losses
   (a write between two accumulations, the warning's bucket count, skipped steps).
"""

import argparse
import os
import sys
import warnings

try:
    import torch
except ImportError:
    print("torch is not importable by this Python: skipped")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

import deep_optimizer_states as dos  # noqa: E402
from deep_optimizer_states import overlap as dos_overlap  # noqa: E402
import overlap_redo_cases  # noqa: E402  (this folder, the script's, is on sys.path)

DEVICE = "cpu"
MAX_NORM = 3.0  # the gradient norm is 0.8 to 1.4 here, 8 to 14 with `scale` 10


def make_model(dtype, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.LayerNorm(40), torch.nn.GELU(), torch.nn.Linear(40, 8))
    return m.to(DEVICE, dtype)


def make_opt(model, **kw):
    return dos.DeepOptimizerStates(dos.param_groups_no_decay(model, 0.1), lr=1e-2, betas=(0.9, 0.95),
                                   subgroup_size=64, max_grad_norm=MAX_NORM, **kw)


def same_params(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def same_state(oa, ob):
    sa, sb = oa.state_dict(), ob.state_dict()
    for idx in sa["state"]:
        for name in ("master", "exp_avg", "exp_avg_sq"):
            if not torch.equal(sa["state"][idx][name], sb["state"][idx][name]):
                return f"{name} of parameter {idx}"
    if sa["dos"]["buckets"] != sb["dos"]["buckets"]:
        return "the subgroups' step counts"
    return None


# One entry per step: micro-batches; `scale` multiplies the loss (10: the gradient norm goes above
# MAX_NORM, clipping active); `nan`: a NaN written into one gradient after backward; `none`:
# opt.zero_grad(set_to_none=True) before (`model_none`: the model's own); `ext_clip`:
# torch.nn.utils.clip_grad_norm_ before step(); `lr`: param_groups' lr changed between backward and
# step(); `rezero`: a backward, zero_grad(), then the step's backward; `closure`: step(closure);
# `write`: every parameter halved in place "before" the step's backward (after wait()) or "after" it.
# `expect`: the overlapped optimizer's verdict for both buckets (None: a plain update phase).
SCHEDULE = [
    dict(micro=1, expect="keep"),
    dict(micro=1, scale=10.0, expect="changed"),             # clipped by this optimizer
    dict(micro=1, expect="keep"),
    dict(micro=1, nan=True, expect="skip"),
    dict(micro=1, none=True, expect="keep"),
    dict(micro=2, expect="changed"),                         # more micro-batches than the step before
    dict(micro=2, none=True, expect="keep"),                 # declared in the second backward
    dict(micro=2, scale=10.0, expect="changed"),
    dict(micro=2, ext_clip=True, expect="changed"),          # clip_grad_norm_ writes in place
    dict(micro=1, expect=None),                              # fewer: nothing was declared
    dict(micro=1, model_none=True, expect="keep"),
    dict(micro=1, lr=True, expect=None),                     # dropped: speculated with the old lr
    dict(micro=1, rezero=True, expect="keep"),
    dict(micro=1, closure=True, expect="keep"),
    dict(micro=1, write="before", expect="keep"),            # the masters follow before the phase opens
    dict(micro=1, write="after", expect=None),               # dropped: speculated from the old masters
    dict(micro=1, expect="keep"),
]


def halve_params(model):
    """Writes every parameter in place (exactly: a power of 2)."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)


def train_schedule(dtype):
    ma, mb, mc = make_model(dtype), make_model(dtype), make_model(dtype)
    oa, ob, oc = make_opt(ma), make_opt(mb, overlap=True), make_opt(mc, overlap=True)
    assert ob.overlap, "overlap=True should be on with this torch"
    assert len(ob._buckets) == 2
    assert oc.overlap_forward(mc, blocks=list(mc)) == 3  # the two Linear and the LayerNorm
    probe = torch.randn(4, 24).to(DEVICE, dtype)
    gen = torch.Generator().manual_seed(1)
    clipped = unclipped = kept = redone = 0
    for t, s in enumerate(SCHEDULE):
        batches = [(torch.randn(16, 24, generator=gen), torch.randn(16, 8, generator=gen)) for _ in range(s["micro"])]
        for m, o in ((ma, oa), (mb, ob), (mc, oc)):
            if s.get("write") == "before":
                o.wait()  # (the next forward overlapped: the phase left running ends before the write)
                halve_params(m)
            if s.get("model_none"):
                m.zero_grad(set_to_none=True)
            else:
                o.zero_grad(set_to_none=bool(s.get("none")))

            def backward_all(m=m):
                loss = None
                for x, y in batches:
                    x, y = x.to(DEVICE, dtype), y.to(DEVICE, dtype)
                    loss = ((m(x) - y) ** 2).mean() * s.get("scale", 1.0) / s["micro"]
                    loss.backward()
                return loss

            if s.get("rezero"):
                backward_all()
                o.zero_grad()
            if s.get("closure"):
                o.step(closure=backward_all)
            else:
                backward_all()
                if s.get("nan"):
                    with torch.no_grad():
                        m[0].weight.grad.view(-1)[5] = float("nan")
                if s.get("ext_clip"):
                    torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
                if s.get("lr"):
                    for g in o.param_groups:
                        g["lr"] *= 0.5
                if s.get("write") == "after":
                    halve_params(m)
                o.step()
        la, lb, lc = oa.last_step, ob.last_step, oc.last_step
        if not same_params(ma, mb):
            raise AssertionError(f"{dtype} step {t} ({s}): the parameters differ between overlap on and off; "
                                 f"overlapped: {lb}")
        # the next forward overlapped: the phase runs on after step(); a forward waits for each
        # layer's parameters, which must then be the plain run's bits
        assert lc["running"] == (not lc["skipped"]), (t, lc)
        with torch.no_grad():
            out_a, out_c = ma(probe), mc(probe)
        if not (torch.equal(out_a, out_c) and same_params(ma, mc)):
            raise AssertionError(f"{dtype} step {t} ({s}): with the next forward overlapped, the parameters a forward "
                                 f"reads differ from the plain run's")
        if t % 3 == 0:
            oc.wait()
            assert not lc["running"] and len(lc["stats"]) == 2, (t, lc)
        assert lc["verdicts"] == lb["verdicts"] and lc["skipped"] == lb["skipped"], (t, lb, lc)
        assert la["skipped"] == lb["skipped"] == bool(s.get("nan")), (t, la, lb)
        assert la["overlapped"] is False and la["speculated"] == 0 and la["verdicts"] == [None, None]
        assert lb["verdicts"] == [s["expect"]] * 2, f"{dtype} step {t} ({s}): verdicts {lb['verdicts']}, " \
            f"reasons {lb['redo_reasons']}"
        # the runtime speculates nothing in the step right after one whose gradients changed after
        # their declaration (its updates would most likely be redone too)
        paused = t > 0 and SCHEDULE[t - 1]["expect"] == "changed"
        if paused:
            assert lb["speculated"] == 0 and lb["redone"] == 0, (t, lb)
        elif s["expect"] in ("keep", "changed"):
            assert lb["overlapped"] and lb["speculated"] > 0, (t, lb)
        if s["expect"] == "keep":
            assert lb["redone"] == 0 and not lb["redo_reasons"], (t, lb)
            kept += not paused
        if s["expect"] == "changed" and not paused:
            assert lb["redone"] == lb["speculated"] > 0 and lb["redo_reasons"], (t, lb)
            redone += 1
        if s["expect"] is None:
            assert lb["speculated"] == 0, (t, lb)
        if s.get("lr"):
            assert any("hyper-parameters" in r for r in lb["redo_reasons"]), lb["redo_reasons"]
        if s.get("write") == "after":
            assert any("written in place" in r for r in lb["redo_reasons"]), lb["redo_reasons"]
        if not la["skipped"]:
            clipped += la["clip_coef"] < 1.0
            unclipped += la["clip_coef"] == 1.0
        print(f"{dtype} step {t:2d}: verdicts {lb['verdicts']}, speculated {lb['speculated']}, redone "
              f"{lb['redone']}, hidden {lb['hidden_params']} params, clip {la['clip_coef']:.3f}"
              + (f" ({lb['redo_reasons'][0]})" if lb["redo_reasons"] else ""))
    bad = same_state(oa, ob)
    assert bad is None, f"{dtype}: {bad} differs between overlap on and off"
    bad = same_state(oa, oc)  # state_dict() waits for the phase left running
    assert bad is None, f"{dtype}: {bad} differs between the next forward overlapped and the plain run"
    assert not oc.last_step["running"] and len(oc.last_step["stats"]) == 2
    assert clipped > 0 and unclipped > 0, f"clipping should be active on some steps only: {clipped} clipped, " \
        f"{unclipped} not"
    assert kept > 0 and redone > 0
    assert oa.skipped_steps == ob.skipped_steps == 1
    oa.close()
    ob.close()
    oc.close()


def train_beside_plain(check_step=None, forward=False, **overlapped):
    """Trains two equal models 3 steps, one with the plain optimizer, one with
    make_opt(**overlapped) (and its next forward overlapped when `forward`); the same parameters
    after every step (check_step(optimizer) then checks the overlapped one's step) and the same
    state at the end."""
    ma, mb = make_model(torch.float32), make_model(torch.float32)
    oa, ob = make_opt(ma), make_opt(mb, **overlapped)
    if forward:
        ob.overlap_forward(mb)
    for _ in range(3):
        x, y = torch.randn(16, 24).to(DEVICE), torch.randn(16, 8).to(DEVICE)
        for m, o in ((ma, oa), (mb, ob)):
            o.zero_grad()
            ((m(x) - y) ** 2).mean().backward()
            o.step()
        if forward:
            with torch.no_grad():
                mb(x)  # every layer's parameters waited for
        assert same_params(ma, mb)
        if check_step:
            check_step(ob)
    assert same_state(oa, ob) is None
    oa.close()
    ob.close()


def train_pair(make, steps, blocks_of=None, opt_kw=None, between=None):
    """Trains two equal models made by make() with equal optimizers, the second with its next
    forward overlapped (overlap_forward(model, blocks_of(model)), the default blocks without
    blocks_of); steps(m, o, t) runs step t (zero_grad,
    forward, backward, step); between(m, o, t), when given, runs after every step on the second
    one (a forward reading the parameters). Asserts the same parameters after every step and the
    same state at the end; returns the second optimizer's last_step."""
    ma, mb = make(), make()
    kw = dict(lr=1e-2, weight_decay=0.1, subgroup_size=1 << 12)
    kw.update(opt_kw or {})
    oa, ob = (dos.DeepOptimizerStates(m.parameters(), **kw) for m in (ma, mb))
    ob.overlap_forward(mb, blocks_of(mb) if blocks_of else None)
    for t in range(4):
        for m, o in ((ma, oa), (mb, ob)):
            torch.manual_seed(100 + t)
            steps(m, o, t)
        seen = between(mb, ob, t) if between is not None else None  # while the phase may run
        ob.wait()
        assert same_params(ma, mb), f"step {t}: the parameters differ with the next forward overlapped"
        if seen is not None:  # what it read then must be the final parameters
            assert torch.equal(seen, between(mb, ob, t)), f"step {t}: a forward read parameters not yet written"
    assert same_state(oa, ob) is None
    last = ob.last_step
    oa.close()
    ob.close()
    return last


def test_forward_overlap_cases():
    """The next forward overlapped where modules read parameters in other ways than a forward of
    their own, where parameters get no gradient on some steps, and the API's bad input."""
    # a transformer encoder: attention reads its output projection's weight without calling it,
    # and in eval the layers' fused fast path reads every weight at once; the layers are the blocks
    def encoder():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(DEVICE)

    def encoder_step(m, o, t):
        o.zero_grad()
        m.train()
        m(torch.randn(2, 5, 32).to(DEVICE)).pow(2).mean().backward()
        o.step()

    def eval_forward(m, o, t):
        m.eval()
        torch.manual_seed(7)
        x = torch.randn(2, 5, 32).to(DEVICE)
        with torch.no_grad():
            return m(x)

    def attention_alone(m, o, t):  # a submodule called outside the model's forward
        torch.manual_seed(7)
        x = torch.randn(2, 5, 32).to(DEVICE)
        with torch.no_grad():
            return m.layers[1].self_attn(x, x, x)[0]

    layers = lambda m: list(m.layers)  # noqa: E731
    train_pair(encoder, encoder_step, blocks_of=layers, between=eval_forward)
    train_pair(encoder, encoder_step, blocks_of=layers, between=attention_alone)
    train_pair(encoder, encoder_step, between=eval_forward)  # no blocks: everything waited for first
    # weight_norm's pre-hook computes the weight from weight_g and weight_v before any hook
    # registered after it: each Linear a block of its own
    def normed():
        torch.manual_seed(0)
        wn = torch.nn.utils.weight_norm
        return torch.nn.Sequential(wn(torch.nn.Linear(16, 16)), torch.nn.GELU(), wn(torch.nn.Linear(16, 4))).to(DEVICE)

    def normed_step(m, o, t):
        o.zero_grad()
        m(torch.randn(8, 16).to(DEVICE)).pow(2).mean().backward()
        o.step()

    def normed_forward(m, o, t):
        torch.manual_seed(7)
        with torch.no_grad():
            return m(torch.randn(8, 16).to(DEVICE))

    train_pair(normed, normed_step, between=normed_forward)  # no blocks: everything waited for first
    train_pair(normed, normed_step, blocks_of=lambda m: [m[0], m[2]], between=normed_forward)
    # a parameter unused on some steps (a zero gradient, as after zero_grad()), and a step with no
    # backward since zero_grad() (zero gradients: the moments decay, weight decay applies)
    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])

        def forward(self, x, use_second):
            x = self.layers[0](x)
            return self.layers[1](x) if use_second else x

    def branchy_step(m, o, t):
        o.zero_grad()
        if t != 2:  # step 2: no backward at all
            m(torch.randn(4, 8).to(DEVICE), t % 2 == 0).sum().backward()
        o.step()

    last = train_pair(lambda: Branchy().to(DEVICE), branchy_step, blocks_of=lambda m: list(m.layers))
    assert last["overlapped"] is False, last  # a plain phase left running is not an overlapped one
    # a Llama-like layout (embeddings, layers, final norm, the head tied to the embeddings) with the
    # blocks forward_blocks finds; and a root that reads a sibling's weight itself (position
    # embeddings added by hand), correct with no blocks
    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(50, 16)
            self.layers = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
                                               for _ in range(3)])
            self.norm = torch.nn.LayerNorm(16)

    class LlamaLike(torch.nn.Module):
        def __init__(self, by_hand=False):
            super().__init__()
            torch.manual_seed(0)
            self.model = Inner()
            self.lm_head = torch.nn.Linear(16, 50, bias=False)
            self.lm_head.weight = self.model.embed_tokens.weight
            self.pos = torch.nn.Embedding(8, 16)
            self.by_hand = by_hand

        def forward(self, ids):
            h = self.model.embed_tokens(ids)
            h = h + (self.pos.weight[: ids.shape[1]] if self.by_hand else self.pos(torch.arange(ids.shape[1])))
            for layer in self.model.layers:
                h = h + layer(h)
            return self.lm_head(self.model.norm(h))

    def lm_step(m, o, t):
        o.zero_grad()
        ids = torch.randint(0, 50, (2, 6))
        torch.nn.functional.cross_entropy(m(ids).flatten(0, 1), ids.flatten()).backward()
        o.step()

    def lm_forward(m, o, t):
        torch.manual_seed(7)
        with torch.no_grad():
            return m(torch.randint(0, 50, (2, 6)))

    blocks = dos.forward_blocks(LlamaLike())
    assert [type(b).__name__ for b in blocks] == ["Embedding", "Sequential", "Sequential", "Sequential", "LayerNorm",
                                                  "Linear"], blocks
    train_pair(LlamaLike, lm_step, blocks_of=dos.forward_blocks, between=lm_forward)
    train_pair(lambda: LlamaLike(by_hand=True), lm_step, between=lm_forward)
    try:
        dos.forward_blocks(torch.nn.Linear(2, 2))
    except ValueError as e:
        assert "forward_blocks" in str(e), e
    else:
        raise AssertionError("forward_blocks accepted a layout it does not know")
    # bad input
    m = Branchy().to(DEVICE)
    o = dos.DeepOptimizerStates(m.parameters(), lr=1e-2)
    for bad, err, what in (("model", TypeError, "not a module"), (m.layers[1], ValueError, "not in the module"),
                           (torch.nn.Linear(2, 2), ValueError, "not in the module")):
        try:
            o.overlap_forward(bad)
        except err as e:
            assert "overlap_forward" in str(e), e
        else:
            raise AssertionError(f"overlap_forward accepted a module {what}")
    try:
        o.overlap_forward(m, blocks=[torch.nn.Linear(2, 2)])
    except ValueError as e:
        assert "not a submodule" in str(e), e
    else:
        raise AssertionError("overlap_forward accepted a block outside the module")
    assert o.overlap_forward(m) > 0
    try:
        o.overlap_forward(m)
    except ValueError as e:
        assert "called before" in str(e), e
    else:
        raise AssertionError("overlap_forward accepted twice")
    o.close()


def test_budget_and_fallback():
    def nothing_speculated(o):
        assert o.last_step["verdicts"] == ["keep", "keep"] and o.last_step["speculated"] == 0

    train_beside_plain(nothing_speculated, overlap=True, speculation_budget=0)
    for bad in (-1, 1.5, True):
        try:
            make_opt(make_model(torch.float32), overlap=True, speculation_budget=bad)
        except ValueError as e:
            assert "speculation_budget" in str(e)
        else:
            raise AssertionError(f"speculation_budget={bad!r} accepted")
    # the streamed subgroups in the speculation too: the same training, bit for bit
    train_beside_plain(overlap=True, speculate_streamed=True)
    # the next forward overlapped without the overlap of backward (zero_grad() while the phase runs)
    train_beside_plain(forward=True)
    try:
        make_opt(make_model(torch.float32), overlap=True, speculate_streamed=1)
    except ValueError as e:
        assert "speculate_streamed" in str(e)
    else:
        raise AssertionError("speculate_streamed=1 accepted")
    # the CPU's parameter write-backs ahead of the queue, with both overlaps: the same bits
    train_beside_plain(forward=True, overlap=True, urgent_writeback=True)
    # timelines of overlapped phases (completed once the phase left running ends): every subgroup's
    # update, speculative or not, once; the same bits

    def timeline_check(o):
        o.wait()
        assert o.last_step["stats"], "no phase figures"
        for st in o.last_step["stats"]:
            updates = sorted(t["subgroup"] for t in st["timeline"] if t["what"] in ("adam", "adam_spec"))
            n = st["subgroups_cpu"] + st["subgroups_gpu"]
            assert len(updates) >= n and set(updates) == set(range(n)), (updates, n)
            assert all(0 <= t["start"] <= t["end"] for t in st["timeline"])
    train_beside_plain(timeline_check, forward=True, overlap=True, timeline=True)
    # the attribute switched between steps, with both overlaps: the second step's phase alone recorded
    seen = []

    def toggle(o):
        o.wait()
        assert o.last_step["stats"], "no phase figures"
        seen.append(all("timeline" in st for st in o.last_step["stats"]))
        o.timeline = len(seen) == 1
    train_beside_plain(toggle, forward=True, overlap=True)
    assert seen == [False, True, False], seen
    try:
        make_opt(make_model(torch.float32), urgent_writeback="yes")
    except ValueError as e:
        assert "urgent_writeback" in str(e)
    else:
        raise AssertionError("urgent_writeback='yes' accepted")

    # a torch without the hook: one warning, no overlap, the same training
    real = dos_overlap._grad_hook_kind
    dos_overlap._grad_hook_kind = lambda: None
    dos_overlap._warned_no_hooks = False
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            o1 = make_opt(make_model(torch.float32), overlap=True)
            o2 = make_opt(make_model(torch.float32), overlap=True)
        msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
        assert len(msgs) == 1 and "without overlap" in msgs[0], msgs
        assert not o1.overlap and not o2.overlap
        o1.close()
        o2.close()
    finally:
        dos_overlap._grad_hook_kind = real


def test_declarer():
    """Part 5 of the module's docstring."""
    import threading
    import time

    class Event:  # a stand-in for torch.cuda.Event: its wait returns after `seconds`, or raises
        def __init__(self, seconds, error=None):
            self.seconds, self.error = seconds, error

        def synchronize(self):
            time.sleep(self.seconds)
            if self.error:
                raise RuntimeError(self.error)

    class Bucket:
        def __init__(self):
            self.pending, self.open, self.device = [], True, None  # no CUDA device to make current

    class Opt:  # what _Declarer reads of the optimizer, and a _declare_done that records
        def __init__(self):
            self._overlap_lock = threading.RLock()
            self._buckets, self._closed, self._broken, self.told = [Bucket(), Bucket()], False, None, []

        def _declare_done(self, b, j, ev, failed=None):
            for k, (_, e) in enumerate(b.pending):
                if e is ev:
                    del b.pending[k]
                    self.told.append(j if failed is None else ("failed", j, str(failed)))
                    return

    def add(o, d, b, j, ev):  # as _declare does, with the lock held
        b.pending.append((j, ev))
        d.notify(b, j, ev)

    def until(cond, seconds=5.0):
        end = time.monotonic() + seconds
        while not cond() and time.monotonic() < end:
            time.sleep(0.005)
        return cond()

    o = Opt()
    with o._overlap_lock:
        d = dos_overlap._Declarer(o)
        for j in range(6):
            add(o, d, o._buckets[j % 2], j, Event(0.01))
    assert until(lambda: len(o.told) == 6), o.told
    # in the order they were declared, over both buckets
    assert o.told == [0, 1, 2, 3, 4, 5], o.told
    with o._overlap_lock:
        add(o, d, o._buckets[1], 7, Event(0.3))
    time.sleep(0.05)  # its wait runs
    with o._overlap_lock:
        o._buckets[1].pending = []  # as step() drops the step's pending gradients
    time.sleep(0.4)
    assert o.told == [0, 1, 2, 3, 4, 5], o.told
    # a wait that raises is handed over as such, and the thread goes on
    with o._overlap_lock:
        add(o, d, o._buckets[0], 8, Event(0.01, "device-side assert"))
        add(o, d, o._buckets[1], 9, Event(0.01))
    assert until(lambda: len(o.told) == 8), o.told
    assert o.told[6:] == [("failed", 8, "device-side assert"), 9], o.told
    d.stop()
    assert until(lambda: not d._thread.is_alive()), "stop() did not end the thread"
    o2 = Opt()
    with o2._overlap_lock:
        d2 = dos_overlap._Declarer(o2)
    t2 = d2._thread
    o2._closed = True  # as close() leaves it
    with o2._overlap_lock:
        add(o2, d2, o2._buckets[0], 0, Event(0.01))
    assert until(lambda: not t2.is_alive()), "a closed optimizer did not end the thread"
    print("declarer: pending gradients told in declaration order once their waits returned, a dropped one not "
          "told, a failed wait handed over and the thread going on; stop() and a closed optimizer end the thread")


def main():
    global DEVICE
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = ap.parse_args()
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA device for torch: skipped")
        return 77
    rt = dos.get_runtime("cpu", cpu_threads=2, cpu_workers=1, ncuda=-1 if DEVICE == "cuda" else 0, verbose=False)
    if DEVICE == "cuda" and rt.cuda_workers == 0:
        print("the runtime has no CUDA worker: skipped")
        return 77
    print(f"torch {torch.__version__}, hook: {dos_overlap._grad_hook_kind()}, device {DEVICE}")
    for dtype in (torch.float32, torch.bfloat16):
        train_schedule(dtype)
    test_budget_and_fallback()
    test_forward_overlap_cases()
    overlap_redo_cases.test_write_between_accumulations(DEVICE)
    overlap_redo_cases.test_partial_redo_warning(DEVICE)
    overlap_redo_cases.test_skipped_steps_no_warning(DEVICE)
    test_declarer()
    print("overlap on and off: the same bits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
