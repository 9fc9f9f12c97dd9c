"""Deep Optimizer States for PyTorch: ``torch.optim.AdamW`` (or ``Adam``) with the optimizer state
offloaded to pinned host memory and each subgroup's update placed on the CPU or streamed through
the GPU by the runtime's scheduling policy (Maurya et al., arXiv 2410.21316).

    import torch
    from deep_optimizer_states import DeepOptimizerStates

    model = MyModel().to("cuda", torch.bfloat16)
    opt = DeepOptimizerStates(model.parameters(), lr=3e-4, weight_decay=0.1, policy="dos",
                              max_grad_norm=1.0)
    for batch in data:
        loss = model(batch).loss
        loss.backward()
        opt.step()            # one update phase on the runtime; opt.last_step says what it did
        opt.zero_grad()

The binding loads the runtime's C library (``libdos_c.so``, built by the project's Meson build)
with ctypes and hands it raw pointers, so it does not depend on torch's C++ ABI: the same library
serves Debian's torch 1.13 and pip's CUDA torch 2.x. See ``DOS_C_LIBRARY`` in :mod:`._capi` for
where the library is looked up.

Public names: :class:`DeepOptimizerStates`, :func:`get_runtime`, :func:`current_runtime`,
:func:`shutdown`, :class:`DosError`, :class:`StepStats`, :data:`STATE_FORMAT`,
:func:`param_groups_no_decay` and :func:`no_decay_parameter_names` (no weight decay for
normalisation layers and biases, as the Hugging Face Trainer groups them),
:data:`NO_DECAY_NAME_PATTERNS`.
"""

from ._capi import DosError, StepStats, library_path
from .forward import forward_blocks
from .optimizer import STATE_FORMAT, DeepOptimizerStates
from .param_groups import NO_DECAY_NAME_PATTERNS, no_decay_parameter_names, param_groups_no_decay
from .runtime import current_runtime, get_runtime, shutdown

__all__ = [
    "DeepOptimizerStates",
    "DosError",
    "NO_DECAY_NAME_PATTERNS",
    "STATE_FORMAT",
    "StepStats",
    "current_runtime",
    "forward_blocks",
    "get_runtime",
    "library_path",
    "no_decay_parameter_names",
    "param_groups_no_decay",
    "shutdown",
]
