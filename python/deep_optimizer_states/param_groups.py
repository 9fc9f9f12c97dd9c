"""Param groups with no weight decay for normalisation layers and biases, built as the Hugging Face
``Trainer`` builds them for its own optimizer (``Trainer.get_decay_parameter_names``), so that a
``DeepOptimizerStates`` handed to the Trainer (or returned by a Lightning module's
``configure_optimizers``) decays the same parameters as the optimizer the Trainer would have made::

    from deep_optimizer_states import DeepOptimizerStates, param_groups_no_decay

    opt = DeepOptimizerStates(param_groups_no_decay(model, weight_decay=0.1), lr=3e-4)

A parameter gets no weight decay when it belongs to a normalisation layer (``nn.LayerNorm``,
``nn.GroupNorm``, the batch and instance norms, or any module whose class name contains ``Norm``,
such as Llama's ``LlamaRMSNorm`` or ``nn.RMSNorm``), at any depth, or when its name, lowercased,
matches one of :data:`NO_DECAY_NAME_PATTERNS` (``bias``, ``layernorm``, ``rmsnorm``, a module
called ``norm`` or ending in ``_norm``). Every other parameter that requires gradients is decayed.

Also :func:`group_hyper`, the check of one param group's hyper-parameters that the optimizer runs
at construction, at every step and on loading a state dict.
"""

import math
import re
import struct

import torch

#: The largest float32 (the runtime computes in fp32: a larger lr, eps or weight decay overflows).
_FLT_MAX = 3.4028234663852886e38
#: torch.optim.AdamW's options DeepOptimizerStates takes at their defaults only (check_adamw_options).
_UNSUPPORTED = ("amsgrad", "maximize", "capturable", "differentiable", "fused")

#: Regular expressions searched in each lowercased parameter name: a match means no weight decay
#: (the patterns of the Hugging Face Trainer's ``get_decay_parameter_names``).
NO_DECAY_NAME_PATTERNS = (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")

_NORM_TYPES = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.modules.batchnorm._BatchNorm,
               torch.nn.modules.instancenorm._InstanceNorm, torch.nn.LocalResponseNorm)


def _is_norm(module):
    return isinstance(module, _NORM_TYPES) or "Norm" in type(module).__name__


def no_decay_parameter_names(model):
    """Names (as ``model.named_parameters()`` gives them) of the parameters that get no weight decay.

    Arguments:
      model (torch.nn.Module): the model. Every parameter is considered, trainable or not; a
        parameter shared by two modules (tied weights) appears once, under its first name.

    Returns a set of str. Raises ``TypeError`` when ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    patterns = [re.compile(p) for p in NO_DECAY_NAME_PATTERNS]
    modules = dict(model.named_modules())
    out = set()
    for name, _ in model.named_parameters():
        parts = name.split(".")[:-1]
        owners = [modules.get(".".join(parts[:i])) for i in range(1, len(parts) + 1)]
        if any(m is not None and _is_norm(m) for m in owners) or any(p.search(name.lower()) for p in patterns):
            out.add(name)
    return out


def _finite_nonneg(name, value):
    """``value`` as a float; ``ValueError`` naming ``name`` unless it is a finite number >= 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not (v >= 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def param_groups_no_decay(model, weight_decay, lr=None):
    """The param groups of ``model``'s trainable parameters for ``torch.optim``-style optimizers:
    first the parameters to decay, with ``weight_decay``; then the normalisation layers' parameters
    and the biases (see :func:`no_decay_parameter_names`), with weight decay 0.

    Arguments:
      model (torch.nn.Module): the model; parameters with ``requires_grad=False`` are left out
        (as the Trainer does); a tied parameter appears once.
      weight_decay (float): >= 0, finite; the decoupled (AdamW) or L2 (Adam) coefficient of the
        first group.
      lr (float or None): when given (>= 0, finite), the learning rate of both groups; otherwise
        the groups take the optimizer's ``lr``.

    Returns a list of 1 or 2 dicts ``{"params": [Parameter, ...], "weight_decay": float[, "lr":
    float]}`` in ``model.named_parameters()`` order within each group; an empty group is left out.
    Raises ``TypeError`` when ``model`` is not a ``torch.nn.Module``, ``ValueError`` for a negative
    or non-finite ``weight_decay`` or ``lr``, or when the model has no trainable parameter.
    """
    names = no_decay_parameter_names(model)  # raises TypeError first
    wd = _finite_nonneg("weight_decay", weight_decay)
    lr = None if lr is None else _finite_nonneg("lr", lr)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if name in names else decay).append(p)
    if not decay and not no_decay:
        raise ValueError("the model has no parameter that requires gradients: nothing to optimize")
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if lr is not None:
        for g in groups:
            g["lr"] = lr
    return groups


