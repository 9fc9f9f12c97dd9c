#!/usr/bin/env python3
"""Tests of the PyTorch binding's state against what frameworks do with an optimizer before and
between its steps: the state dict of an optimizer that has updated nothing, and parameters written
in place after the optimizer was built.

    python3 tests/test_pytorch_state.py [--device cpu|cuda] [--policy cpu|gpu|dos|...]

Exits 0 when every check passes, 1 otherwise, 77 (skipped) without torch, or for cuda without a
GPU or a runtime without a CUDA worker.

1. A fresh optimizer's state dict holds no state tensors (as torch.optim's), so that a framework that
   moves the state to the GPU and back while preparing the optimizer (accelerate, under the Hugging
   Face Trainer) moves nothing; loading it back changes nothing (the same bits as without); loading
   it into an optimizer that has stepped resets it to a fresh one over the parameters as they are
   (the same bits as an optimizer built then); an empty state with step counts refused, nothing
   changed.
2. Parameters written in place between steps (``model.load_state_dict``, ``p.mul_`` under
   ``torch.no_grad()``): the next update starts from them, as with torch.optim. fp32: against
   torch.optim.AdamW with the same writes, within the binding's tolerance (the write ignored would be
   off by half the parameters). bf16: the same bits as loading a state dict whose masters are the
   written parameters. A model checkpoint and its optimizer checkpoint loaded in either order resume
   the same bits as an uninterrupted run (the masters keep the bits a bf16 parameter cannot hold).
   A write through ``p.data`` (which torch does not count) followed by ``refresh_masters()``: the
   same bits as the counted write. A write after the last step, then both checkpoints saved: the
   optimizer's holds the written masters, and either load order resumes the run that went on.
3. What frameworks wrap around the optimizer: under DistributedDataParallel with
   ``gradient_as_bucket_view=True`` (gloo, one rank, on the CPU only), the gradients stay DDP's
   views and the steps are the same bits as without DDP; with the next forward overlapped,
   ``model.zero_grad(set_to_none=True)`` then backward leaves every gradient in the optimizer's flat
   buffer, and ``model.load_state_dict`` while the phase runs waits for it; a state loaded with step counts 0 is saved with its masters (not as a fresh, empty one).
4. A parameter whose storage was replaced (``p.data = ...``) or that no longer requires gradients
   after a step: refused at ``step()``, nothing changed.
5. Parameters frozen at construction (``requires_grad=False``): in ``param_groups`` without state,
   the others bit-identical to an optimizer given them alone; a gradient on one (unfrozen, or set by
   hand, also when the others have none) refused with nothing changed; ``zero_grad()`` drops it;
   any dtype accepted frozen; every parameter frozen refused.
"""

import copy
import io
import os
import pickletools
import sys
import tempfile
import zipfile

try:
    import torch
except ImportError:
    print("torch is not importable by this Python: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deep_optimizer_states as dos  # noqa: E402
from test_pytorch import (PARAM_RTOL, batch, check, expect_error, main, make_model, make_opt,  # noqa: E402
                          same_snapshot, snapshot, train_steps)


def halve(model):
    """Writes every parameter in place (exactly, in any dtype: a power of 2)."""
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)


def test_fresh_state_dict(device, policy):
    """A fresh optimizer's state dict: no state tensors; loading it keeps or resets as torch.optim."""
    m = make_model(device, torch.bfloat16)
    o = make_opt(m, policy)
    sd = o.state_dict()
    check(sd["state"] == {} and all(s == 0 for b in sd["dos"]["buckets"] for s in b["subgroup_steps"]),
          "an optimizer that has updated nothing: an empty 'state', every step count 0")
    # what accelerate does when it prepares the optimizer: state_dict() moved and loaded back
    o.load_state_dict(copy.deepcopy(sd))
    la = train_steps(m, o, range(1, 4), device)
    mr = make_model(device, torch.bfloat16)
    orf = make_opt(mr, policy)
    lr_ = train_steps(mr, orf, range(1, 4), device)
    check(la == lr_ and same_snapshot(snapshot(m, o), snapshot(mr, orf)),
          "the fresh state dict loaded back before the first step: the same bits as without")
    check(len(o.state_dict()["state"]) == sum(1 for _ in m.parameters()),
          "after a step the state dict holds every parameter's state")

    # into an optimizer that has stepped: a fresh one over the parameters as they are now
    before = snapshot(m, o)
    bad = copy.deepcopy(sd)
    bad["dos"]["buckets"][0]["subgroup_steps"][0] = 3
    expect_error(ValueError, "no state tensors", lambda: o.load_state_dict(bad),
                 "an empty 'state' with a step count of 3")
    check(same_snapshot(before, snapshot(m, o)), "after the refusal: parameters and state unchanged")
    o.load_state_dict(sd)
    mf = make_model(device, torch.bfloat16, seed=11)
    mf.load_state_dict(m.state_dict())
    of = make_opt(mf, policy)
    check(same_snapshot(snapshot(m, o), snapshot(mf, of)),
          "the fresh state dict loaded into an optimizer that had stepped 3 times: step counts, moments, masters "
          "and parameters as an optimizer built now")
    la = train_steps(m, o, range(4, 7), device)
    lf = train_steps(mf, of, range(4, 7), device)
    check(la == lf and same_snapshot(snapshot(m, o), snapshot(mf, of)), "and 3 more steps: the same bits")
    for x in (o, orf, of):
        x.close()


