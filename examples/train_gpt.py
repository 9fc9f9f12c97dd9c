#!/usr/bin/env python3
"""Train a GPT-2-style causal language model on real text, with the optimizer's update phase run by
Deep Optimizer States (``--optimizer dos``) or by PyTorch's AdamW for comparison.

The model starts from a random initialisation: Hugging Face ``transformers``' GPT2LMHeadModel when
``transformers`` is importable (``--model hf``, or ``auto``), otherwise the small GPT-2 defined
below (``--model builtin``: token and position embeddings, pre-LayerNorm blocks of causal
self-attention and a 4x GELU MLP, a final LayerNorm, the output head tied to the token embedding;
no dropout). Tokenisation is at byte level: the vocabulary is the 256 byte values.

The corpus is real text that is on every machine with Python, offline: by default the ``.py``
source files of the running interpreter's standard library (``sysconfig.get_paths()["stdlib"]``,
for example ``/usr/lib/python3.11`` with Debian's Python or ``/usr/lib/python3.12`` on Ubuntu 24.04),
read in sorted path order and concatenated, up to ``--corpus-mb`` megabytes. ``--corpus PATH``
(repeatable; files, or folders searched for ``--corpus-glob``) picks other text, for example
``--corpus /usr/share/doc --corpus-glob '*.txt'``. Batches are random windows of the corpus, drawn
from a generator seeded by ``--seed`` and the step number, so that every run of the same
arguments sees the same batches.

Optimizers (all AdamW with the same hyper-parameters, gradient clipping and schedule):
  dos                 DeepOptimizerStates: fp32 master parameters and Adam state in the runtime's
                      pinned host memory, updates placed by ``--policy``;
  adamw               torch.optim.AdamW on the model's device (fp32 master copies on that device
                      when the model is 16-bit; fused CUDA kernel where available);
  adamw-cpu-offload   ZeRO-Offload's recipe in PyTorch: fp32 master parameters and Adam state in
                      pinned host memory, gradients converted to fp32 on the GPU and copied down,
                      torch.optim.AdamW on the CPU (fused where available), 16-bit parameters
                      copied up.

Each step prints the loss (mean cross-entropy over the batch's next-byte predictions, nats),
tokens/s (batch tokens over the whole step's wall time) and the optimizer's update-phase seconds
(``opt``: the whole optimizer step, from gradients ready to parameters updated, including the
gradient norm; for ``dos`` also ``phase``: the runtime's own update phase). ``--log-json FILE``
writes every step and a summary.

``--overlap`` (with ``--optimizer dos``) hides the update: ``backward`` overlaps it with the backward
pass (``DeepOptimizerStates(overlap=True)``: each parameter's gradient is declared final by a hook
as autograd accumulates it), ``forward`` lets the update phase run on into the next forward pass
(``overlap_forward``: each block of the model waits only for its own parameters, blocks from
:func:`overlap_blocks`), ``both`` does both. The parameters are the same bits in every mode. Then
``opt`` is the time spent inside ``step()`` and tokens/s counts each step from its batch to its
loss being read, its forward's waits included; ``phase`` is still the runtime's whole update phase.

``--compact-master`` (with ``--optimizer dos`` and ``--dtype bf16``) keeps the runtime's fp32 masters
in compact form (``DeepOptimizerStates(compact_master=True)``: each master as its low 16 bits and a
rounding bit beside the model's bf16 parameter, 10.125 instead of 12 bytes of state per parameter
across PCIe); the same bits. With ``--overlap backward`` or ``both`` only the subgroups the plan updates
on the CPU are updated during backward.

Example (CPU, seconds):  python3 examples/train_gpt.py --steps 20 --optimizer dos --policy cpu
"""

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time

try:
    import torch
except ImportError:  # a Python without torch (pyenv's first on PATH?): say so, not a traceback
    sys.exit("train_gpt.py needs PyTorch: run it with a Python that imports torch (Debian: /usr/bin/python3 "
             "with python3-torch)")
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)  # torch_adamw.py, when this file is imported from elsewhere

from torch_adamw import MasterAdamW, PlainAdamW  # noqa: E402
from dos_number_text import decimal_arg, number_text, whole_arg  # noqa: E402

from gpt_model import (VOCAB, GPT, Block, _HFWrapper, get_batch, load_corpus, make_model,  # noqa: E402,F401
                       overlap_blocks)


