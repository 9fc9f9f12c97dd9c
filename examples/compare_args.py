"""dos_compare.py's command line: its options, their checks, and the runs they ask for
(parse_args), with the constants the rest of dos_compare.py shares (the default policies and
baselines, the timeline run's label, the policies that need a GPU)."""
import argparse
import math
import os
import re
import shlex

from compare_runs import ENV_ASSIGNMENT, arg_value, file_tag, split_env
from dos_number_text import number_text, whole_arg

HERE = os.path.dirname(os.path.abspath(__file__))

DEFAULT_POLICIES = "dos,cpu,dmda,gpu"
DEFAULT_BASELINES = "zero_offload,stride:2,stride:3,stride:4"
TIMELINE_RUN = "timeline-run"  # the label (and file names) of the run that records --timeline
GPU_ONLY_POLICIES = ("gpu",)  # dos-train refuses them without a CUDA worker


def baseline_variant_ok(variant):
    """Whether ``variant`` (a str) is one the baselines take (``number_text.baseline_variant``:
    ``zero_offload``, ``stride:K``, ``twinflow:R``), checked here so that a bad one is refused
    before any run rather than after them."""
    try:
        number_text.baseline_variant(variant)
    except ValueError:
        return False
    return True


def parse_size(text):
    """'10GB', '31.5GB', '4e10', '10GiB' -> whole bytes (an int), by dos-train's rules for
    --gpu-*-budget: a plain decimal (blanks around the whole dropped), then an optional unit; a
    number without a unit, or in B, counts bytes and must be whole; -0 is 0. Raises ``ValueError``
    quoting ``text`` for a malformed size ('0x10GB', '1e', '4 GB'), a negative one, one beyond what
    a float holds (1e400, 1e-400), one over 9e18 bytes, and one above 0 that rounds to 0 bytes."""
    m = re.fullmatch(r"(.+?)(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?", text.strip())
    units = {None: 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 2 ** 10, "MiB": 2 ** 20,
             "GiB": 2 ** 30, "TiB": 2 ** 40}
    if not m or not number_text.is_decimal_number(m.group(1)):
        raise ValueError(f"'{text}' is not a size such as 10GB, 31.5GB or 4e10")
    v = number_text.parse_decimal(m.group(1))  # None beyond a float's range
    if (v is None and m.group(1).startswith("-")) or (v is not None and v < 0):  # -0 is 0
        raise ValueError(f"'{text}' is negative: give a size such as 10GB, 31.5GB or 4e10")
    if v is None:
        raise ValueError(f"'{text}' is beyond what a float holds: give 0 or a size from 1 byte to 9e18 bytes")
    b = v * units[m.group(2)]
    if b > 9e18:
        raise ValueError(f"'{text}' is beyond the largest size taken, 9e18 bytes")
    if units[m.group(2)] == 1 and v != math.floor(v):
        raise ValueError(f"'{text}' is not a whole number of bytes: give a larger unit, such as {m.group(1)}GB")
    whole = int(math.floor(b + 0.5))  # halves up, as dos-train's llround
    if b > 0 and whole == 0:
        raise ValueError(f"'{text}' is less than one byte: give 0 or a size of at least 1 byte")
    return whole