def resume_both_orders(device, policy, sd_model, sd_opt, m_ref, o_ref, steps, what):
    """Trains ``m_ref``/``o_ref`` on ``steps``; then, for each order of loading ``sd_model`` and
    ``sd_opt`` into a fresh bf16 model and optimizer, the same steps must give the same losses,
    parameters and state, bit for bit."""
    lref = train_steps(m_ref, o_ref, steps, device)
    for order in ("model first", "optimizer first"):
        mc = make_model(device, torch.bfloat16, seed=23)
        oc = make_opt(mc, policy)
        loads = [lambda: mc.load_state_dict(sd_model), lambda: oc.load_state_dict(sd_opt)]
        for load in (loads if order == "model first" else loads[::-1]):
            load()
        lc = train_steps(mc, oc, steps, device)
        check(lc == lref and same_snapshot(snapshot(m_ref, o_ref), snapshot(mc, oc)),
              f"{what} with the {order}: the same bits as the run that went on")
        oc.close()


def test_params_written(device, policy):
    """Parameters written in place between steps: the update starts from them."""
    # fp32 against torch.optim.AdamW with the same writes
    torch.manual_seed(0)
    m, mt = make_model(device, torch.float32), make_model(device, torch.float32)
    o = make_opt(m, policy, max_grad_norm=None)
    groups = [{"params": [p for n, p in mt.named_parameters() if n.endswith("weight") and p.dim() == 2],
               "weight_decay": 0.05},
              {"params": [p for n, p in mt.named_parameters() if not (n.endswith("weight") and p.dim() == 2)],
               "weight_decay": 0.0}]
    ot = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    halve(m), halve(mt)  # before the first step: after the optimizer was built
    for steps in (range(1, 3), range(3, 5)):
        train_steps(m, o, steps, device)
        train_steps(mt, ot, steps, device)
        halve(m), halve(mt)  # between steps
    train_steps(m, o, range(5, 7), device)
    train_steps(mt, ot, range(5, 7), device)
    rel = max(float((a.detach().double() - b.detach().double()).abs().max()) / max(float(b.detach().abs().max()), 1e-30)
              for a, b in zip(m.parameters(), mt.parameters()))
    check(rel <= PARAM_RTOL, f"fp32, every parameter halved in place before the first step and twice between steps: "
          f"within {PARAM_RTOL:g} of torch.optim.AdamW with the same writes ({rel:.2e})")
    o.close()

    # bf16: the same bits as a state dict whose masters are the written parameters
    ma, mb = make_model(device, torch.bfloat16), make_model(device, torch.bfloat16)
    oa, ob = make_opt(ma, policy), make_opt(mb, policy)
    train_steps(ma, oa, range(1, 3), device)
    train_steps(mb, ob, range(1, 3), device)
    halve(ma)
    la = train_steps(ma, oa, range(3, 5), device)
    sd = ob.state_dict()
    halve(mb)
    for i, p in enumerate(p for g in ob.param_groups for p in g["params"]):  # state_dict numbering
        sd["state"][i]["master"] = p.detach().float().cpu()
    ob.load_state_dict(sd)
    lb = train_steps(mb, ob, range(3, 5), device)
    check(la == lb and same_snapshot(snapshot(ma, oa), snapshot(mb, ob)),
          "bf16, halved in place between steps: the same bits as loading masters equal to the halved parameters")

    # a write torch does not count (through p.data), then refresh_masters(): as the counted one
    md = make_model(device, torch.bfloat16)
    od = make_opt(md, policy)
    train_steps(md, od, range(1, 3), device)
    for p in md.parameters():
        p.data.mul_(0.5)
    od.refresh_masters()
    ld = train_steps(md, od, range(3, 5), device)
    check(ld == la and same_snapshot(snapshot(ma, oa), snapshot(md, od)),
          "bf16, halved through p.data and then refresh_masters(): the same bits as halved in place")
    od.close()

    # a model checkpoint and its optimizer checkpoint, loaded in either order
    sd_model, sd_opt = copy.deepcopy(ma.state_dict()), oa.state_dict()
    resume_both_orders(device, policy, sd_model, sd_opt, ma, oa, range(5, 8), "bf16 resumed")
    # a write after the last step, then both checkpoints: the optimizer's holds the written masters
    me, ms = make_model(device, torch.bfloat16), make_model(device, torch.bfloat16)
    oe, os_ = make_opt(me, policy), make_opt(ms, policy)
    train_steps(me, oe, range(1, 3), device)
    train_steps(ms, os_, range(1, 3), device)
    halve(me), halve(ms)
    sd_model, sd_opt = copy.deepcopy(ms.state_dict()), os_.state_dict()
    resume_both_orders(device, policy, sd_model, sd_opt, me, oe, range(3, 5),
                       "bf16 halved after the last step, both checkpoints saved, resumed")
    for x in (oa, ob, oe, os_):
        x.close()