def make_optimizer(args, model):
    """The optimizer ``args.optimizer`` names over ``model``'s parameters (one group, weight decay
    on every parameter). For ``dos``, ``args.overlap`` picks the overlap: ``backward`` or ``both``
    construct it with ``overlap=True``, ``forward`` or ``both`` call ``overlap_forward(model,
    overlap_blocks(model))``."""
    betas = (args.beta1, args.beta2)
    params = list(model.parameters())
    if args.optimizer == "dos":
        from deep_optimizer_states import DeepOptimizerStates
        opt = DeepOptimizerStates(params, lr=args.lr, betas=betas, eps=args.eps, weight_decay=args.weight_decay,
                                  decoupled=True, subgroup_size=args.subgroup_elements, policy=args.policy,
                                  max_grad_norm=args.max_grad_norm, verbose=args.verbose,
                                  overlap=args.overlap in ("backward", "both"),
                                  urgent_writeback=args.urgent_writeback,
                                  # the threads launching forward and backward keep a core beside CPU Adam
                                  caller_cores=1 if args.overlap != "off" else None,
                                  gpu_update_budget=args.gpu_update_budget_bytes,
                                  gpu_resident_budget=args.gpu_resident_budget_bytes,
                                  tail_subgroups=args.tail_subgroups, compact_master=args.compact_master)
        if args.overlap in ("forward", "both"):
            opt.overlap_forward(model, overlap_blocks(model))
        return opt
    on_device = args.optimizer == "adamw"
    if params[0].dtype == torch.float32 and (on_device or params[0].device.type == "cpu"):
        return PlainAdamW(params, args.lr, betas, args.eps, args.weight_decay, args.max_grad_norm)
    return MasterAdamW(params, params[0].device if on_device else "cpu", args.lr, betas, args.eps,
                       args.weight_decay, args.max_grad_norm)


def record_phase(rec, info):
    """Copies into a step's record ``rec`` (dict) the update phase's figures from the
    ``DeepOptimizerStates.last_step`` dict ``info``: ``phase_seconds`` (s), the first bucket's
    ``subgroups_cpu`` / ``subgroups_gpu``, ``h2d_bytes`` / ``d2h_bytes`` (bytes), every bucket's
    ``tail_bound`` / ``tail_moved`` summed (the late binding's subgroups, ``--tail-subgroups``), the first bucket's
    ``predicted_seconds`` (s), ``refinement_held`` (0 or 1: the rates' refinement held the phase as an
    outlier) and ``plan_seconds`` (s the phase's start spent on its plan), the gradient downloads by the
    copy engine over every bucket: ``longest_download_seconds`` (s, the longest) and
    ``longest_download_bytes`` (its bytes), and ``downloads_dodge_writebacks`` (1 when a bucket's
    downloads went by the kernel while a write-back was on its way home: the copy rule, ``DOS_COPY_BY``),
    and the overlap's ``speculated``, ``redone`` and ``hidden_params``. Called again once a phase left
    running into the next forward has ended (``info`` is completed in place then)."""
    if "update_seconds" in info:
        rec["phase_seconds"] = info["update_seconds"]
    if info.get("stats"):
        s = info["stats"][0]
        rec.update(subgroups_cpu=s["subgroups_cpu"], subgroups_gpu=s["subgroups_gpu"], h2d_bytes=s["bytes_h2d"],
                   d2h_bytes=s["bytes_d2h"], tail_bound=sum(b.get("tail_bound", 0) for b in info["stats"]),
                   tail_moved=sum(b.get("tail_moved", 0) for b in info["stats"]),
                   predicted_seconds=s.get("predicted_seconds", 0), refinement_held=s.get("refinement_held", 0),
                   plan_seconds=s.get("plan_seconds", 0))
        longest = max(info["stats"], key=lambda b: b.get("longest_download_seconds", 0))
        rec.update(longest_download_seconds=longest.get("longest_download_seconds", 0),
                   longest_download_bytes=longest.get("longest_download_bytes", 0),
                   downloads_dodge_writebacks=int(any(b.get("downloads_dodge_writebacks", 0) for b in info["stats"])))
    rec.update(speculated=info.get("speculated", 0), redone=info.get("redone", 0),
               hidden_params=info.get("hidden_params", 0))


