"""The processes examples/dos_compare.py starts and what it reads back from them: dos-train runs
(run_one), st-compare (compare_params), the repository's PyTorch baselines (run_baselines, one
round at a time, and merge_baselines over the rounds) and the peers script (run_peers: an external
PyTorch script given by --peers, not part of this repository), with the helpers they share
(arg_value, round_tag, python_with). Every function writes its process's log (and report) into the
``--out`` folder of the arguments ``a`` that dos_compare.py parsed, and never raises for a process
that fails: it returns what says so."""
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BASELINES = os.path.join(HERE, "..", "python", "deep_optimizer_states", "baselines.py")

# dos-train's AdamW defaults (examples/dos-train/options.h), given to the baselines unless the dos-train
# arguments set them
TRAIN_HYPER = (("--lr", "1e-4"), ("--beta1", "0.9"), ("--beta2", "0.999"), ("--eps", "1e-8"),
               ("--weight-decay", "0.01"))


def round_tag(k):
    """The file-name suffix of round k (0-based): none for the first, ".rK" (K = k + 1) after it."""
    return f".r{k + 1}" if k else ""


def arg_value(args, name, default=None):
    """The value of option ``name`` in the argument list ``args`` (``NAME VALUE`` or ``NAME=VALUE``,
    the first one), or ``default`` when it is absent."""
    for i, t in enumerate(args):
        if t == name and i + 1 < len(args):
            return args[i + 1]
        if t.startswith(name + "="):
            return t.split("=", 1)[1]
    return default


# A word of a --run's arguments that sets an environment variable for that run's dos-train (as a
# shell's NAME=VALUE before a command): an upper-case name, then '='.
ENV_ASSIGNMENT = re.compile(r"[A-Z_][A-Z0-9_]*=.*")


def split_env(args):
    """A run's argument list (strings) split into its leading NAME=VALUE words (ENV_ASSIGNMENT: the
    environment variables set for that run's dos-train, e.g. a measurement switch such as
    DOS_COPY_BY=auto) and the dos-train arguments after them: (env words, arguments), two lists.
    Only the words before the first other word count. Raises nothing."""
    k = 0
    while k < len(args) and ENV_ASSIGNMENT.fullmatch(args[k]):
        k += 1
    return list(args[:k]), list(args[k:])


def file_tag(label):
    """``label`` as a file name's stem: every character but letters, digits, '_', '.' and '-' made '-'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", label)


def run_one(a, label, args, repeat, keep_params=True):
    """Runs dos-train once (repeat 0, 1, ... of run ``label``); returns (report dict or None, log path,
    params path or None). The first repeat's files are LABEL.json/.log, later ones LABEL.rK.*; the
    first repeat's parameters are saved with --check-params unless ``keep_params`` is False."""
    tag = file_tag(label) + round_tag(repeat)
    report = os.path.join(a.out, f"{tag}.json")
    log = os.path.join(a.out, f"{tag}.log")
    params = os.path.join(a.out, f"{tag}.safetensors") if a.check_params and not repeat and keep_params else None
    env_words, args = split_env(args)  # NAME=VALUE words first: that run's environment (--run)
    env = dict(os.environ, **dict(w.split("=", 1) for w in env_words))
    cmd = [a.dos_train, "--report", report] + (["--save-params", params] if params else []) + args + a.train_args
    with open(log, "w") as f:
        f.write("$ " + shlex.join(env_words + cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if rc != 0:
        with open(log, errors="replace") as f:  # the run's last words, which usually say what was wrong
            last = [line.strip() for line in f if line.strip()][-1:]
        said = f": {last[0][:300]}" if last and not last[0].startswith("$ ") else ""
        print(f"dos-compare: run {label} failed (exit status {rc}){said}; see {log}", file=sys.stderr)
        return None, log, None
    with open(report) as f:
        r = json.load(f)
    if "summary" not in r or "update_seconds_median" not in r["summary"]:
        print(f"dos-compare: the report of run {label} has no summary: see {report}", file=sys.stderr)
        return None, log, None
    print(f"dos-compare: {label}{f' (repeat {repeat + 1})' if repeat else ''}: update "
          f"{r['summary']['update_seconds_median']:.4f} s", flush=True)
    return r, log, params


def compare_params(a, ref, other):
    """st-compare's verdict line for two parameter files (bit for bit: every policy and schedule must
    give the same bits), or None when st-compare is missing."""
    exe = a.st_compare or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.dos_train))), "tests",
                                       "st-compare")
    if not os.path.exists(exe):
        return None
    p = subprocess.run([exe, ref, other], capture_output=True, text=True)
    line = (p.stdout.strip().splitlines() or [""])[-1]
    return ("ok: " if p.returncode == 0 else "DIFFER: ") + line