def test_framework_wrappers(device, policy):
    """DDP's bucket views, the next forward overlapped with set_to_none, a state loaded at step 0."""
    import torch.distributed as dist
    if device != "cpu" or not (dist.is_available() and dist.is_gloo_available()):
        print("skipped: DistributedDataParallel over gloo is checked on the CPU only")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "pg"), rank=0, world_size=1)
            try:
                runs, error = [], None
                for wrap in (False, True):
                    m = make_model(device, torch.float32)
                    net = torch.nn.parallel.DistributedDataParallel(m, gradient_as_bucket_view=True) if wrap else m
                    o = make_opt(m, policy)  # built after DDP, as Lightning's strategy does
                    losses, views = [], True
                    try:
                        for st in range(1, 5):
                            net.zero_grad(set_to_none=st % 2 == 1)
                            x, y = batch(st, device)
                            loss = torch.nn.functional.cross_entropy(net(x).float().reshape(-1, 50), y.reshape(-1))
                            loss.backward()
                            views = views and all(p.grad._base is not None for p in m.parameters())
                            o.step()
                            losses.append(float(loss))
                    except RuntimeError as e:  # DDP refuses a gradient moved out of its bucket
                        error = str(e).splitlines()[0][:120]
                    runs.append((losses, views, snapshot(m, o)))
                    o.close()
                (la, _, sa), (lb, vb, sb) = runs
                check(error is None and vb and la == lb and same_snapshot(sa, sb),
                      "DistributedDataParallel(gradient_as_bucket_view=True), one rank: the gradients stay DDP's views "
                      f"and 4 steps give the same bits as without DDP ({error or 'no error'})")
            finally:
                dist.destroy_process_group()

    # the next forward overlapped, model.zero_grad(set_to_none=True): backward's gradients land in the buffer
    m = make_model(device, torch.float32)
    o = make_opt(m, policy)
    o.overlap_forward(m)
    inside = []
    for st in range(1, 4):
        m.zero_grad(set_to_none=True)
        x, y = batch(st, device)
        torch.nn.functional.cross_entropy(m(x).float().reshape(-1, 50), y.reshape(-1)).backward()
        spans = [(b.flat_grad.data_ptr(), b.flat_grad.data_ptr() + b.flat_grad.numel() * b.flat_grad.element_size())
                 for b in o._buckets]
        inside.append(all(any(lo <= p.grad.data_ptr() < hi for lo, hi in spans) for p in m.parameters()))
        o.step()
    # a model.load_state_dict while the phase runs waits for it first (else the phase's write-backs
    # would overwrite what was loaded)
    loaded = make_model(device, torch.float32, seed=31).state_dict()
    running = any(b.running for b in o._buckets)
    m.load_state_dict(loaded)
    check(running and not any(b.running for b in o._buckets)
          and all(torch.equal(p, loaded[n]) for n, p in m.named_parameters()),
          "the next forward overlapped: model.load_state_dict while the phase ran waited for it, and the model holds "
          "what was loaded")
    o.wait()
    if dos.overlap._grad_hook_kind() is not None:
        check(all(inside), f"the next forward overlapped, model.zero_grad(set_to_none=True): after each backward every "
              f"gradient lies in the optimizer's flat buffers ({inside})")
    o.close()

    # a state loaded with step counts 0 keeps its masters in the next state dict
    m = make_model(device, torch.bfloat16)
    o = make_opt(m, policy)
    twin = make_opt(make_model(device, torch.bfloat16), policy)
    sd = copy.deepcopy(twin.state_dict())
    for i, p in enumerate(pp for g in o.param_groups for pp in g["params"]):
        sd["state"][i] = {"master": p.detach().float().cpu() + 1e-4, "exp_avg": torch.zeros(p.shape),
                          "exp_avg_sq": torch.zeros(p.shape)}
    o.load_state_dict(sd)
    again = o.state_dict()
    check(len(again["state"]) == len(sd["state"]) and all(torch.equal(again["state"][i]["master"], sd["state"][i]["master"])
                                                          for i in sd["state"]),
          "a state loaded with step counts 0: the next state dict holds its masters")
    o.close(), twin.close()