def lr_at(args, step):
    """Learning rate of step ``step`` (1-based): linear warm-up over ``--warmup`` steps, then
    constant or cosine decay to ``--min-lr-ratio`` of ``--lr`` at ``--steps``."""
    if args.warmup and step <= args.warmup:
        return args.lr * step / args.warmup
    if args.schedule == "cosine":
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))
    return args.lr


# ---------------------------------------------------------------------------------------------
# training


def parse_args(argv=None):
    """The command line (``argv``, default sys.argv) as an argparse.Namespace; ``--help`` lists it."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--optimizer", choices=["dos", "adamw", "adamw-cpu-offload"], default="dos")
    ap.add_argument("--policy", default="dos", help="the runtime's scheduling policy (cpu, gpu, dos, static:R, dmda...)")
    ap.add_argument("--model", choices=["auto", "hf", "builtin"], default="auto")
    ap.add_argument("--n-layer", type=whole_arg, default=4)
    ap.add_argument("--n-embd", type=whole_arg, default=128)
    ap.add_argument("--n-head", type=whole_arg, default=4)
    ap.add_argument("--seq-len", type=whole_arg, default=128)
    ap.add_argument("--batch-size", type=whole_arg, default=16)
    ap.add_argument("--steps", type=whole_arg, default=50)
    ap.add_argument("--lr", type=decimal_arg, default=1e-3)
    ap.add_argument("--min-lr-ratio", type=decimal_arg, default=0.1)
    ap.add_argument("--warmup", type=whole_arg, default=0, help="linear warm-up steps")
    ap.add_argument("--schedule", choices=["constant", "cosine"], default="constant")
    ap.add_argument("--beta1", type=decimal_arg, default=0.9)
    ap.add_argument("--beta2", type=decimal_arg, default=0.95)
    ap.add_argument("--eps", type=decimal_arg, default=1e-8)
    ap.add_argument("--weight-decay", type=decimal_arg, default=0.1)
    ap.add_argument("--max-grad-norm", type=decimal_arg, default=1.0, help="0: no clipping")
    ap.add_argument("--subgroup-size", default="1e8", help="elements per subgroup (dos)")
    ap.add_argument("--overlap", choices=["off", "backward", "forward", "both"], default="off",
                    help="dos: overlap the update with backward, with the next forward, or both (the same bits)")
    ap.add_argument("--urgent-writeback", action="store_true",
                    help="dos: the CPU-updated subgroups' parameters go back ahead of the CUDA worker's queue "
                         "(DeepOptimizerStates(urgent_writeback=True); for --overlap forward/both)")
    ap.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32", help="the model's parameters")
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    ap.add_argument("--loss-scale", type=decimal_arg, default=0,
                    help="fp16: initial dynamic loss scale (default 2^16); halved on an inf/NaN step, doubled "
                         "after 1000 good steps")
    ap.add_argument("--corpus", action="append", help="text file or folder (repeatable); default: the Python "
                    "standard library's .py files")
    ap.add_argument("--corpus-glob", help="file-name pattern in --corpus folders (default *)")
    ap.add_argument("--corpus-mb", type=decimal_arg, default=8.0)
    ap.add_argument("--seed", type=whole_arg, default=1234)
    ap.add_argument("--log-json", help="write every step and a summary to this JSON file")
    ap.add_argument("--print-every", type=whole_arg, default=1)
    ap.add_argument("--time-limit", type=decimal_arg, default=0,
                    help="stop after the step during which the training loop passed this many seconds (0: none)")
    ap.add_argument("--verbose", action="store_true", help="the runtime's start-up and calibration lines")
    ap.add_argument("--gpu-resident-budget", type=decimal_arg, default=0,
                    help="dos: GB of optimizer state (12 bytes per parameter, padded to 16 elements per subgroup "
                         "slice) the GPU may keep between steps "
                         "(0: none given; DeepOptimizerStates(gpu_resident_budget=...))")
    ap.add_argument("--tail-subgroups", type=whole_arg, default=0,
                    help="dos: late binding of the plan's tail, the last N subgroups given their side while the "
                         "phase runs, in [0, 1000000] (0: the plan as made; DeepOptimizerStates(tail_subgroups=N)); "
                         "needs --overlap off (an overlapped step binds nothing)")
    ap.add_argument("--compact-master", action="store_true",
                    help="dos: keep each fp32 master parameter as its low 16 bits and a rounding bit beside the "
                         "model's bf16 parameter (DeepOptimizerStates(compact_master=True)): 10.125 instead of 12 "
                         "bytes of state per parameter across PCIe, the same bits; needs --dtype bf16; with "
                         "--overlap backward or both only the CPU's subgroups are updated during backward")
    ap.add_argument("--gpu-update-budget", type=decimal_arg, default=0,
                    help="dos: GB of GPU memory the update phase may hold at once (0: no limit but StarPU's)")
    ap.add_argument("--timeline", help="dos: write the timeline of --timeline-steps to this JSON file (and a PNG "
                    "beside it when matplotlib imports): forward, backward and step() of each step, and every task of "
                    "their update phases, on one clock")
    ap.add_argument("--timeline-steps", default="3:5", help="first:last step of the timeline (default 3:5); those "
                    "steps synchronise the GPU after forward to time it")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch's deterministic algorithms (torch.use_deterministic_algorithms(True): an op that has "
                         "none raises), so that two runs can be compared bit for bit")
    args = ap.parse_args(argv)
    for flag, value, least in (("--n-layer", args.n_layer, 1), ("--n-embd", args.n_embd, 1),
                               ("--n-head", args.n_head, 1), ("--seq-len", args.seq_len, 1),
                               ("--batch-size", args.batch_size, 1), ("--steps", args.steps, 1),
                               ("--print-every", args.print_every, 1), ("--warmup", args.warmup, 0)):
        if value < least:
            ap.error(f"{flag} must be a whole number >= {least}, got {value}")
    if args.n_embd % args.n_head:
        ap.error(f"--n-head {args.n_head} must divide --n-embd {args.n_embd} (each head takes n_embd / n_head)")
    check_hyper_args(ap, args, (("--loss-scale", args.loss_scale), ("--time-limit", args.time_limit)))
    if args.corpus_glob is not None and not args.corpus:
        ap.error("--corpus-glob picks files in --corpus folders: give --corpus too (the default corpus is the "
                 "Python library's *.py files)")
    args.corpus_glob = args.corpus_glob or "*"
    for path in args.corpus or []:
        if not os.path.exists(path):
            ap.error(f"--corpus {path} does not exist")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this torch sees no GPU (torch.cuda.is_available() is False): give --device cpu "
                 "or auto")
    if not 0 <= args.min_lr_ratio <= 1:
        ap.error(f"--min-lr-ratio must be in [0, 1] (the final learning rate over --lr), got {args.min_lr_ratio}")
    if not (math.isfinite(args.corpus_mb) and args.corpus_mb > 0):
        ap.error(f"--corpus-mb must be a finite number of MB > 0, got {args.corpus_mb}")
    args.subgroup_elements = subgroup_elements(ap, args.subgroup_size)
    if args.device not in ("auto", "cpu", "cuda"):
        ap.error(f"--device must be auto, cpu or cuda, got {args.device!r}")
    for flag, path in (("--log-json", args.log_json), ("--timeline", args.timeline)):
        if path:
            check_output_path(ap, flag, path)
    if args.log_json and args.timeline and os.path.abspath(args.log_json) == os.path.abspath(args.timeline):
        ap.error("--log-json and --timeline name the same file: give each its own")
    if args.overlap != "off" and args.optimizer != "dos":
        ap.error(f"--overlap {args.overlap} needs --optimizer dos (torch's AdamW runs after backward)")
    if args.urgent_writeback and args.optimizer != "dos":
        ap.error("--urgent-writeback needs --optimizer dos")
    if not 0 <= args.tail_subgroups <= 1000000:
        ap.error(f"--tail-subgroups must be in [0, 1000000] (subgroups; 0: the plan as made), got {args.tail_subgroups}")
    if args.tail_subgroups and args.optimizer != "dos":
        ap.error("--tail-subgroups needs --optimizer dos (it binds the runtime's plan)")
    if args.tail_subgroups and args.overlap != "off":
        ap.error(f"--tail-subgroups binds the plan's tail in steps run after backward; with --overlap "
                 f"{args.overlap} nothing would be bound: use --overlap off, or leave --tail-subgroups out")
    if args.compact_master and args.optimizer != "dos":
        ap.error("--compact-master needs --optimizer dos (it is the runtime's form of the masters)")
    if args.compact_master and args.dtype != "bf16":
        ap.error(f"--compact-master needs --dtype bf16 (each master is rebuilt from its bf16 parameter), got --dtype "
                 f"{args.dtype}: give --dtype bf16 or leave --compact-master out")
    args.gpu_resident_budget_bytes = budget_bytes(ap, "--gpu-resident-budget", args.gpu_resident_budget,
                                                  args.optimizer)
    args.gpu_update_budget_bytes = budget_bytes(ap, "--gpu-update-budget", args.gpu_update_budget, args.optimizer,
                                                least=1)
    if args.timeline and args.optimizer != "dos":
        ap.error("--timeline needs --optimizer dos (the runtime's tasks are what it shows)")
    try:  # each side read as --steps is (whole_arg: the digits 0-9)
        first, last = map(whole_arg, args.timeline_steps.split(":"))
    except (argparse.ArgumentTypeError, ValueError):  # ValueError: not two sides
        ap.error(f"--timeline-steps must be FIRST:LAST (whole numbers written with the digits 0-9), got "
                 f"{args.timeline_steps!r}")
    if not 1 <= first <= last:
        ap.error(f"--timeline-steps must satisfy 1 <= FIRST <= LAST, got {args.timeline_steps!r}")
    if args.timeline and last > args.steps:
        ap.error(f"--timeline-steps {args.timeline_steps} ends after --steps {args.steps}: the timeline would miss "
                 "steps")
    args.timeline_range = (first, last)
    if args.max_grad_norm == 0:
        args.max_grad_norm = None
    return args


def check_hyper_args(ap, args, nonnegative=()):
    """Exits through ``ap.error`` (argparse's usage error, the option named) when ``args.seed`` is
    outside [0, 2**32), ``args.lr``, ``eps``, ``weight_decay``, ``max_grad_norm`` or a (flag, value)
    of ``nonnegative`` is not a finite number >= 0, or ``args.beta1`` or ``beta2`` is outside
    [0, 1). Shared with examples/hf_trainer.py."""
    if not 0 <= args.seed < 2 ** 32:
        ap.error(f"--seed must be in [0, 2**32 - 1] (the range numpy and the frameworks take), got {args.seed}")
    for flag, value in (("--lr", args.lr), ("--eps", args.eps), ("--weight-decay", args.weight_decay),
                        ("--max-grad-norm", args.max_grad_norm)) + tuple(nonnegative):
        if not (math.isfinite(value) and value >= 0):
            ap.error(f"{flag} must be >= 0 (a finite number), got {value}")
    for flag, value in (("--beta1", args.beta1), ("--beta2", args.beta2)):
        if not 0 <= value < 1:
            ap.error(f"{flag} must be in [0, 1), got {value}")


def budget_bytes(ap, flag, gb, optimizer, least=0):
    """The value ``gb`` (float, GB) of the GPU budget option ``flag`` as bytes (int), None for 0 (not
    given). Exits through ``ap.error`` (argparse.ArgumentParser) when it is not finite, below
    ``least`` bytes or above 2**63 - 1 bytes (the runtime's field), or given with an ``optimizer``
    other than ``dos``. Shared with examples/hf_trainer.py."""
    if gb == 0:
        return None
    if optimizer != "dos":
        ap.error(f"{flag} needs --optimizer dos")
    if not (math.isfinite(gb) and least <= gb * 1e9 <= 2 ** 63 - 1):
        ap.error(f"{flag} must be finite GB in [{least / 1e9:g}, 9.2e9] (0: not given), got {gb}")
    return int(gb * 1e9)


def subgroup_elements(ap, text):
    """``--subgroup-size`` as given (``text``, a str: ``"1e8"``, ``"20000"``) as an int of elements
    (digits read exactly, ``number_text.parse_count``). Exits through ``ap.error`` (argparse's usage
    error) when it is not a whole number in [1, 2**53]. Shared with examples/hf_trainer.py."""
    try:
        sub = number_text.parse_count(text, "--subgroup-size")
    except ValueError:
        sub = None
    if sub is None or sub > 2 ** 53:
        ap.error(f"--subgroup-size must be a whole number of elements in [1, 2**53] (1e8 notation accepted), "
                 f"got {text!r}")
    return int(sub)


def check_output_path(ap, flag, path):
    """Exits through ``ap.error`` before any training when the output file ``path`` of option
    ``flag`` could not be written at the end: it is a folder, its folder does not exist, or a file
    cannot be created there (tried with a temporary file, removed at once: permissions, a read-only
    or special file system such as /proc)."""
    if os.path.isdir(path):
        ap.error(f"{flag} {path} is a folder: give a file path")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        ap.error(f"{flag} {path}: the folder {folder} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".train_gpt-check-"):
            pass
    except OSError as e:
        ap.error(f"{flag} {path}: no file can be created in {folder} ({e.strerror})")


def write_json(path, doc):
    """Writes ``doc`` as JSON to ``path`` through ``path``.tmp, so that a run killed meanwhile leaves
    the previous file whole; a write that fails leaves no ``.tmp`` behind (and raises its
    ``OSError``)."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.isfile(tmp):
            os.remove(tmp)
        raise


def write_timeline(path, spans, infos):
    """Writes the timeline JSON ``path`` (through a temporary file): ``spans`` (list of dicts
    ``step``, ``forward``, ``backward``, ``step_call``: [start, end] pairs in perf_counter seconds)
    and, from ``infos`` ((step, last_step dict) pairs, completed phases), every bucket's phase
    ``started`` and its ``tasks`` (lane, what, subgroup, start, end); every time in seconds from the
    first span's start (``origin``, perf_counter s). Draws ``path`` with ``.png`` for ``.json`` when
    matplotlib imports. Returns the dict written."""
    origin = spans[0]["forward"][0] if spans else 0.0
    rel = lambda pair: [pair[0] - origin, pair[1] - origin]  # noqa: E731
    phases = []
    for step, info in infos:
        for k, st in enumerate(info.get("stats") or []):
            if "started_at" not in st:
                continue
            t = st["started_at"] - origin
            phases.append(dict(step=step, bucket=k, started=t, seconds=st["seconds"],
                               tasks=[dict(x, start=x["start"] + t, end=x["end"] + t) for x in st["timeline"]]))
    doc = dict(origin_perf_counter=origin, steps=[dict(step=x["step"], forward=rel(x["forward"]),
                                                       backward=rel(x["backward"]), step_call=rel(x["step_call"]))
                                                  for x in spans], phases=phases)
    write_json(path, doc)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"timeline: {path} (matplotlib is not importable: no PNG)", flush=True)
        return doc
    fig, ax = plt.subplots(figsize=(14, 3.6))
    rows = {"model": 2, "gpu": 1, "h2d": 0.6, "d2h": 0.4, "writeback": 0.1, "cpu": -0.3}
    colors = {"forward": "C0", "backward": "C1", "step_call": "C7", "adam": "C2", "adam_spec": "C4",
              "gather": "C9", "scatter": "C3", "state": "C5"}
    for x in doc["steps"]:
        for what in ("forward", "backward", "step_call"):
            a, b = x[what]
            ax.barh(rows["model"], b - a, left=a, height=0.6, color=colors[what])
    for ph in phases:
        for tk in ph["tasks"]:
            off = 0.0 if tk["lane"] in ("h2d", "d2h", "writeback") else (0.15 if tk["what"] in ("gather", "scatter") else -0.15)
            ax.barh(rows[tk["lane"]] + off, tk["end"] - tk["start"],
                    left=tk["start"], height=0.3, color=colors[tk["what"]])
    ax.set_yticks(list(rows.values()), [f"{k}" + (" (fwd, bwd, step)" if k == "model" else " tasks") for k in rows])
    ax.set_xlabel(f"seconds from step {spans[0]['step'] if spans else '?'}'s start")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()], labels=list(colors),
              ncol=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=8)
    fig.tight_layout()
    png = (path[:-5] if path.endswith(".json") else path) + ".png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    print(f"timeline: {path}, {png}", flush=True)
    return doc