def check_adamw_options(where, options):
    """Raises ``ValueError`` when ``options`` (a dict: the constructor's keywords or a param group)
    holds one of ``torch.optim.AdamW``'s options that change what or how torch computes
    (``amsgrad``, ``maximize``, ``capturable``, ``differentiable``, ``fused``) at a true value;
    they are taken at their defaults only (``foreach``, an implementation choice, at any value).
    ``where`` (str) starts the message (e.g. ``"param group 0: "``)."""
    for k in _UNSUPPORTED:
        if options.get(k):
            raise ValueError(f"{where}{k}={options[k]!r} is not supported by DeepOptimizerStates (it runs its own "
                             f"AdamW kernels): leave {k} out or set it to {None if k == 'fused' else False}")


def groups_layout(param_groups):
    """Each group's parameters, by identity: a list of tuples of ``id``s (what
    :func:`check_groups_unchanged` compares)."""
    return [tuple(id(p) for p in g["params"]) for g in param_groups]


def check_groups_unchanged(param_groups, built):
    """Raises ``ValueError`` (changing nothing) when ``param_groups`` (an optimizer's list of group
    dicts) no longer holds the groups and parameters of ``built`` (:func:`groups_layout` at
    construction), in that order: a group appended or removed, a parameter appended to, removed
    from or replaced in a group's ``"params"``. DeepOptimizerStates lays the runtime's state out
    once, for the parameters it was given, and would go on updating those while the parameters now
    listed were silently left alone."""
    now = groups_layout(param_groups)
    if now == built:
        return
    if len(now) != len(built):
        what = f"{len(now)} param groups, where it was built with {len(built)}"
    else:
        gi = next(i for i, (a, b) in enumerate(zip(now, built)) if a != b)
        what = (f"param group {gi} lists {len(now[gi])} parameters, not the {len(built[gi])} it was built with"
                if len(now[gi]) != len(built[gi]) else f"param group {gi} lists other parameters than it was built with")
    raise ValueError(f"param_groups was edited after construction: {what}. DeepOptimizerStates lays out the runtime's "
                     "state once, for the parameters it was given; to train other parameters, create a new optimizer "
                     "over all of them (load_state_dict carries a saved state over to the same groups). Nothing was "
                     "updated")


def default_weight_decay_by_mode(param_groups, wd_given):
    """Gives each group that left ``weight_decay`` out its own mode's default: 1e-2 for AdamW
    (``decoupled`` True, ``torch.optim.AdamW``'s), 0 for Adam. ``param_groups``: the optimizer's
    groups (defaults filled in); ``wd_given``: per item the caller gave, in order, whether its dict
    set ``weight_decay`` (None for a tensor: the caller gave tensors, one group, and the
    constructor's default stands)."""
    if len(wd_given) != len(param_groups) or None in wd_given:
        return
    for group, given in zip(param_groups, wd_given):
        if not given and isinstance(group.get("decoupled"), bool):
            group["weight_decay"] = 1e-2 if group["decoupled"] else 0.0


def group_hyper(gi, group):
    """Validates a group's hyper-parameters as torch.optim.AdamW does; returns them as the tuple
    (lr, beta1, beta2, eps, weight_decay, decoupled). Raises ValueError naming the bad value."""
    check_adamw_options(f"param group {gi}: ", group)
    try:
        lr = float(group["lr"])
        b1, b2 = (float(b) for b in group["betas"])
        eps = float(group["eps"])
        wd = float(group["weight_decay"])
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"param group {gi}: malformed hyper-parameters ({e})") from None
    if not (lr >= 0 and math.isfinite(lr)):
        raise ValueError(f"param group {gi}: invalid learning rate: {lr}")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"param group {gi}: invalid epsilon value: {eps}")
    if not 0.0 <= b1 < 1.0:
        raise ValueError(f"param group {gi}: invalid beta parameter at index 0: {b1}")
    if not 0.0 <= b2 < 1.0:
        raise ValueError(f"param group {gi}: invalid beta parameter at index 1: {b2}")
    if not (wd >= 0 and math.isfinite(wd)):
        raise ValueError(f"param group {gi}: invalid weight_decay value: {wd}")
    for name, v in (("learning rate", lr), ("epsilon", eps), ("weight_decay", wd), ("lr x weight_decay", lr * wd),
                    ("the first step's step size lr / (1 - beta1)", lr / (1 - b1))):
        if v > _FLT_MAX:
            raise ValueError(f"param group {gi}: {name} {v:g} overflows float32 (at most 3.4e38), in which the "
                             "update is computed: every parameter would become inf or NaN")
    if eps > 0 and struct.unpack("f", struct.pack("f", eps))[0] == 0.0:
        raise ValueError(f"param group {gi}: epsilon {eps:g} rounds to 0 in float32, in which the update is computed "
                         "(the smallest positive float32 is 1.4e-45, which values from about 7.1e-46 round to): a zero "
                         "gradient would make its parameters NaN; give eps=0 deliberately or a value of at least 1e-45")
    decoupled = group.get("decoupled", True)
    if not isinstance(decoupled, bool):
        raise ValueError(f"param group {gi}: decoupled must be True (AdamW) or False (Adam), got {decoupled!r}")
    return (lr, b1, b2, eps, wd, decoupled)
