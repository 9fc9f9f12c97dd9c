"""The overlap's speculative updates lost and redone, with two losses and two backward passes
(tests/test_pytorch_overlap.py runs these on its device, "cpu" or "cuda", given as `device`): a gradient
written in place between two accumulations (redone, the same bits as without overlap, said once);
with two param groups, the warning's count of the buckets that lost their updates over the streak;
skipped steps, which redo nothing and are not warned of. The caller puts python/ on sys.path."""
import time
import warnings

import torch

import deep_optimizer_states as dos


def test_write_between_accumulations(device):
    """Two losses, two backward passes into one bucket, and a gradient of the first written in place
    between them (after its hook declared it final and its update was speculated): the next
    accumulation must not hide the write. The verdict is changed (the step runs whole) and the bits
    are the plain run's."""
    runs = {}
    for ov in (False, True):
        torch.manual_seed(0)
        a, b = torch.nn.Linear(16, 4).to(device), torch.nn.Linear(16, 4).to(device)
        runs[ov] = (a, b, dos.DeepOptimizerStates(list(a.parameters()) + list(b.parameters()), lr=1e-2,
                                                  subgroup_size=16, overlap=ov))
    caught = []
    for step in range(6):
        torch.manual_seed(100 + step)
        x, y = torch.randn(8, 16, device=device), torch.randn(8, 4, device=device)
        for ov, (a, b, opt) in runs.items():
            opt.zero_grad()
            torch.nn.functional.mse_loss(a(x), y).backward()
            time.sleep(0.05)  # the speculative updates of a's gradients have run by now
            with torch.no_grad():
                a.weight.grad.mul_(0.5)  # in place, after a's gradients were declared final
            torch.nn.functional.mse_loss(b(x), y).backward()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                opt.step()
            caught += [str(m.message) for m in w if "lost their speculative updates" in str(m.message)]
            if ov:
                assert opt.last_step["verdicts"] == ["changed"], (step, opt.last_step)
        pa = list(runs[False][0].parameters()) + list(runs[False][1].parameters())
        pb = list(runs[True][0].parameters()) + list(runs[True][1].parameters())
        assert all(torch.equal(p, q) for p, q in zip(pa, pb)), f"step {step}: a write between accumulations lost"
    # every step redone for one reason: said once, at the fifth
    assert len(caught) == 1 and "written in place between two accumulations" in caught[0], caught
    for _, _, opt in runs.values():
        opt.close()
    print("a gradient written between two accumulations: redone, the same bits; said once:", caught[0][:80])


def _step_with_a_written(opt, a, b, after_b, device):
    """One step of two losses: a's backward, a's weight gradient halved in place (after its hook
    declared it final), b's backward, then after_b() (a write of b's gradients, or nothing), then
    step(); returns the messages of the warnings that the steps lost their speculative updates."""
    x, y = torch.randn(8, 16, device=device), torch.randn(8, 4, device=device)
    opt.zero_grad()
    torch.nn.functional.mse_loss(a(x), y).backward()
    with torch.no_grad():
        a.weight.grad.mul_(0.5)
    torch.nn.functional.mse_loss(b(x), y).backward()
    with torch.no_grad():
        after_b()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opt.step()
    return [str(m.message) for m in w if "lost their speculative updates" in str(m.message)]


def test_partial_redo_warning(device):
    """test_write_between_accumulations' write, with a and b in two param groups (two buckets): only
    a's bucket loses its speculative updates each step, and the warning, given once, says in how many
    of the buckets; with b's gradients written too on every other step, the fewest and the most."""
    for both_every, want in ((0, "in 1 of their 2 buckets"), (2, "in 1 to 2 of their 2 buckets")):
        torch.manual_seed(0)
        a, b = torch.nn.Linear(16, 4).to(device), torch.nn.Linear(16, 4).to(device)
        opt = dos.DeepOptimizerStates([{"params": list(a.parameters())}, {"params": list(b.parameters())}], lr=1e-2,
                                      subgroup_size=16, overlap=True)
        caught = []
        for step in range(opt.REDO_STREAK_WARNING + 1):
            b_changed = bool(both_every) and step % both_every == 1
            caught += _step_with_a_written(opt, a, b, (lambda: b.weight.grad.mul_(0.5)) if b_changed else (lambda: None),
                                           device)
            v = opt.last_step["verdicts"]
            assert len(v) == 2 and v[0] == "changed" and (v[1] == "changed") == b_changed, (step, opt.last_step)
            assert len(set(opt.last_step["redo_reasons"])) == 1, opt.last_step["redo_reasons"]  # one streak
        opt.close()
        assert len(caught) == 1 and want in caught[0] and "nothing in them" in caught[0], (want, caught)
        print("buckets redone every step, said once with their count:", caught[0][60:150])


def test_skipped_steps_no_warning(device):
    """The write between two accumulations of test_write_between_accumulations on every step, but
    each step skipped (an inf gradient): a skipped step drops its speculation and redoes nothing,
    so the warning that the steps lost their speculative updates is not given."""
    torch.manual_seed(0)
    a, b = torch.nn.Linear(16, 4).to(device), torch.nn.Linear(16, 4).to(device)
    opt = dos.DeepOptimizerStates(list(a.parameters()) + list(b.parameters()), lr=1e-2, subgroup_size=16,
                                  overlap=True)
    caught = []
    def inf_in_b():
        b.bias.grad[0] = float("inf")

    for step in range(2 * opt.REDO_STREAK_WARNING):
        caught += _step_with_a_written(opt, a, b, inf_in_b, device)
        assert opt.last_step["skipped"], (step, opt.last_step)
    opt.close()
    assert not caught, caught
    print(f"{2 * opt.REDO_STREAK_WARNING} skipped steps with a changed gradient: no warning")
