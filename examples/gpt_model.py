"""The corpus and the model of ``train_gpt.py`` (and of the Hugging Face Trainer and Lightning
examples that reuse them): byte-level text read from files into one tensor, batches drawn from it
reproducibly, and a GPT-2-style causal language model (the small one defined here, or Hugging Face
``transformers``' GPT2LMHeadModel), with the blocks that ``overlap_forward`` waits on. See
``train_gpt.py``'s docstring for the corpus's default and how batches are drawn."""

import fnmatch
import math
import os
import sysconfig

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 256  # byte-level tokens

# ---------------------------------------------------------------------------------------------
# corpus


def load_corpus(paths, glob, max_bytes):
    """Reads text files into one ``torch.uint8`` tensor of at most ``max_bytes`` bytes.

    paths: list of files or folders (None or []: the running Python's standard library folder);
    folders are walked recursively for files matching ``glob``, in sorted path order.
    Returns (data, description). Raises ``ValueError`` when fewer than 4096 bytes are found.
    """
    if not paths:
        paths = [sysconfig.get_paths()["stdlib"]]
        glob = "*.py"
    files = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, names in os.walk(p):
                dirs.sort()
                for n in sorted(names):
                    if fnmatch.fnmatch(n, glob):
                        files.append(os.path.join(root, n))
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise ValueError(f"corpus path {p} does not exist")
    chunks, total, used = [], 0, 0
    for f in files:
        if total >= max_bytes:
            break
        try:
            with open(f, "rb") as fh:
                b = fh.read(max_bytes - total)
        except OSError:
            continue
        chunks.append(b + b"\n")
        total += len(b) + 1
        used += 1
    data = b"".join(chunks)[:max_bytes]
    if len(data) < 4096:
        raise ValueError(f"the corpus ({', '.join(paths)}, {glob}) holds only {len(data)} bytes")
    desc = f"{used} files matching {glob} under {', '.join(paths)}, {len(data) / 1e6:.2f} MB"
    return torch.frombuffer(bytearray(data), dtype=torch.uint8), desc


def get_batch(data, step, batch, seq_len, seed, device):
    """Batch of step ``step``: ``batch`` random windows of ``seq_len + 1`` bytes (inputs, targets),
    int64 tensors of shape (batch, seq_len) on ``device``; the same for the same (seed, step)."""
    g = torch.Generator()
    g.manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch,), generator=g)
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    w = data[idx].long()
    return w[:, :-1].to(device), w[:, 1:].to(device)


# ---------------------------------------------------------------------------------------------
# model


class Block(nn.Module):
    """One pre-LayerNorm transformer block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def attention(self, x):
        """Causal multi-head self-attention: (B, T, D) -> (B, T, D)."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, D))

    def forward(self, x):
        """(B, T, D) -> (B, T, D)."""
        x = x + self.attention(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """GPT-2-style decoder over byte tokens: input (B, T) int64 -> logits (B, T, 256)."""

    def __init__(self, n_layer, n_embd, n_head, seq_len):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, n_embd)
        self.wpe = nn.Embedding(seq_len, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        # GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        """Token ids (B, T) int64, T <= seq_len -> logits (B, T, 256), the model's dtype."""
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied output head


def make_model(kind, n_layer, n_embd, n_head, seq_len):
    """The model (random initialisation, fp32 on the CPU) and its description. kind: ``auto``
    (transformers' GPT-2 if importable, else the builtin), ``hf`` or ``builtin``."""
    if kind in ("auto", "hf"):
        try:
            from transformers import GPT2Config, GPT2LMHeadModel
        except ImportError:
            if kind == "hf":
                raise
        else:
            cfg = GPT2Config(vocab_size=VOCAB, n_positions=seq_len, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
            m = GPT2LMHeadModel(cfg)
            return _HFWrapper(m), "transformers GPT2LMHeadModel"
    return GPT(n_layer, n_embd, n_head, seq_len), "builtin GPT-2-style model"


class _HFWrapper(nn.Module):
    """transformers' model behind the builtin's interface (input ids -> logits)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, idx):
        """Token ids (B, T) int64 -> logits (B, T, 256)."""
        return self.m(input_ids=idx).logits


# ---------------------------------------------------------------------------------------------
# optimizers (the torch AdamW baselines: torch_adamw.py)


def overlap_blocks(model):
    """The blocks whose forward reads only their own parameters, in forward order, for
    ``DeepOptimizerStates.overlap_forward``: for the builtin model the position embedding, each
    transformer block and the final norm (the token embedding is left to the root, whose forward
    also reads its weight as the tied output head); for transformers' GPT-2 what
    ``deep_optimizer_states.forward_blocks`` finds. Raises ``ValueError`` for another model."""
    if isinstance(model, GPT):
        return [model.wpe] + list(model.blocks) + [model.ln_f]
    if isinstance(model, _HFWrapper):
        from deep_optimizer_states import forward_blocks
        return forward_blocks(model.m)
    raise ValueError(f"overlap_blocks: no blocks known for {type(model).__name__}")
