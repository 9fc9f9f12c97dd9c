#!/usr/bin/env python3
"""examples/train_gpt.py's argument checks: sizes, counts, rates, the subgroup size, the device,
--compact-master without bf16 or dos, and the output paths refused by argparse's usage error (status 2) with a message naming the option,
before any training, and leaving no file behind; and record_phase, each step's record of its update
phase, on made-up stats.

    test_train_gpt_args.py

Exits 77 (meson's "skip") when torch cannot be imported (train_gpt.py imports it).
"""

import contextlib
import io
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# test_pytorch: torch imported (or exit 77), python/ and examples/ on the path, check() and its failures
from test_pytorch import check, failures  # noqa: E402
import torch  # noqa: E402
import train_gpt  # noqa: E402


def expect_usage_error(argv, needle, what, parse=None, name="train_gpt"):
    """``parse(argv)`` (default train_gpt.parse_args) must exit (argparse's usage error, status 2)
    with ``needle`` in its message, before any training."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            (parse or train_gpt.parse_args)(argv)
    except SystemExit as e:
        check(e.code == 2 and needle in err.getvalue(), f"{name} {what}: usage error saying '{needle}' "
              f"({err.getvalue().strip().splitlines()[-1][:160] if err.getvalue().strip() else 'nothing printed'})")
        return
    check(False, f"{name} {what}: accepted")


def test_train_gpt_bad_args():
    for argv, needle in ((["--steps", "0"], "--steps must be a whole number >= 1"),
                         (["--n-head", "3", "--n-embd", "32"], "must divide --n-embd"),
                         (["--n-head", "0"], "--n-head must be"),
                         (["--print-every", "0"], "--print-every must be"),
                         (["--batch-size", "0"], "--batch-size must be"),
                         (["--corpus-mb", "0"], "--corpus-mb must be"),
                         (["--subgroup-size", "abc"], "--subgroup-size must be"),
                         (["--subgroup-size", "1.5"], "--subgroup-size must be"),
                         (["--warmup", "-5"], "--warmup must be"),
                         (["--min-lr-ratio", "5"], "--min-lr-ratio must be in [0, 1]"),
                         (["--device", "gpu"], "--device must be auto, cpu or cuda"),
                         (["--beta1", "1"], "--beta1 must be in [0, 1)"),
                         (["--beta2", "-0.5"], "--beta2 must be in [0, 1)"),
                         (["--corpus", "/nonexistent-corpus"], "--corpus /nonexistent-corpus does not exist"),
                         (["--corpus-glob", "*.txt"], "give --corpus too"),
                         (["--compact-master"], "--compact-master needs --dtype bf16"),
                         (["--compact-master", "--dtype", "fp16"], "give --dtype bf16 or leave --compact-master out"),
                         (["--compact-master", "--dtype", "bf16", "--optimizer", "adamw"],
                          "--compact-master needs --optimizer dos")) + \
            (((["--device", "cuda"], "sees no GPU"),) if not train_gpt.torch.cuda.is_available() else ()):
        expect_usage_error(argv, needle, " ".join(argv))
    with tempfile.TemporaryDirectory() as d:
        expect_usage_error(["--log-json", d], "is a folder", "--log-json at a folder")
        expect_usage_error(["--log-json", os.path.join(d, "no", "x.json")], "does not exist",
                           "--log-json in a missing folder")
        check(os.listdir(d) == [], "train_gpt's refused outputs left nothing behind")
    if os.path.isdir("/proc/self"):  # a folder that refuses new files whatever the permissions say
        expect_usage_error(["--log-json", "/proc/self/x.json"], "no file can be created", "--log-json in /proc")
    # a write that fails at the end raises (it was silently dropped) and leaves no temporary file
    with tempfile.TemporaryDirectory() as d:
        target = os.path.join(d, "gone", "x.json")
        try:
            train_gpt.write_json(target, {"a": 1})
            check(False, "write_json into a missing folder raised nothing")
        except OSError:
            check(os.listdir(d) == [], "write_json's failed write raised and left nothing behind")
    # the defaults, and a file in a folder that exists, are accepted
    args = train_gpt.parse_args([])
    check(args.steps == 50 and args.n_head == 4 and args.max_grad_norm == 1.0 and not args.compact_master,
          "train_gpt's defaults accepted (no compact master)")
    for overlap in ("forward", "backward", "both"):
        args = train_gpt.parse_args(["--compact-master", "--dtype", "bf16", "--overlap", overlap])
        check(args.compact_master and args.overlap == overlap,
              f"--compact-master with --dtype bf16 and --overlap {overlap} accepted")
    # the overlap with the model on the CPU is warned of; on the GPU, or not overlapped, nothing said
    for overlap in ("off", "forward", "backward", "both"):
        args = train_gpt.parse_args(["--overlap", overlap])
        on_cpu = train_gpt.overlap_warning(args, torch.device("cpu"))
        on_gpu = train_gpt.overlap_warning(args, torch.device("cuda", 0))
        want = overlap != "off"
        check(on_gpu is None and (on_cpu is not None) == want
              and (not want or f"--overlap {overlap} with the model on the CPU" in on_cpu),
              f"--overlap {overlap}: warned of on the CPU only when overlapped ({on_cpu!r}, {on_gpu!r})")
    with tempfile.TemporaryDirectory() as d:
        args = train_gpt.parse_args(["--log-json", os.path.join(d, "x.json"), "--subgroup-size", "2e4"])
        check(args.log_json.endswith("x.json") and os.listdir(d) == [], "a --log-json path accepted, nothing written")


def test_record_phase():
    """train_gpt.record_phase on a made-up last_step of two buckets: the first bucket's counts, the
    tail and the gradient downloads over every bucket (the longest one's seconds and bytes, a dodge
    in any bucket), the overlap's figures with their defaults."""
    stat = dict(subgroups_cpu=3, subgroups_gpu=2, bytes_h2d=10, bytes_d2h=20, tail_bound=1, tail_moved=0,
                predicted_seconds=0.5, refinement_held=0, plan_seconds=0.001, longest_download_seconds=0.04,
                longest_download_bytes=4000, downloads_dodge_writebacks=0)
    other = dict(stat, tail_bound=2, tail_moved=1, longest_download_seconds=0.12, longest_download_bytes=1200,
                 downloads_dodge_writebacks=1)
    rec = {}
    train_gpt.record_phase(rec, dict(update_seconds=0.6, stats=[stat, other], speculated=4))
    check(rec["phase_seconds"] == 0.6 and rec["subgroups_cpu"] == 3 and rec["tail_bound"] == 3
          and rec["tail_moved"] == 1, f"record_phase: the first bucket's counts, the tails summed ({rec})")
    check(rec["longest_download_seconds"] == 0.12 and rec["longest_download_bytes"] == 1200
          and rec["downloads_dodge_writebacks"] == 1,
          f"record_phase: the longest download of any bucket with its bytes, a dodge in any bucket ({rec})")
    check(rec["speculated"] == 4 and rec["redone"] == 0 and rec["hidden_params"] == 0,
          f"record_phase: the overlap's figures, 0 when absent ({rec})")
    rec = {}
    train_gpt.record_phase(rec, dict(update_seconds=0.6, stats=[dict(stat, longest_download_seconds=0.0,
                                                                       longest_download_bytes=0)]))
    check(rec["longest_download_seconds"] == 0.0 and rec["longest_download_bytes"] == 0
          and rec["downloads_dodge_writebacks"] == 0, f"record_phase: no download by the copy engine ({rec})")