def test_parameters_changed(device, policy):
    # a parameter moved to other memory, or no longer requiring gradients, after one step: refused
    # at step(), nothing changed (the runtime would write through its old pointer)
    for what, damage, needle in (
            ("a parameter's storage replaced (p.data = p.data.clone())",
             lambda m: setattr(m.l1.weight, "data", m.l1.weight.data.clone()), "moved to other memory"),
            ("a parameter no longer requiring gradients", lambda m: m.l1.bias.requires_grad_(False),
             "no longer requires gradients")):
        m = make_model(device, torch.float32)
        o = make_opt(m, policy)
        train_steps(m, o, [1], device)
        x, y = batch(3, device)
        torch.nn.functional.cross_entropy(m(x).reshape(-1, 50), y.reshape(-1)).backward()
        damage(m)
        before = snapshot(m, o)
        expect_error(RuntimeError, needle, o.step, what)
        check(same_snapshot(before, snapshot(m, o)), f"after '{what}': parameters and state unchanged")
        o.close()


def test_frozen_parameters(device, policy):
    # a parameter frozen at construction (requires_grad=False): kept in param_groups with no state, as
    # torch.optim keeps it; the others train bit for bit as an optimizer given them alone; given a
    # gradient later it is refused (nothing updated); every parameter frozen is refused
    m = make_model(device, torch.float32)
    m.l1.bias.requires_grad_(False)
    o = dos.DeepOptimizerStates(m.parameters(), lr=1e-2, policy=policy)
    twin = make_model(device, torch.float32)
    twin.l1.bias.requires_grad_(False)
    o_twin = dos.DeepOptimizerStates([p for p in twin.parameters() if p.requires_grad], lr=1e-2, policy=policy)
    frozen_before = m.l1.bias.detach().clone()
    la, lb = train_steps(m, o, range(1, 4), device), train_steps(twin, o_twin, range(1, 4), device)
    check(la == lb and all(torch.equal(p, q) for p, q in zip(m.parameters(), twin.parameters())),
          "a frozen parameter: the others' losses and parameters bit-identical to an optimizer without it")
    check(torch.equal(m.l1.bias, frozen_before), "the frozen parameter unchanged")
    frozen_index = [i for i, p in enumerate(m.parameters()) if p is m.l1.bias][0]
    sd = o.state_dict()
    check(frozen_index in sd["param_groups"][0]["params"] and frozen_index not in sd["state"],
          "state_dict: the frozen parameter in param_groups, without state (as torch.optim)")
    m.l1.bias.requires_grad_(True)
    x, y = batch(9, device)
    torch.nn.functional.cross_entropy(m(x).reshape(-1, 50), y.reshape(-1)).backward()
    before = snapshot(m, o)
    expect_error(RuntimeError, "was frozen (requires_grad=False) when the optimizer was created", o.step,
                 "a parameter frozen at construction given a gradient")
    check(same_snapshot(before, snapshot(m, o)), "after the unfrozen parameter's error: nothing changed")
    o.close()
    o_twin.close()
    m.l1.bias.requires_grad_(False)  # still frozen, a gradient set by hand: refused too (torch would update it)
    m.l1.bias.grad = None
    o1 = dos.DeepOptimizerStates(m.parameters(), policy=policy)
    m.l1.bias.grad = torch.zeros_like(m.l1.bias)
    expect_error(RuntimeError, "was frozen", o1.step, "a frozen parameter's gradient set by hand")
    o1.zero_grad()  # sets a frozen parameter's gradient to None, set_to_none or not
    check(m.l1.bias.grad is None, "zero_grad() drops a frozen parameter's gradient")
    o1.close()
    # a frozen parameter with a gradient where the others have none: refused, not a silent no-op;
    # every frozen parameter is checked (the second of two here)
    m2 = make_model(device, torch.float32)
    m2.l1.bias.requires_grad_(False)
    m2.ln.bias.requires_grad_(False)
    o2 = dos.DeepOptimizerStates(m2.parameters(), policy=policy)
    m2.ln.bias.grad = torch.ones_like(m2.ln.bias)
    expect_error(RuntimeError, "was frozen", o2.step, "the second frozen parameter with a gradient, the others none")
    o2.close()
    # a frozen parameter of a dtype the runtime does not update (a quantised base's uint8) is accepted
    q = torch.nn.Parameter(torch.zeros(4, dtype=torch.uint8, device=device), requires_grad=False)
    o3 = dos.DeepOptimizerStates([q, m2.l1.weight], policy=policy)
    check(len(o3.param_groups[0]["params"]) == 2, "a frozen uint8 parameter beside a trained one: accepted")
    o3.close()
    all_frozen = make_model(device, torch.float32)
    for p in all_frozen.parameters():
        p.requires_grad_(False)
    expect_error(ValueError, "every parameter given is frozen",
                 lambda: dos.DeepOptimizerStates(all_frozen.parameters(), policy=policy), "every parameter frozen")


