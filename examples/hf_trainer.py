#!/usr/bin/env python3
"""Train a small Hugging Face causal language model with the ``transformers`` Trainer, the optimizer
being ``DeepOptimizerStates`` (``--optimizer dos``) or ``torch.optim.AdamW`` for comparison.

The optimizer is handed over as the Trainer's documentation says, ``Trainer(...,
optimizers=(optimizer, lr_scheduler))``, built over :func:`param_groups_no_decay`'s groups (no weight
decay for norms and biases: the groups the Trainer makes for its own optimizer) with the scheduler
from ``transformers.get_scheduler``. Everything else is the Trainer's: gradient clipping
(``max_grad_norm``), gradient accumulation, bf16 mixed precision (``--bf16``: ``bf16=True``),
checkpoints every ``--save-steps`` steps and ``--resume`` from one (``trainer.train(
resume_from_checkpoint=...)``).

The model is ``LlamaForCausalLM`` (``--model llama``) or ``GPT2LMHeadModel`` (``--model gpt2``) from a
config, randomly initialised, over byte-level tokens (vocabulary 256). The text is the running
Python's standard library sources, as in ``examples/train_gpt.py`` (``--corpus`` picks other
files): cut into windows of ``--seq-len`` bytes, which the Trainer's sampler shuffles (seeded by
``--seed``).

    PYTHONPATH=python DOS_C_LIBRARY=build/libdos_c.so \\
        python3 examples/hf_trainer.py --model llama --optimizer dos --policy dos --bf16 --steps 100

``--log-json FILE`` writes the loss of every micro-batch (``micro_losses``, the value the Trainer
back-propagates) and of every logged step, the checkpoint folders and a summary.

Speed: the summary gives the Trainer's ``train_samples_per_second`` (its whole ``train()``, the first
steps included) and the steady rate (micro-batches per step x batch over the median seconds from
one optimizer step's end to the next's, the first step left out). ``--optimizer adamw-cpu-offload``
is ZeRO-Offload's recipe re-created in PyTorch (``deep_optimizer_states.zero_offload.ZeroOffloadAdamW``:
fp32 master parameters and Adam state in host memory, torch's CPU AdamW; its copies run after
backward, not during it, and its CPU update is not DeepSpeed's CPU Adam), the run to compare with. ``--gpu-memory-gb G`` caps torch's share of the GPU at G GB
(``torch.cuda.set_per_process_memory_fraction``), which makes a model whose optimizer state does
not fit beside it on such a GPU: a run that runs out of memory ends with exit status 3 and
``out_of_memory`` in its summary. The cap covers torch's allocations only; the runtime's own device
buffers (``dos``) are bounded by ``--gpu-update-budget-gb`` and counted in the summary's
``device_memory_used_gb`` (the whole device's use at the end, from ``torch.cuda.mem_get_info``). ``scripts/gpu-trainer-speed.sh`` runs the comparison.

``--overlap`` (with ``--optimizer dos``) overlaps the update with backward
(``DeepOptimizerStates(overlap=True)``, the same bits) and moves the clipping from the Trainer into
the optimizer (the same formula): the Trainer's ``clip_grad_norm_`` writes every gradient in place
even when it does not clip, which would make every speculative update be redone. The summary then
counts the steps whose speculative updates were kept and redone. ``--clip-in optimizer`` without
``--overlap`` is the run it gives the same bits as.
"""

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import time
import traceback

try:
    import torch
except ImportError:  # a Python without torch (pyenv's first on PATH?): say so, not a traceback
    sys.exit("hf_trainer.py needs PyTorch: run it with a Python that imports torch (Debian: /usr/bin/python3 "
             "with python3-torch)")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)

from train_gpt import budget_bytes, check_hyper_args, load_corpus, subgroup_elements  # noqa: E402
from dos_number_text import decimal_arg, whole_arg  # noqa: E402

VOCAB = 256  # byte-level tokens


class ByteWindows(torch.utils.data.Dataset):
    """Non-overlapping windows of ``seq_len`` bytes of ``data`` (a 1-D torch.uint8 tensor), as
    ``{"input_ids": int64 (seq_len,), "labels": int64 (seq_len,)}`` (the model shifts the labels)."""

    def __init__(self, data, seq_len):
        self.data = data
        self.seq_len = seq_len

    def __len__(self):
        return self.data.numel() // self.seq_len

    def __getitem__(self, i):
        w = self.data[i * self.seq_len:(i + 1) * self.seq_len].long()
        return {"input_ids": w, "labels": w.clone()}