def parse_args(argv, doc):
    """Command-line arguments (see dos_compare.py's docstring, ``doc``, whose first paragraph --help
    prints). Exits 2 (argparse) with a message for malformed ones."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--dos-train", default=os.path.join(HERE, "..", "build", "examples", "dos-train"),
                    help="path of the dos-train binary (default: build/examples/dos-train)")
    ap.add_argument("--policies", default=None,
                    help=f"comma-separated policies (dos-train --policy values), default {DEFAULT_POLICIES} "
                         f"(gpu skipped without a CUDA worker)")
    ap.add_argument("--run", action="append", default=[], metavar="LABEL=ARGS",
                    help="an extra run: its label and its own dos-train arguments (repeatable); NAME=VALUE words "
                         "before them set environment variables for that run only (e.g. --run "
                         "\"starpu-stream=DOS_DOWNLOAD_STREAM=starpu --policy dos\")")
    ap.add_argument("--resident-budgets", default="",
                    help="comma-separated GPU resident budgets: a dos and a static:R run for each")
    ap.add_argument("--overlap", action="store_true",
                    help="also run every run with the update overlapped with backward (dos-train --overlap on, as "
                         "LABEL+overlap; needs --emulate-compute among the dos-train arguments): the iteration seconds "
                         "of both, the overlapped run's exposed update; the others run with --overlap off")
    ap.add_argument("--repeats", type=whole_arg, default=1,
                    help="rounds (default 1), each running every run, then the baselines, then the peers once: "
                         "median and min..max over them")
    ap.add_argument("--baselines", nargs="?", const=DEFAULT_BASELINES, default=None, metavar="LIST",
                    help=f"run the PyTorch baselines too (default list {DEFAULT_BASELINES}; twinflow:R "
                         f"added per resident budget)")
    ap.add_argument("--baselines-python", default=None,
                    help="the Python (with torch) that runs the baselines (default: this one or /usr/bin/python3, "
                         "the first that imports torch)")
    ap.add_argument("--peers", default=None, help="path of an external PyTorch script re-creating the baselines "
                         "(--n, --s, --iters, --variants; RESULT lines): run that cross-check too")
    ap.add_argument("--peer-iters", type=whole_arg, default=3, help="timed phases per peer variant (default 3)")
    ap.add_argument("--peer-variants", default="zero_offload,dos_stride:2,dos_stride:3,dos_stride:4",
                    help="the peers' variants beside the policies, comma-separated (default "
                         "zero_offload,dos_stride:2,dos_stride:3,dos_stride:4)")
    ap.add_argument("--timeline", action="store_true", help="plot a dos update phase: the last phase of one more run with the first dos run's arguments, "
                         "after the others and out of the table (timeline-run.json/.log)")
    ap.add_argument("--host-bench", nargs="?", default=None, metavar="PATH",
                    const=os.path.join(HERE, "..", "build", "bench", "dos-bench"),
                    help="also the lower bound at the rates dos-bench host (PATH, default build/bench/dos-bench) "
                         "measures here, and each run's percentage of it")
    ap.add_argument("--out", default="dos-compare-out", help="folder for the reports, logs, table and plot")
    ap.add_argument("--plot-only", action="store_true",
                    help="run nothing: draw compare.png from the compare.json (and timeline.json) in --out")
    ap.add_argument("--check-params", action="store_true",
                    help="save every run's final master parameters and compare them with the cpu run's")
    ap.add_argument("--st-compare", default=None,
                    help="path of st-compare (default: build/tests/st-compare next to dos-train's build)")
    ap.add_argument("train_args", nargs=argparse.REMAINDER,
                    help="after --: arguments given to every dos-train run (--preset, --shard, --iterations, ...)")
    a = ap.parse_args(argv)
    if a.train_args and a.train_args[0] == "--":
        a.train_args = a.train_args[1:]
    a.default_policies = a.policies is None
    policies = DEFAULT_POLICIES if a.policies is None else a.policies
    a.runs = [(p.strip(), ["--policy", p.strip()]) for p in policies.split(",") if p.strip()]
    a.custom_labels = {r.partition("=")[0].strip() for r in a.run}
    for r in a.run:
        label, eq, args = r.partition("=")
        try:
            tokens = shlex.split(args)
        except ValueError as e:
            ap.error(f"--run '{r}': its arguments do not split as a shell's would ({e})")
        env, rest = split_env(tokens)
        if not eq or not label.strip() or not rest or not rest[0].startswith("-") or arg_value(rest, "--policy") is None:
            ap.error(f"--run '{r}': give LABEL='[NAME=VALUE ...] dos-train options including --policy' (NAME=VALUE "
                     f"words, NAME in capitals, set that run's environment; dos-train takes no other words)")
        # a NAME=VALUE word after the options, unless it is the value of the option before it
        late = [t for i, t in enumerate(rest) if ENV_ASSIGNMENT.fullmatch(t)
                and not (i and rest[i - 1].startswith("--") and "=" not in rest[i - 1])]
        if late:
            ap.error(f"--run '{r}': {late[0]} looks like an environment variable's value: give such NAME=VALUE "
                     f"words first, before the dos-train arguments (e.g. --run \"{label.strip()}=DOS_COPY_BY=auto "
                     f"--policy dos\")")
        a.runs.append((label.strip(), env + rest))
    try:
        a.budgets = [(b.strip(), parse_size(b)) for b in a.resident_budgets.split(",") if b.strip()]
    except ValueError as e:
        ap.error(f"--resident-budgets: {e}")
    if a.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {a.repeats}")
    if a.peer_iters < 1:
        ap.error(f"--peer-iters must be at least 1, got {a.peer_iters}")
    a.baseline_variants = []
    if a.baselines is not None:
        a.baseline_variants = [v.strip() for v in a.baselines.split(",") if v.strip()]
        bad = [v for v in a.baseline_variants if not baseline_variant_ok(v)]
        if bad:
            ap.error(f"--baselines: unknown variant(s) {', '.join(bad)}: use zero_offload, stride:K (K a whole "
                     f"number >= 1) or twinflow:R (R the CPU share, a plain decimal in [0, 1])")
    if not a.runs and not a.budgets and not a.plot_only:
        ap.error("nothing to run: give --policies, --run or --resident-budgets")
    # every run's update phase after backward, unless its own arguments say otherwise; with
    # --overlap, each run once more with the update overlapped
    if a.overlap and "--emulate-compute" not in a.train_args:
        ap.error("--overlap compares iterations: give --emulate-compute among the dos-train arguments (after --)")
    with_overlap = []
    for label, args in a.runs:
        if arg_value(args, "--overlap") is None:
            with_overlap.append((label, args + ["--overlap", "off"]))
            if a.overlap:
                with_overlap.append((label + "+overlap", args + ["--overlap", "on"]))
        else:
            with_overlap.append((label, args))
    a.runs = with_overlap
    labels = [l for l, _ in a.runs]
    if len(set(labels)) != len(labels):
        ap.error(f"two runs have the same label: {labels}")
    tags = {}
    for label in labels:  # two labels must not write one file ("a/b" and "a b" are both a-b.json)
        other = tags.setdefault(file_tag(label), label)
        if other != label:
            ap.error(f"the labels '{other}' and '{label}' would write the same files ({file_tag(label)}.json, ...): "
                     f"choose labels that differ in letters, digits, '_', '.' or '-'")
    shared = {t.partition("=")[0] for t in a.train_args if t.startswith("--")}
    for label, args in a.runs:  # an option in both places: which one wins would be a guess
        both = sorted({t.partition("=")[0] for t in args if t.startswith("--")} & shared)
        if both:
            ap.error(f"run '{label}' sets {', '.join(both)}, which the dos-train arguments after -- give every run: "
                     f"give each option in one place")
    for label in labels:  # its files must not be another's (LABEL.json, LABEL.rK.json, baselines.json, ...)
        if re.search(r"\.r[0-9]+$", label) or file_tag(label) in ("baselines", "peers", "compare", "timeline",
                                                                    TIMELINE_RUN):
            ap.error(f"--run label '{label}' would share its files with another output (labels may not end in .rK "
                     f"nor be baselines, peers, compare, timeline or {TIMELINE_RUN}): choose another")
    for bad in ("--policy", "--report", "--save-params", "--sweep", "--timeline", "--gpu-resident-budget", "--overlap"):
        if any(t == bad or t.startswith(bad + "=") for t in a.train_args):
            ap.error(f"{bad} is set by dos-compare itself: leave it out of the dos-train arguments")
    return a
