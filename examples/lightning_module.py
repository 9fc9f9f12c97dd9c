#!/usr/bin/env python3
"""Train a small causal language model with PyTorch Lightning, the optimizer being
``DeepOptimizerStates`` (``--optimizer dos``) or ``torch.optim.AdamW`` for comparison.

The optimizer is handed over as Lightning's documentation says: returned, with its learning-rate
scheduler, by the module's ``configure_optimizers`` (``{"optimizer": ..., "lr_scheduler":
{"scheduler": ..., "interval": "step"}}``), over :func:`param_groups_no_decay`'s groups (no weight
decay for norms and biases). Everything else is Lightning's: gradient clipping
(``gradient_clip_val``), gradient accumulation (``accumulate_grad_batches``), precision
(``--precision bf16-mixed``, ``bf16-true`` or ``32-true``), a checkpoint at the end of every epoch
(``ModelCheckpoint``) and ``--resume`` from one (``trainer.fit(..., ckpt_path=...)``).

The model is Hugging Face's ``LlamaForCausalLM`` or ``GPT2LMHeadModel`` from a config (``--model
llama|gpt2``, needs ``transformers``) or ``examples/train_gpt.py``'s GPT-2-style model (``--model
builtin``), randomly initialised, over byte-level tokens (vocabulary 256). The text is the running
Python's standard library sources (``--corpus`` picks other files), cut into windows of
``--seq-len`` bytes. An epoch is ``--epoch-steps`` optimizer steps over the same windows in the same
order (no shuffling), so that a run resumed from an end-of-epoch checkpoint sees the batches of the
run that never stopped. When ``--steps`` is a multiple of ``--epoch-steps`` the Trainer is bounded by
epochs (``max_epochs``), not steps: bounded by ``max_steps``, Lightning restarts from an end-of-epoch
checkpoint as if in the middle of an epoch, and with gradient accumulation its first optimizer step
then took a single micro-batch (seen on the GPU machine with Lightning 2.6: 19 micro-batches where
the uninterrupted run had 20, the second already different).

    PYTHONPATH=python DOS_C_LIBRARY=build/libdos_c.so \\
        python3 examples/lightning_module.py --model llama --optimizer dos --policy dos \\
        --precision bf16-mixed --steps 100

``--log-json FILE`` writes the loss of every micro-batch (``micro_losses``), the checkpoints and a
summary.
"""

import argparse
import math
import os
import sys

try:
    import torch
except ImportError:  # a Python without torch (pyenv's first on PATH?): say so, not a traceback
    sys.exit("lightning_module.py needs PyTorch: run it with a Python that imports torch (Debian: /usr/bin/python3 "
             "with python3-torch)")
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)

import hf_trainer  # noqa: E402
import train_gpt  # noqa: E402
from dos_number_text import whole_arg  # noqa: E402

try:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
except ImportError:
    try:
        import pytorch_lightning as L
        from pytorch_lightning.callbacks import ModelCheckpoint
    except ImportError:
        L = None