def params_digest(model):
    """SHA-256 (hex str) of every parameter's bytes, in ``model.parameters()`` order, read in the
    parameters' own dtype on the CPU: equal digests mean bit-identical parameters."""
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.detach().cpu().contiguous()
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def make_model(kind, n_layer, hidden, heads, seq_len):
    """A randomly initialised ``LlamaForCausalLM`` (kind ``llama``) or ``GPT2LMHeadModel`` (``gpt2``)
    over 256 byte tokens, fp32 on the CPU. Raises ``ValueError`` for another kind."""
    import transformers
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=4 * hidden,
                                       num_hidden_layers=n_layer, num_attention_heads=heads,
                                       num_key_value_heads=heads, max_position_embeddings=seq_len)
        return transformers.LlamaForCausalLM(cfg)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=seq_len, n_embd=hidden, n_layer=n_layer,
                                      n_head=heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return transformers.GPT2LMHeadModel(cfg)
    raise ValueError(f"unknown model {kind!r}: llama or gpt2")


def make_optimizer(args, model, clip_in_optimizer=False):
    """The optimizer ``args.optimizer`` names over ``param_groups_no_decay(model, args.weight_decay)``:
    ``DeepOptimizerStates`` (AdamW, policy ``args.policy``, the update overlapped with backward when
    ``args.overlap``), ``ZeroOffloadAdamW`` (``adamw-cpu-offload``: ZeRO-Offload's recipe) or
    ``torch.optim.AdamW``. Clipping is left to the framework (``max_grad_norm``)
    unless ``clip_in_optimizer``: then ``DeepOptimizerStates`` clips to ``args.max_grad_norm`` itself
    (the same formula), and the caller turns the framework's clipping off."""
    from deep_optimizer_states import DeepOptimizerStates, param_groups_no_decay
    groups = param_groups_no_decay(model, args.weight_decay)
    kw = dict(lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    if args.optimizer == "dos":
        clip = args.max_grad_norm if clip_in_optimizer and args.max_grad_norm > 0 else None
        return DeepOptimizerStates(groups, decoupled=True, policy=args.policy, max_grad_norm=clip,
                                   subgroup_size=args.subgroup_elements,
                                   overlap=bool(getattr(args, "overlap", False)),
                                   flat_gradients=not getattr(args, "no_flat_gradients", False),
                                   gpu_update_budget=getattr(args, "gpu_update_budget_bytes", None), **kw)
    if args.optimizer == "adamw-cpu-offload":
        from deep_optimizer_states.zero_offload import ZeroOffloadAdamW
        return ZeroOffloadAdamW(groups, **kw)
    return torch.optim.AdamW(groups, **kw)


def add_common_args(ap):
    """Adds to the argparse parser ``ap`` the options both framework examples share (optimizer,
    policy, model size, batch, schedule, AdamW's hyper-parameters, clipping, device, corpus, seed,
    log); returns ``ap``."""
    ap.add_argument("--optimizer", choices=["dos", "adamw", "adamw-cpu-offload"], default="dos",
                    help="dos: DeepOptimizerStates; adamw: torch.optim.AdamW on the model's device; "
                         "adamw-cpu-offload: ZeRO-Offload's recipe (fp32 state in host memory, CPU AdamW)")
    ap.add_argument("--policy", default="dos", help="the runtime's scheduling policy (cpu, gpu, dos, static:R, dmda...)")
    ap.add_argument("--n-layer", type=whole_arg, default=2)
    ap.add_argument("--hidden", type=whole_arg, default=64)
    ap.add_argument("--heads", type=whole_arg, default=4)
    ap.add_argument("--seq-len", type=whole_arg, default=64)
    ap.add_argument("--batch-size", type=whole_arg, default=8, help="per micro-batch")
    ap.add_argument("--grad-accum", type=whole_arg, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--steps", type=whole_arg, default=40, help="optimizer steps")
    ap.add_argument("--lr", type=decimal_arg, default=3e-3)
    ap.add_argument("--warmup", type=whole_arg, default=5)
    ap.add_argument("--beta1", type=decimal_arg, default=0.9)
    ap.add_argument("--beta2", type=decimal_arg, default=0.95)
    ap.add_argument("--eps", type=decimal_arg, default=1e-8)
    ap.add_argument("--weight-decay", type=decimal_arg, default=0.1, help="for all but norms and biases")
    ap.add_argument("--max-grad-norm", type=decimal_arg, default=1.0, help="the framework's clipping (0: none)")
    ap.add_argument("--subgroup-size", default="1e8", help="elements per subgroup (dos)")
    ap.add_argument("--overlap", action="store_true",
                    help="dos: overlap the update with backward (DeepOptimizerStates(overlap=True); the same bits)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--corpus", action="append", help="text file or folder (repeatable); default: the Python "
                    "standard library's .py files")
    ap.add_argument("--corpus-glob", default="*", help="file-name pattern in corpus folders")
    ap.add_argument("--corpus-mb", type=decimal_arg, default=2.0)
    ap.add_argument("--seed", type=whole_arg, default=1234)
    ap.add_argument("--log-json", help="write the losses, checkpoints and a summary to this JSON file")
    return ap


def check_common_args(ap, args):
    """Exits through ``ap.error`` (status 2, the option named) when a value of ``add_common_args``
    in ``args`` is out of range: a size or count below 1 (``--warmup`` below 0), a ``--heads`` that
    does not divide ``--hidden``, what ``train_gpt.check_hyper_args`` refuses (a ``--seed`` outside
    [0, 2**32), a learning rate, ``--eps``, weight decay or clipping norm below 0, a beta outside
    [0, 1)), a ``--corpus-mb`` not above 0, or a
    ``--subgroup-size`` that is not a whole number of elements in [1, 2**53]; then sets
    ``args.subgroup_elements`` (int) from ``--subgroup-size``."""
    for flag, value, least in (("--n-layer", args.n_layer, 1), ("--hidden", args.hidden, 1),
                               ("--heads", args.heads, 1), ("--seq-len", args.seq_len, 1),
                               ("--batch-size", args.batch_size, 1), ("--grad-accum", args.grad_accum, 1),
                               ("--steps", args.steps, 1), ("--warmup", args.warmup, 0)):
        if value < least:
            ap.error(f"{flag} must be a whole number >= {least}, got {value}")
    if args.hidden % args.heads:
        ap.error(f"--heads {args.heads} must divide --hidden {args.hidden} (each head takes hidden / heads)")
    check_hyper_args(ap, args)
    if not args.corpus_mb > 0:
        ap.error(f"--corpus-mb must be a number of MB > 0, got {args.corpus_mb}")
    args.subgroup_elements = subgroup_elements(ap, args.subgroup_size)


def finish(args, result, opt, global_step):
    """Prints the summary line of ``result`` (a dict with ``micro_losses``), writes it with the
    arguments to ``--log-json`` when given, closes ``opt`` when it has ``close``; returns
    ``result``."""
    ml = result["micro_losses"]
    if ml:
        print(f"summary: {args.optimizer}: micro-batch loss {ml[0]:.4f} -> {ml[-1]:.4f} over {len(ml)} "
              f"micro-batches, global step {global_step}", flush=True)
    if args.log_json:
        with open(args.log_json, "w") as f:
            json.dump(dict(args=vars(args), **result), f, indent=1)
    if hasattr(opt, "close"):
        opt.close()
    return result


def exit_status(result):
    """3 when the run ran out of GPU memory (``summary["out_of_memory"]``), else 0 when it recorded
    losses and all are finite, else 1."""
    if result.get("summary", {}).get("out_of_memory"):
        return 3
    ml = result["micro_losses"]
    return 0 if ml and all(math.isfinite(x) for x in ml) else 1


def parse_args(argv=None):
    """The command line (``argv``, default sys.argv) as an argparse.Namespace; ``--help`` lists it."""
    ap = add_common_args(argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                                 formatter_class=argparse.RawDescriptionHelpFormatter))
    ap.add_argument("--model", choices=["llama", "gpt2"], default="llama")
    ap.add_argument("--schedule", choices=["cosine", "linear", "constant_with_warmup"], default="cosine")
    ap.add_argument("--bf16", action="store_true", help="bf16 mixed precision (the Trainer's bf16=True)")
    ap.add_argument("--output-dir", default="hf_trainer_out")
    ap.add_argument("--save-steps", type=whole_arg, default=0, help="checkpoint every N steps (0: none)")
    ap.add_argument("--resume", help="a checkpoint folder to resume from, or 'last' (the newest in --output-dir)")
    ap.add_argument("--gpu-memory-gb", type=decimal_arg, default=0,
                    help="cap torch's share of the GPU at this many GB (0: no cap), to stand for a smaller GPU")
    ap.add_argument("--gpu-update-budget-gb", type=decimal_arg, default=0,
                    help="with --optimizer dos: GB of GPU memory the runtime's update phase may hold (0: no limit "
                         "but StarPU's own); beside --gpu-memory-gb, which caps torch's share only")
    ap.add_argument("--no-flat-gradients", action="store_true",
                    help="with --optimizer dos: leave the gradients where autograd puts them "
                         "(DeepOptimizerStates(flat_gradients=False)): no gradient memory between steps; not with "
                         "--overlap")
    ap.add_argument("--clip-in", choices=["framework", "optimizer"],
                    help="who clips to --max-grad-norm: the Trainer (default) or, with --optimizer dos, the optimizer "
                         "(the default with --overlap; the run to compare an overlapped one with)")
    args = ap.parse_args(argv)
    check_common_args(ap, args)
    if args.save_steps < 0:
        ap.error(f"--save-steps must be a whole number >= 0 (0: no checkpoints), got {args.save_steps}")
    if args.gpu_memory_gb < 0:
        ap.error(f"--gpu-memory-gb must be >= 0 (0: no cap), got {args.gpu_memory_gb}")
    args.gpu_update_budget_bytes = budget_bytes(ap, "--gpu-update-budget-gb", args.gpu_update_budget_gb,
                                                args.optimizer, least=1)
    if args.gpu_memory_gb and (args.device == "cpu" or not torch.cuda.is_available()):
        ap.error("--gpu-memory-gb caps a GPU's memory: it needs a CUDA device and --device auto or cuda")
    if args.clip_in is None:
        args.clip_in = "optimizer" if args.overlap and args.optimizer == "dos" else "framework"
    if args.clip_in == "optimizer" and args.optimizer != "dos":
        ap.error("--clip-in optimizer needs --optimizer dos")
    if args.clip_in == "framework" and args.overlap and args.optimizer == "dos":
        ap.error("--overlap with --clip-in framework: the Trainer's clip_grad_norm_ rewrites every gradient after "
                 "backward, so every speculative update would be redone; leave --clip-in out")
    if args.no_flat_gradients and (args.optimizer != "dos" or args.overlap):
        ap.error("--no-flat-gradients needs --optimizer dos without --overlap (the overlapped update declares "
                 "gradients final in the optimizer's own buffers)")
    return args


def main(argv=None):
    """Trains as the arguments say; returns a dict: ``micro_losses`` (list of floats, one per
    micro-batch of this run), ``step_losses`` (the Trainer's logged loss per step), ``summary``.
    Exits with an error when ``transformers`` is not installed."""
    args = parse_args(argv)
    try:
        import transformers
    except ImportError:
        sys.exit("hf_trainer.py needs the transformers package (pip install transformers accelerate)")
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class RecordingTrainer(Trainer):
        """The Trainer, noting the loss of every micro-batch (``compute_loss``'s value) in the list
        ``micro_losses``."""

        def compute_loss(self, model, inputs, *a, **kw):
            """Trainer.compute_loss, with its loss appended to ``micro_losses`` (float)."""
            out = super().compute_loss(model, inputs, *a, **kw)
            self.micro_losses.append(float((out[0] if isinstance(out, tuple) else out).detach()))
            return out

    class StepClock(TrainerCallback):
        """Notes ``time.perf_counter()`` (seconds) at the end of every optimizer step in ``ends``."""

        def __init__(self):
            self.ends = []

        def on_step_end(self, *a, **kw):
            self.ends.append(time.perf_counter())

    use_cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
    # With --overlap the optimizer clips: the Trainer's clip_grad_norm_ writes every gradient in place
    # even on steps where it does not clip, which makes every speculative update be redone.
    clip_in_optimizer = args.clip_in == "optimizer"
    targs = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum, learning_rate=args.lr, weight_decay=args.weight_decay,
        max_grad_norm=0.0 if clip_in_optimizer else args.max_grad_norm, bf16=args.bf16, use_cpu=use_cpu, seed=args.seed, data_seed=args.seed,
        logging_steps=1, save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
        report_to="none", dataloader_num_workers=0, disable_tqdm=True)
    transformers.set_seed(args.seed)
    if args.gpu_memory_gb and targs.device.type == "cuda":
        total = torch.cuda.get_device_properties(targs.device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.gpu_memory_gb * 1e9 / total), targs.device)
    data, corpus_desc = load_corpus(args.corpus, args.corpus_glob, int(args.corpus_mb * 1e6))
    dataset = ByteWindows(data, args.seq_len)
    model = make_model(args.model, args.n_layer, args.hidden, args.heads, args.seq_len)
    # the optimizer reads the parameters where they are when it is made: move the model first
    model.to(targs.device)
    opt = make_optimizer(args, model, clip_in_optimizer=clip_in_optimizer)
    sched = transformers.get_scheduler(args.schedule, optimizer=opt, num_warmup_steps=args.warmup,
                                       num_training_steps=args.steps)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"hf_trainer: {type(model).__name__}, {args.n_layer} layers, hidden {args.hidden}, {nparams:,} parameters "
          f"on {targs.device}; optimizer {args.optimizer}" + (f" (policy {args.policy})" if args.optimizer == "dos" else "")
          + f"; {'bf16 mixed precision' if args.bf16 else 'fp32'}; batch {args.batch_size} x {args.grad_accum} "
          f"micro-batches x {args.seq_len} bytes; corpus {corpus_desc}; transformers {transformers.__version__}, "
          f"torch {torch.__version__}", flush=True)
    trainer = RecordingTrainer(model=model, args=targs, train_dataset=dataset, optimizers=(opt, sched))
    trainer.micro_losses = []
    clock = StepClock()
    trainer.add_callback(clock)
    verdicts = {}
    if args.overlap and args.optimizer == "dos":  # what the overlap did, step by step
        def count_verdicts(o, *a, **kw):
            for v in (o.last_step or {}).get("verdicts", []):
                verdicts[str(v)] = verdicts.get(str(v), 0) + 1
        if hasattr(opt, "register_step_post_hook"):  # torch >= 2.0
            opt.register_step_post_hook(count_verdicts)
    resume = None
    if args.resume:
        resume = True if args.resume == "last" else args.resume
    oom = None
    metrics = {}
    try:
        metrics = trainer.train(resume_from_checkpoint=resume).metrics
    except torch.cuda.OutOfMemoryError as e:
        oom = str(e).split("\n")[0]
        where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                            for f in reversed(traceback.extract_tb(e.__traceback__)[-6:]))
        print(f"hf_trainer: out of GPU memory at global step {trainer.state.global_step}"
              + (f" under --gpu-memory-gb {args.gpu_memory_gb:g}" if args.gpu_memory_gb else "") + f": {oom}"
              + f"\nhf_trainer: where (innermost first): {where}", flush=True)
    per_step = args.batch_size * args.grad_accum
    gaps = [b - a for a, b in zip(clock.ends, clock.ends[1:])]
    step_s = statistics.median(gaps) if gaps else None
    cuda = targs.device.type == "cuda"
    if cuda:
        free, total = torch.cuda.mem_get_info(targs.device)
    step_losses = [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    ckpts = sorted(d for d in os.listdir(args.output_dir) if d.startswith("checkpoint-")) \
        if os.path.isdir(args.output_dir) else []
    summary = dict(optimizer=args.optimizer, policy=args.policy if args.optimizer == "dos" else None,
                   model=type(model).__name__, params=nparams, steps=trainer.state.global_step,
                   micro_batches=len(trainer.micro_losses), bf16=args.bf16, device=str(targs.device),
                   resumed_from=args.resume, checkpoints=ckpts,
                   skipped_steps=getattr(opt, "skipped_steps", 0), overlap=bool(getattr(opt, "overlap", False)),
                   overlap_verdicts=verdicts, transformers=transformers.__version__,
                   torch=torch.__version__, out_of_memory=oom, gpu_memory_cap_gb=args.gpu_memory_gb or None,
                   gpu_update_budget_gb=args.gpu_update_budget_gb or None,
                   train_samples_per_second=metrics.get("train_samples_per_second"),
                   train_runtime=metrics.get("train_runtime"), median_step_seconds=step_s,
                   steady_samples_per_second=per_step / step_s if step_s and not oom else None,
                   max_gpu_memory_gb=torch.cuda.max_memory_allocated(targs.device) / 1e9 if cuda else None,
                   device_memory_used_gb=(total - free) / 1e9 if cuda else None)
    if metrics and not oom:
        print(f"speed: {args.optimizer}: train_samples_per_second {metrics.get('train_samples_per_second')}"
              + (f", steady {per_step / step_s:.2f} samples/s ({step_s:.4f} s per step)" if step_s else "")
              + (f", peak torch GPU memory {summary['max_gpu_memory_gb']:.2f} GB, device in use "
                 f"{summary['device_memory_used_gb']:.2f} GB" if cuda else ""), flush=True)
    result = dict(summary=summary, micro_losses=trainer.micro_losses, step_losses=step_losses,
                  final_params_sha256=params_digest(model))
    return finish(args, result, opt, trainer.state.global_step)


if __name__ == "__main__":
    sys.exit(exit_status(main()))