def overlap_warning(args, device):
    """The warning to print for ``args.overlap`` (str) with the model on ``device`` (torch.device),
    or None. With the model on the CPU its forward and backward run on the cores that CPU Adam uses,
    so an overlapped update takes cores from them rather than hiding behind them (a 2-core machine
    trained about 3x slower with ``--overlap both``). Raises nothing."""
    if args.overlap == "off" or device.type != "cpu":
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"train_gpt: warning: --overlap {args.overlap} with the model on the CPU: its forward and backward "
            f"run on the cores CPU Adam uses ({cores} here), so the update takes cores from them "
            f"instead of hiding behind them; the overlap is meant for a model on the GPU (--overlap off here)")


def main(argv=None):
    """Runs the training the arguments describe; returns a dict with ``losses`` (list of floats),
    ``opt_seconds`` and ``phase_seconds`` per step, the parameter count and the optimizer."""
    args = parse_args(argv)
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for reproducible results
        torch.use_deterministic_algorithms(True)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    data, corpus_desc = load_corpus(args.corpus, args.corpus_glob, int(args.corpus_mb * 1e6))
    torch.manual_seed(args.seed)
    # built where it will train when torch can (>= 2.0: a GPU initialises 1e9 parameters in a blink)
    where = device if hasattr(torch.device(device), "__enter__") else contextlib.nullcontext()
    with where:
        model, model_desc = make_model(args.model, args.n_layer, args.n_embd, args.n_head, args.seq_len)
    model = model.to(device=device, dtype=dtype)
    nparams = sum(p.numel() for p in model.parameters())
    try:
        opt = make_optimizer(args, model)
    except Exception as e:  # noqa: BLE001
        # the optimizer's own refusals (policy, budgets, hyper-parameters: ValueError) and the
        # runtime's start-up failures (DosError) as a message; anything else as it is
        if isinstance(e, ValueError) or type(e).__module__.startswith("deep_optimizer_states"):
            sys.exit(f"train_gpt: error: {e}")
        raise
    print(f"train_gpt: {model_desc}, {args.n_layer} layers, hidden {args.n_embd}, {args.n_head} heads, context "
          f"{args.seq_len}, {nparams:,} parameters ({args.dtype} on {device.type}); batch {args.batch_size} x "
          f"{args.seq_len} tokens; optimizer {args.optimizer}"
          + (f" (policy {args.policy}, subgroups of {args.subgroup_elements:,}"
             + (", compact master" if args.compact_master else "") + ")" if args.optimizer == "dos" else "")
          + f"; torch {torch.__version__}", flush=True)
    print(f"corpus: {corpus_desc}, byte-level tokens", flush=True)
    warning = overlap_warning(args, device)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    loss_scale = (args.loss_scale or 2.0 ** 16) if dtype == torch.float16 else None
    good = 0
    records = []
    tokens = args.batch_size * args.seq_len
    cuda = device.type == "cuda"
    # the current stream only: a device-wide synchronisation would also wait for the runtime's streams
    sync = torch.cuda.current_stream(device).synchronize if cuda else (lambda: None)
    infos = []  # dos: (record, the optimizer's last_step dict: completed in place when its phase ends)
    spans = []  # --timeline: forward, backward and step() of the timed steps
    t_start = time.perf_counter()
    for step in range(1, args.steps + 1):
        lr = lr_at(args, step)
        for g in opt.param_groups:
            g["lr"] = lr
        timed = bool(args.timeline) and args.timeline_range[0] <= step <= args.timeline_range[1]
        if timed and step == args.timeline_range[0]:
            opt.timeline = True  # the runtime records these steps' phases only (its bus sampler costs a thread)
        t0 = time.perf_counter()
        x, y = get_batch(data, step, args.batch_size, args.seq_len, args.seed, device)
        logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))
        if timed:
            sync()
            t_fwd = time.perf_counter()
        (loss * loss_scale if loss_scale else loss).backward()
        sync()
        t1 = time.perf_counter()
        opt.step(grad_scale=loss_scale)
        sync()
        t2 = time.perf_counter()
        if timed and step == args.timeline_range[1]:
            opt.timeline = False  # a phase still running keeps recording until it ends
        opt.zero_grad()
        info = opt.last_step or {}
        if loss_scale:
            if info.get("skipped"):
                loss_scale /= 2
                good = 0
            else:
                good += 1
                if good == 1000:
                    loss_scale *= 2
                    good = 0
        lv = float(loss.detach())
        t3 = time.perf_counter()
        rec = dict(step=step, loss=lv, lr=lr, fwd_bwd_seconds=t1 - t0, opt_seconds=t2 - t1,
                   phase_seconds=t2 - t1, tokens_per_s=tokens / (t3 - t0),
                   grad_norm=info.get("grad_norm"), skipped=bool(info.get("skipped")),
                   speculated=0, redone=0, hidden_params=0)
        if args.optimizer == "dos":
            record_phase(rec, info)
            infos.append((rec, info))
        if timed:
            spans.append(dict(step=step, forward=(t0, t_fwd), backward=(t_fwd, t1), step_call=(t1, t2)))
        records.append(rec)
        if step % args.print_every == 0 or step == 1 or step == args.steps:
            if args.optimizer != "dos":
                extra = ""
            elif info.get("running"):
                extra = " phase running on into the next forward"
            else:
                extra = f" phase {rec['phase_seconds']:.4f} s"
            if "subgroups_cpu" in rec:
                extra += f" (subgroups cpu {rec['subgroups_cpu']} gpu {rec['subgroups_gpu']}"
                if rec.get("tail_bound"):
                    extra += f"; tail {rec['tail_bound']} bound, {rec['tail_moved']} moved"
                extra += ")"
            if info.get("speculated"):
                extra += f" speculated {info['speculated']} redone {info.get('redone', 0)}"
            gn = rec["grad_norm"]
            print(f"step {step:4d}  loss {lv:.4f}  tok/s {rec['tokens_per_s']:9.0f}  fwd+bwd {t1 - t0:.4f} s  "
                  f"opt {t2 - t1:.4f} s{extra}  grad-norm {gn if gn is None else f'{gn:.3f}'}"
                  + ("  SKIPPED (inf/NaN gradients)" if rec["skipped"] else ""), flush=True)
        if args.time_limit and time.perf_counter() - t_start > args.time_limit and step < args.steps:
            print(f"time limit: stopping after step {step} of {args.steps} ({time.perf_counter() - t_start:.0f} s > "
                  f"--time-limit {args.time_limit:g})", flush=True)
            break
    if hasattr(opt, "wait"):
        opt.wait()  # the last phase, left running (--overlap forward/both)
    for rec, info in infos:  # figures of phases that ended after their step's record was made
        record_phase(rec, info)
    if args.timeline:
        write_timeline(args.timeline, spans, [(rec["step"], info) for rec, info in infos
                                              if args.timeline_range[0] <= rec["step"] <= args.timeline_range[1]])

    def median(v):
        v = sorted(v)
        return v[len(v) // 2] if v else float("nan")

    later = records[1:] if len(records) > 1 else records
    summary = dict(optimizer=args.optimizer, policy=args.policy if args.optimizer == "dos" else None,
                   overlap=args.overlap, compact_master=args.compact_master,
                   params=nparams, model=model_desc, corpus=corpus_desc, steps=len(records),
                   train_seconds=time.perf_counter() - t_start,
                   max_gpu_memory_gb=torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0,
                   first_loss=records[0]["loss"], last_loss=records[-1]["loss"],
                   median_opt_seconds=median([r["opt_seconds"] for r in later]),
                   median_phase_seconds=median([r["phase_seconds"] for r in later]),
                   median_tokens_per_s=median([r["tokens_per_s"] for r in later]),
                   median_fwd_bwd_seconds=median([r["fwd_bwd_seconds"] for r in later]),
                   redone_steps=sum(1 for r in records if r["redone"]),
                   skipped_steps=getattr(opt, "skipped_steps", 0), torch=torch.__version__, device=device.type,
                   dtype=args.dtype)
    print(f"summary: {args.optimizer}" + (f" (overlap {args.overlap})" if args.overlap != "off" else "")
          + f": loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f} over "
          f"{len(records)} steps; median (steps 2..) fwd+bwd {summary['median_fwd_bwd_seconds']:.4f} s, opt "
          f"{summary['median_opt_seconds']:.4f} s, update phase "
          f"{summary['median_phase_seconds']:.4f} s, {summary['median_tokens_per_s']:.0f} tokens/s; "
          f"{summary['skipped_steps']} skipped step(s)"
          + (f", {summary['redone_steps']} step(s) with speculative updates redone" if args.overlap != "off" else "")
          + (f"; peak GPU memory allocated by torch {summary['max_gpu_memory_gb']:.1f} GB" if cuda else ""), flush=True)
    if args.log_json:
        write_json(args.log_json, dict(args=vars(args), summary=summary, steps=records))
    result = dict(summary=summary, losses=[r["loss"] for r in records], records=records, model=model, optimizer=opt)
    return result


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