def lr_factor(step, warmup, total):
    """Multiplier of the base lr at optimizer step ``step`` (0-based): linear warm-up over
    ``warmup`` steps, then cosine decay to 0 at ``total`` (the ``get_cosine_schedule_with_warmup``
    shape of ``transformers``)."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))


def build_model(args):
    """The model ``args.model`` names (random initialisation, fp32, CPU)."""
    if args.model == "builtin":
        return train_gpt.GPT(args.n_layer, args.hidden, args.heads, args.seq_len)
    return hf_trainer.make_model(args.model, args.n_layer, args.hidden, args.heads, args.seq_len)


def next_byte_loss(model, input_ids):
    """Mean cross-entropy (fp32 scalar, nats) of predicting byte t+1 from bytes <= t over a batch
    of ``input_ids`` (int64, (B, T)), with a Hugging Face model (``.logits``) or the builtin one."""
    out = model(input_ids=input_ids) if hasattr(model, "config") else model(input_ids)
    logits = out.logits if hasattr(out, "logits") else out
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1))


if L is not None:
    class LitLM(L.LightningModule):
        """A causal language model trained by Lightning with the optimizer ``args.optimizer`` names."""

        def __init__(self, args):
            super().__init__()
            self.args = args
            self.model = build_model(args)
            self.micro_losses = []

        def training_step(self, batch, batch_idx):
            """Loss of one micro-batch (recorded in ``micro_losses`` as a float)."""
            loss = next_byte_loss(self.model, batch["input_ids"])
            self.micro_losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self):
            """The optimizer over param_groups_no_decay's groups and its per-step scheduler."""
            opt = hf_trainer.make_optimizer(self.args, self.model)
            a = self.args
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, a.warmup, a.steps))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def parse_args(argv=None):
    """The command line (``argv``, default sys.argv) as an argparse.Namespace; ``--help`` lists it."""
    ap = hf_trainer.add_common_args(argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                                            formatter_class=argparse.RawDescriptionHelpFormatter))
    ap.add_argument("--model", choices=["llama", "gpt2", "builtin"], default="llama")
    ap.add_argument("--epoch-steps", type=whole_arg, default=0, help="optimizer steps per epoch (0: --steps / 2)")
    ap.add_argument("--precision", choices=["32-true", "bf16-mixed", "bf16-true"], default="32-true")
    ap.add_argument("--output-dir", default="lightning_out", help="checkpoints go to OUTPUT_DIR/checkpoints")
    ap.add_argument("--resume", help="a checkpoint (.ckpt) to resume from, or 'last' (the newest in the folder)")
    args = ap.parse_args(argv)
    hf_trainer.check_common_args(ap, args)
    if args.epoch_steps < 0:
        ap.error("--epoch-steps must be >= 0")
    args.epoch_steps = args.epoch_steps or max(1, args.steps // 2)
    return args


def main(argv=None):
    """Trains as the arguments say; returns a dict: ``micro_losses`` (list of floats, one per
    micro-batch of this run), ``final_params_sha256`` (see ``hf_trainer.params_digest``),
    ``checkpoints`` and ``summary``. Exits with an error when Lightning is not installed, or
    ``--resume last`` finds no checkpoint."""
    args = parse_args(argv)
    if L is None:
        sys.exit("lightning_module.py needs PyTorch Lightning (pip install lightning)")
    ckdir = os.path.join(args.output_dir, "checkpoints")
    resume = args.resume
    if resume == "last":
        found = sorted((os.path.join(ckdir, f) for f in os.listdir(ckdir) if f.endswith(".ckpt")),
                       key=os.path.getmtime) if os.path.isdir(ckdir) else []
        if not found:
            sys.exit(f"--resume last: no checkpoint in {ckdir}")
        resume = found[-1]
    L.seed_everything(args.seed)
    data, corpus_desc = train_gpt.load_corpus(args.corpus, args.corpus_glob, int(args.corpus_mb * 1e6))
    windows = hf_trainer.ByteWindows(data, args.seq_len)
    per_epoch = args.epoch_steps * args.grad_accum * args.batch_size
    if len(windows) < per_epoch:
        sys.exit(f"the corpus holds {len(windows)} windows of {args.seq_len} bytes, an epoch needs {per_epoch}: "
                 "raise --corpus-mb or lower --epoch-steps")
    dataset = torch.utils.data.Subset(windows, range(per_epoch))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=False, num_workers=0)
    module = LitLM(args)
    use_cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
    ckpt = ModelCheckpoint(dirpath=ckdir, filename="{epoch}-{step}", every_n_epochs=1, save_top_k=-1,
                                       save_on_train_epoch_end=True)
    # bounded by whole epochs when it can be (see the module's docstring)
    whole_epochs = args.steps % args.epoch_steps == 0
    bounds = dict(max_epochs=args.steps // args.epoch_steps, max_steps=-1) if whole_epochs else dict(max_steps=args.steps)
    trainer = L.Trainer(accelerator="cpu" if use_cpu else "gpu", devices=1, **bounds,
                        precision=args.precision, gradient_clip_val=args.max_grad_norm or None,
                        gradient_clip_algorithm="norm", accumulate_grad_batches=args.grad_accum,
                        callbacks=[ckpt], logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=args.output_dir)
    nparams = sum(p.numel() for p in module.parameters())
    print(f"lightning_module: {type(module.model).__name__}, {args.n_layer} layers, hidden {args.hidden}, "
          f"{nparams:,} parameters; optimizer {args.optimizer}" + (f" (policy {args.policy})" if args.optimizer == "dos"
                                                                   else "")
          + f"; precision {args.precision}; batch {args.batch_size} x {args.grad_accum} micro-batches x {args.seq_len} "
          f"bytes, {args.epoch_steps} steps per epoch; corpus {corpus_desc}; lightning {L.__version__}, "
          f"torch {torch.__version__}" + (f"; resuming from {resume}" if resume else ""), flush=True)
    trainer.fit(module, train_dataloaders=loader, ckpt_path=resume)
    ml = module.micro_losses
    ckpts = sorted(f for f in os.listdir(ckdir) if f.endswith(".ckpt")) if os.path.isdir(ckdir) else []
    opt = trainer.optimizers[0] if trainer.optimizers else None
    summary = dict(optimizer=args.optimizer, policy=args.policy if args.optimizer == "dos" else None,
                   model=type(module.model).__name__, params=nparams, steps=trainer.global_step,
                   micro_batches=len(ml), precision=args.precision, resumed_from=resume, checkpoints=ckpts,
                   skipped_steps=getattr(opt, "skipped_steps", 0), lightning=L.__version__, torch=torch.__version__)
    result = dict(summary=summary, micro_losses=ml, checkpoints=[os.path.join(ckdir, c) for c in ckpts],
                  final_params_sha256=hf_trainer.params_digest(module.model))
    return hf_trainer.finish(args, result, opt, trainer.global_step)


if __name__ == "__main__":
    sys.exit(hf_trainer.exit_status(main()))