def test_state_dict_round_trip(device, policy):
    dtype = torch.bfloat16
    m1 = make_model(device, dtype)
    o1 = make_opt(m1, policy)
    check(o1.num_subgroups >= 4, f"bf16 model in 2 groups: {o1.num_subgroups} subgroups of 700 elements")
    train_steps(m1, o1, range(1, 4), device)
    buf_opt, buf_model = io.BytesIO(), io.BytesIO()
    torch.save(o1.state_dict(), buf_opt)
    torch.save(m1.state_dict(), buf_model)
    la = train_steps(m1, o1, range(4, 7), device)
    a = snapshot(m1, o1)

    m2 = make_model(device, dtype, seed=99)  # another initialisation: everything must come from the files
    buf_model.seek(0)
    m2.load_state_dict(torch.load(buf_model))
    o2 = make_opt(m2, policy, lr=0.5)  # another lr too: the state dict's param_groups replace it
    buf_opt.seek(0)
    o2.load_state_dict(torch.load(buf_opt))
    check(o2.param_groups[0]["lr"] == 1e-2, "load_state_dict takes the groups' hyper-parameters")
    check(o2.subgroup_steps() == [[3] * len(s) for s in o2.subgroup_steps()], "step counts loaded (3 everywhere)")
    lb = train_steps(m2, o2, range(4, 7), device)
    b = snapshot(m2, o2)
    check(la == lb, f"resumed losses bit-identical to the uninterrupted run's ({la} vs {lb})")
    check(same_snapshot(a, b), "resumed parameters, master, exp_avg, exp_avg_sq and step counts bit-identical")

    # per-subgroup step counts that differ round-trip as they are
    sd = o2.state_dict()
    steps = [[3 + i for i in range(len(bk["subgroup_steps"]))] for bk in sd["dos"]["buckets"]]
    for bk, st in zip(sd["dos"]["buckets"], steps):
        bk["subgroup_steps"] = st
    o2.load_state_dict(sd)
    check(o2.subgroup_steps() == steps, f"distinct per-subgroup step counts round-trip ({steps})")
    check(o2.state_dict()["dos"]["buckets"][0]["subgroup_steps"] == steps[0], "and appear in state_dict()")
    # a state tensor of the right size in another shape (a matrix's transposed) is another layout:
    # refused, naming both shapes, and the optimizer keeps its state
    sd = o2.state_dict()
    idx = next(i for i, st in sd["state"].items() if st["master"].dim() == 2 and st["master"].shape[0] != st["master"].shape[1])
    shape = list(sd["state"][idx]["master"].shape)
    sd["state"][idx]["master"] = sd["state"][idx]["master"].t().contiguous()
    before = snapshot(m2, o2)
    expect_error(ValueError, f"of the parameter's shape {shape}", lambda: o2.load_state_dict(sd),
                 "a transposed master tensor")
    check(same_snapshot(before, snapshot(m2, o2)), "the refused state dict changed nothing")
    # damaged structure: a ValueError that says so, nothing changed
    for what, damage in (("a param group that is not a dict", lambda sd: sd.__setitem__("param_groups", [1])),
                         ("a group's params that are not a list",
                          lambda sd: sd["param_groups"][0].__setitem__("params", 5)),
                         ("buckets that are not dicts", lambda sd: sd["dos"].__setitem__("buckets", [1])),
                         ("buckets that are None", lambda sd: sd["dos"].__setitem__("buckets", None)),
                         ("a sparse master", lambda sd: sd["state"][idx].__setitem__(
                             "master", sd["state"][idx]["master"].to_sparse())),
                         ("a master on the meta device", lambda sd: sd["state"][idx].__setitem__(
                             "master", sd["state"][idx]["master"].to("meta")))):
        sd = o2.state_dict()
        damage(sd)
        expect_error(ValueError, "sparse" if "sparse" in what else "meta" if "meta" in what else "malformed state dict",
                     lambda: o2.load_state_dict(sd), what)
        check(same_snapshot(before, snapshot(m2, o2)), f"{what}: the refused state dict changed nothing")
    o1.close()
    o2.close()