MATPLOTLIB_PROBE = "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot"


def python_with(probe, skip_this=False):
    """A Python executable that runs ``probe`` (Python code, e.g. ``"import torch"``) without an
    error: this one (unless ``skip_this``), else /usr/bin/python3, else python3 on PATH; None when
    none does."""
    seen = [sys.executable] if skip_this else []
    for py in (sys.executable, "/usr/bin/python3", shutil.which("python3")):
        if not py or py in seen or not os.access(py, os.X_OK):
            continue
        seen.append(py)
        if subprocess.call([py, "-c", probe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0:
            return py
    return None


def torch_python(a):
    """A Python executable that imports torch (--baselines-python, else :func:`python_with`), or
    None."""
    return a.baselines_python or python_with("import torch")


def run_baselines(a, r0, variants, notes, k=0):
    """Runs python/deep_optimizer_states/baselines.py once (round ``k``, 0-based: its JSON and log
    are baselines[.rK].json/.log) on the workload of report ``r0`` (N, S, dtype, optimizer,
    iteration count, CPU threads; hyper-parameters from the dos-train arguments, else dos-train's
    defaults; the GPU variants where dos-train's buffers were on a GPU). Returns (results list,
    error text or None); skipped variants and a missing torch go to ``notes``."""
    py = torch_python(a)
    if py is None:
        notes.append("--baselines: no Python here imports torch (tried this one and /usr/bin/python3; "
                     "give --baselines-python): baselines skipped")
        return [], None
    device = "cuda" if r0.get("caller_memory") == "cuda" else "cpu"
    cmd = [py, BASELINES, "--n", str(r0["params"]), "--s", str(r0["subgroup_size"]), "--dtype", r0["dtype"],
           "--optimizer", r0.get("optimizer", "adamw"), "--iterations", str(len(r0["iterations"])),
           "--repeats", "1", "--device", device, "--variants", ",".join(variants),
           "--json", os.path.join(a.out, f"baselines{round_tag(k)}.json")]
    if r0.get("cpu_threads"):
        cmd += ["--threads", str(r0["cpu_threads"])]
    for opt, default in TRAIN_HYPER:
        cmd += [opt, arg_value(a.train_args, opt, default)]
    log = os.path.join(a.out, f"baselines{round_tag(k)}.log")
    path = os.path.join(a.out, f"baselines{round_tag(k)}.json")
    if os.path.exists(path):  # an earlier invocation's: must not pass for this one's when this one writes none
        os.remove(path)
    print(f"dos-compare: baselines {', '.join(variants)} ({device}), log {log}", flush=True)
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc not in (0, 1) or not os.path.exists(path):
        return [], f"the baselines exited with status {rc}: see {log}"
    with open(path) as f:
        results = json.load(f)["results"]
    for r in results:
        if "skipped" in r:
            notes.append(f"baseline {r['variant']} skipped: {r['skipped']}")
    bad = [r["variant"] for r in results if "failed" in r or r.get("params_mismatch")]
    return results, (f"baseline(s) {', '.join(bad)} failed or gave parameters that are not their rounded masters: "
                     f"see {log}" if bad else None)


def merge_baselines(rounds):
    """One result per variant from the baselines' rounds (lists of baselines.py results), in the
    order the variants first appear: the repeats of every round where the variant has seconds
    pooled, their median, minimum and maximum, and params/s at that median (the other fields from
    its first round with seconds); a variant without seconds in any round stays as its first round
    gave it (skipped or failed)."""
    merged = []
    for variant in dict.fromkeys(x.get("variant") for rnd in rounds for x in rnd):
        same = [x for rnd in rounds for x in rnd if x.get("variant") == variant and "seconds_median" in x]
        if not same:
            merged.append(next(x for rnd in rounds for x in rnd if x.get("variant") == variant))
            continue
        first = same[0]
        per = [t for x in same for t in x["repeat_seconds"]]
        med = statistics.median(per)
        merged.append(dict(first, seconds_median=med, seconds_min=min(per), seconds_max=max(per), repeat_seconds=per,
                           phase_seconds=[ph for x in same for ph in x["phase_seconds"]],
                           gparams_per_s=first["gparams_per_s"] * first["seconds_median"] / med))
    return merged


_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(?![0-9.eE])"
PEER_RESULT = re.compile(rf"RESULT\s+(\S+)\s+{_NUMBER}\s+s/phase(?:\s+\(best\s+{_NUMBER}\s+worst\s+{_NUMBER})?")


def run_peers(a, n, s, twinflow, notes, k=0, phase_spread=None):
    """Runs the peers script ``a.peers`` (an external PyTorch script, called with --n N --s S --iters
    ITERS --variants LIST, that prints one ``RESULT VARIANT SECONDS s/phase`` line per variant,
    optionally followed by ``(best B worst W`` seconds of its fastest and slowest phase) once
    (round ``k``: its log is peers[.rK].log); returns {variant: mean seconds per phase} of the
    variants it finished (a variant with no RESULT line, or a zero one, is missing; numbers as
    Python writes floats, exponents included; of several lines for one variant, the last). When
    ``phase_spread`` (a dict) is given, it receives {variant: (best, worst)} for the RESULT lines
    that carry both with 0 < B <= mean <= W (within 1e-9 relative); a pair outside that is left out
    with a WARNING in ``notes``, as is a non-zero exit status."""
    base = [v.strip() for v in a.peer_variants.split(",") if v.strip()] if a.runs else []
    variants = base + [f"twinflow:{r:.4g}" for r in twinflow]
    cmd = [sys.executable, a.peers, "--n", str(n), "--s", str(s), "--iters", str(a.peer_iters),
           "--variants", ",".join(variants)]
    log = os.path.join(a.out, f"peers{round_tag(k)}.log")
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    out = {}
    for line in open(log):
        m = PEER_RESULT.match(line)
        if not m:
            continue
        v, mean = m.group(1), float(m.group(2))
        if not (mean > 0 and math.isfinite(mean)):
            continue
        out[v] = mean
        if phase_spread is None:
            continue
        phase_spread.pop(v, None)  # a later line for the variant replaces the earlier one whole
        if m.group(3) and m.group(4):
            best, worst = float(m.group(3)), float(m.group(4))
            tol = 1e-9 * mean
            if 0 < best <= mean + tol and mean - tol <= worst and math.isfinite(worst):
                phase_spread[v] = (best, worst)
            else:
                notes.append(f"WARNING: peer {v}: its phases' best {best:g} and worst {worst:g} s do not hold its mean "
                             f"{mean:g} s (round {k + 1}, {log}): its spread is left out")
    if rc != 0:
        print(f"dos-compare: the peers exited with status {rc}: see {log}", file=sys.stderr)
        notes.append(f"WARNING: the peers exited with status {rc} in round {k + 1} (see {log}); that round gave "
                     f"the variants it finished: {', '.join(out) or 'none'}")
    return out