def test_strict_numbers():
    """The example scripts' numbers are plain decimals and whole numbers written with 0-9 (the
    package's number_text rules, dos-train's): float() and int() would take blanks, underscores,
    inf, nan and other scripts' digits. train_gpt, hf_trainer (its parse_args needs no
    transformers), timeline_summary and the baselines' command line."""
    import hf_trainer
    import timeline_summary
    from deep_optimizer_states import baselines
    decimal = "expected a plain decimal number"
    whole = "expected a whole number written with the digits 0-9"
    cases = [(train_gpt.parse_args, "train_gpt", ["--lr", "inf"], f"argument --lr: {decimal}"),
             (train_gpt.parse_args, "train_gpt", ["--corpus-mb", "nan"], f"argument --corpus-mb: {decimal}"),
             (train_gpt.parse_args, "train_gpt", ["--eps", " 1e-8"], decimal),
             (train_gpt.parse_args, "train_gpt", ["--gpu-update-budget", "1_0"], decimal),
             (train_gpt.parse_args, "train_gpt", ["--steps", "1_0"], f"argument --steps: {whole}"),
             (train_gpt.parse_args, "train_gpt", ["--batch-size", "\u0663"], whole),
             (train_gpt.parse_args, "train_gpt", ["--seed", "1e3"], whole),
             (train_gpt.parse_args, "train_gpt", ["--subgroup-size", " 1e8"], "--subgroup-size must be"),
             (train_gpt.parse_args, "train_gpt", ["--subgroup-size", "1_000"], "--subgroup-size must be"),
             (hf_trainer.parse_args, "hf_trainer", ["--beta2", "nan"], f"argument --beta2: {decimal}"),
             (hf_trainer.parse_args, "hf_trainer", ["--steps", " 5"], whole),
             (hf_trainer.parse_args, "hf_trainer", ["--subgroup-size", "1.5"], "--subgroup-size must be"),
             (hf_trainer.parse_args, "hf_trainer", ["--subgroup-size", "abc"], "--subgroup-size must be"),
             (hf_trainer.parse_args, "hf_trainer", ["--heads", "3"], "--heads 3 must divide --hidden 64"),
             (hf_trainer.parse_args, "hf_trainer", ["--n-layer", "0"], "--n-layer must be a whole number >= 1"),
             (hf_trainer.parse_args, "hf_trainer", ["--beta1", "1"], "--beta1 must be in [0, 1)"),
             (hf_trainer.parse_args, "hf_trainer", ["--lr", "-1"], "--lr must be >= 0"),
             (hf_trainer.parse_args, "hf_trainer", ["--corpus-mb", "0"], "--corpus-mb must be"),
             (train_gpt.parse_args, "train_gpt", ["--timeline-steps", " 1: 3"], "--timeline-steps must be FIRST:LAST"),
             (train_gpt.parse_args, "train_gpt", ["--timeline-steps", "1_0:1_2", "--steps", "20"],
              "--timeline-steps must be FIRST:LAST"),
             (train_gpt.parse_args, "train_gpt", ["--seed", str(2 ** 32)], "--seed must be in [0, 2**32 - 1]"),
             (train_gpt.parse_args, "train_gpt", ["--seed", "-1"], "--seed must be in [0, 2**32 - 1]"),
             (train_gpt.parse_args, "train_gpt", ["--subgroup-size", str(2 ** 53 + 1)], "--subgroup-size must be"),
             (train_gpt.parse_args, "train_gpt", ["--lr", "1e-400"], "'1e-400' is beyond what a float holds"),
             (hf_trainer.parse_args, "hf_trainer", ["--save-steps", "-5"], "--save-steps must be a whole number >= 0"),
             (hf_trainer.parse_args, "hf_trainer", ["--seed", str(2 ** 32)], "--seed must be in [0, 2**32 - 1]"),
             (hf_trainer.parse_args, "hf_trainer", ["--subgroup-size", str(2 ** 53 + 1)], "--subgroup-size must be"),
             (train_gpt.parse_args, "train_gpt", ["--subgroup-size", "9007199254740993.0"], "--subgroup-size must be"),
             (train_gpt.parse_args, "train_gpt", ["--subgroup-size", "9.007199254740993e15"], "--subgroup-size must be"),
             (train_gpt.parse_args, "train_gpt", ["--timeline-steps", "1:3x"], "--timeline-steps must be FIRST:LAST"),
             (timeline_summary.main, "timeline_summary", ["x.json", "--gap-ms", "inf"],
              f"argument --gap-ms: {decimal}"),
             (baselines.main, "baselines", ["--lr", "0x1p-3"], f"argument --lr: {decimal}"),
             (baselines.main, "baselines", ["--repeats", "+٣"], f"argument --repeats: {whole}")]
    if getattr(sys, "get_int_max_str_digits", lambda: 0)():  # Python's limit on the digits int() converts
        cases.append((train_gpt.parse_args, "train_gpt", ["--steps", "1" * 5000],
                      "a whole number of 5000 characters is too long"))
    for parse, name, argv, needle in cases:
        expect_usage_error(argv, needle, " ".join(argv), parse, name)
    args = hf_trainer.parse_args(["--subgroup-size", "2e4", "--lr", "1e-3", "--steps", "+7"])
    check(args.subgroup_elements == 20000 and args.lr == 1e-3 and args.steps == 7,
          f"hf_trainer: plain numbers taken ({args.subgroup_elements}, {args.lr}, {args.steps})")
    args = hf_trainer.parse_args(["--subgroup-size", str(2 ** 53), "--seed", str(2 ** 32 - 1)])
    check(args.subgroup_elements == 2 ** 53 and args.seed == 2 ** 32 - 1,
          f"hf_trainer: the largest subgroup size and seed taken ({args.subgroup_elements}, {args.seed})")
    args = train_gpt.parse_args(["--timeline-steps", "+1:03", "--subgroup-size", "9007199254740992.0"])
    check(args.subgroup_elements == 2 ** 53, f"train_gpt: --timeline-steps +1:03 and 2**53 written as a decimal taken "
          f"({args.subgroup_elements})")
    args = train_gpt.parse_args(["--eps", "1E-9", "--warmup", "-0", "--gpu-update-budget", ".5"])
    check(args.eps == 1e-9 and args.warmup == 0 and args.gpu_update_budget == 0.5,
          f"train_gpt: plain numbers taken ({args.eps}, {args.warmup}, {args.gpu_update_budget})")


if __name__ == "__main__":
    test_train_gpt_bad_args()
    test_strict_numbers()
    test_record_phase()
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
