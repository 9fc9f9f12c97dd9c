#!/usr/bin/env python3
"""examples/train_gpt.py's argument checks: sizes, counts, rates, the subgroup size, the device,
--compact-master without bf16, dos or with an overlapped backward, and the output paths refused by argparse's usage error (status 2) with a message naming the option,
before any training, and leaving no file behind.

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
import train_gpt  # noqa: E402


def expect_usage_error(argv, needle, what):
    """train_gpt.parse_args(argv) must exit (argparse's usage error, status 2) with ``needle`` in
    its message, before any training."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            train_gpt.parse_args(argv)
    except SystemExit as e:
        check(e.code == 2 and needle in err.getvalue(), f"train_gpt {what}: usage error saying '{needle}' "
              f"({err.getvalue().strip().splitlines()[-1][:160] if err.getvalue().strip() else 'nothing printed'})")
        return
    check(False, f"train_gpt {what}: accepted")


def test_train_gpt_bad_args():
    for argv, needle in ((["--steps", "0"], "--steps must be a whole number >= 1"),
                         (["--n-head", "3", "--n-embd", "32"], "must divide --n-embd"),
                         (["--n-head", "0"], "--n-head must be"),
                         (["--print-every", "0"], "--print-every must be"),
                         (["--batch-size", "0"], "--batch-size must be"),
                         (["--corpus-mb", "nan"], "--corpus-mb must be"),
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
                          "--compact-master needs --optimizer dos"),
                         (["--compact-master", "--dtype", "bf16", "--overlap", "backward"],
                          "use --overlap off or forward")) + \
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
    args = train_gpt.parse_args(["--compact-master", "--dtype", "bf16", "--overlap", "forward"])
    check(args.compact_master, "--compact-master with --dtype bf16 and --overlap forward accepted")
    with tempfile.TemporaryDirectory() as d:
        args = train_gpt.parse_args(["--log-json", os.path.join(d, "x.json"), "--subgroup-size", "2e4"])
        check(args.log_json.endswith("x.json") and os.listdir(d) == [], "a --log-json path accepted, nothing written")


if __name__ == "__main__":
    test_train_gpt_bad_args()
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