# The opcodes torch 2.x's weights-only unpickler reads (torch/_weights_only_unpickler.py); torch
# 1.13's reads the same but BINFLOAT, so that no optimizer's state dict (floats in param_groups, as
# torch.optim.AdamW's) loads there with weights_only=True.
WEIGHTS_ONLY_OPCODES = {
    "PROTO", "STOP", "GLOBAL", "NEWOBJ", "REDUCE", "BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "MARK",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWFALSE", "NEWTRUE", "EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT",
    "EMPTY_SET", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING", "BINPERSID",
    "BINGET", "LONG_BINGET", "BINPUT", "LONG_BINPUT",
}


def torch_major():
    return int(torch.__version__.split(".")[0])


def test_weights_only_state_dict(device, policy):
    m1 = make_model(device, torch.bfloat16)
    o1 = make_opt(m1, policy)
    sch1 = torch.optim.lr_scheduler.LambdaLR(o1, lambda s: 1.0 / (1 + s))  # adds initial_lr to the groups
    train_steps(m1, o1, range(1, 4), device)
    sch1.step()
    buf, buf_model = io.BytesIO(), io.BytesIO()
    torch.save(o1.state_dict(), buf)
    torch.save(m1.state_dict(), buf_model)
    la = train_steps(m1, o1, range(4, 7), device)
    a = snapshot(m1, o1)

    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(pkl)]
    allowed = set(torch._weights_only_unpickler._get_allowed_globals())
    names = {arg.replace(" ", ".") for name, arg in ops if name == "GLOBAL"}
    check(names and names <= allowed, f"the state dict's pickle names only globals of torch's weights-only allowlist "
          f"({sorted(names)}; outside it: {sorted(names - allowed)})")
    opcodes = {name for name, _ in ops}
    check(opcodes <= WEIGHTS_ONLY_OPCODES, f"and only opcodes torch 2.x's weights-only unpickler reads "
          f"(outside them: {sorted(opcodes - WEIGHTS_ONLY_OPCODES)})")
    buf.seek(0)
    if torch_major() >= 2:
        sd = torch.load(buf, weights_only=True)
        check(isinstance(sd, dict) and "dos" in sd, f"torch {torch.__version__}: torch.load(weights_only=True) loads it")
    else:
        sd = torch.load(buf)
        print(f"torch {torch.__version__}: its weights-only unpickler reads no float (torch.optim.AdamW's state dict "
              "fails the same way): checked by the pickle's globals and opcodes above")
    m2 = make_model(device, torch.bfloat16, seed=42)
    buf_model.seek(0)
    m2.load_state_dict(torch.load(buf_model))
    o2 = make_opt(m2, policy)
    o2.load_state_dict(sd)
    check(o2.param_groups[0].get("initial_lr") == 1e-2, "the scheduler's initial_lr comes back with the groups")
    lb = train_steps(m2, o2, range(4, 7), device)
    check(la == lb and same_snapshot(a, snapshot(m2, o2)),
          "the loaded state dict continues bit for bit (losses, parameters, master, exp_avg, exp_avg_sq, steps)")
    o1.close()
    o2.close()


if __name__ == "__main__":
    sys.exit(main([test_fresh_state_dict, test_params_written, test_framework_wrappers, test_parameters_changed,
                   test_frozen_parameters, test_state_dict_round_trip, test_weights_only_state_dict]))
