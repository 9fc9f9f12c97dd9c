"""Numbers in what people type: a plain decimal (``parse_decimal``) and a count of elements
(``parse_count``), the rule of the C++ side's ``dos::is_decimal_number`` (``models/number_text.h``):
what float() also takes (blanks around, underscores, hexadecimal, inf, nan) is refused. The same
rules as argparse types for command lines (``decimal_arg``, ``whole_arg``), and the baselines'
variants with their numbers (``baseline_variant``: ``twinflow:R``, ``stride:K``), read here so that
a script without torch checks them as the baselines do. No torch, no state."""

import argparse
import decimal
import math
import re

# A decimal number as a person writes it (the C++ side's dos::is_decimal_number): an optional sign,
# digits with at most one '.', an optional exponent; no blanks, underscores, hexadecimal, inf or nan,
# which float() would take.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def is_decimal_number(text):
    """Whether ``text`` (a str) is a plain decimal number, all of it (``_DECIMAL``); False for
    non-str values."""
    return isinstance(text, str) and _DECIMAL.fullmatch(text) is not None


def parse_decimal(text):
    """``text`` (a str) as a float when it is a plain decimal number (``"0.5"``, ``"-1e-9"``,
    ``".25"``), else ``None``: blanks around it, ``"0.2_5"``, ``"0x10"``, ``"inf"``, ``"nan"`` and
    non-str values give ``None``, as do values beyond a float's range either way (``"1e400"``, and
    ``"1e-400"``, which float() reads as 0)."""
    if not is_decimal_number(text):
        return None
    v = float(text)
    mantissa = re.split("[eE]", text)[0]
    if not math.isfinite(v) or (v == 0 and re.search("[1-9]", mantissa)):
        return None
    return v


def parse_count(text, what):
    """'1.24e8', '1000' (a plain decimal, ``parse_decimal``), an int or a whole float -> a positive
    int; a text below 1e30 is read exactly ('9007199254740993.0' is 2**53 + 1, not the float's
    2**53). Raises ``ValueError`` naming ``what`` for anything else, a value below 1 or one that is
    not whole."""
    if isinstance(text, bool):
        v = None
    elif isinstance(text, int):
        v = text
    elif isinstance(text, float):
        v = text if math.isfinite(text) else None
    else:
        v = parse_decimal(text)
        if v is not None and abs(v) < 1e30:
            v = decimal.Decimal(text)  # exact, where a float would round 2**53 + 1 (also '9007199254740993.0')
    if v is None:
        raise ValueError(f"{what} must be a positive number of elements (e.g. 1e6), got {text!r}")
    if not (v >= 1 and v == math.floor(v)):
        raise ValueError(f"{what} must be a positive whole number of elements, got {text!r}")
    return int(v)


def baseline_variant(variant):
    """The baselines' variant ``variant`` (a str) as (kind, value): ``("zero_offload", None)``,
    ``("twinflow", R)`` with R the CPU share of the subgroups (DeepSpeed's ratio), a plain decimal in
    [0, 1] (a float), or ``("stride", K)`` with K a whole number >= 1 written with the digits 0-9 (an
    int). Raises ``ValueError`` naming the variant and what its number must be for anything else."""
    name, colon, arg = variant.partition(":")
    if name == "zero_offload" and not colon:
        return name, None
    if name == "twinflow" and colon:
        r = parse_decimal(arg)
        if r is None or not 0 <= r <= 1:
            raise ValueError(f"variant {variant!r}: R in twinflow:R is the CPU share of the subgroups "
                             f"(DeepSpeed's ratio), a number in [0, 1]")
        return name, r
    if name == "stride" and colon:
        if not re.fullmatch(r"[0-9]+", arg) or int(arg) < 1:
            raise ValueError(f"variant {variant!r}: K in stride:K is a whole number >= 1")
        return name, int(arg)
    raise ValueError(f"unknown variant {variant!r}: use zero_offload, twinflow:R (R the CPU share) or stride:K")


def decimal_arg(text):
    """An argparse ``type=``: ``text`` (a str) as a float when it is a plain decimal number
    (``parse_decimal``). Raises ``argparse.ArgumentTypeError`` (argparse prints it after the
    option's name and exits with status 2) for anything else: blanks, underscores, hexadecimal,
    ``inf``, ``nan`` and values beyond a float's range. Ranges are the caller's to check."""
    v = parse_decimal(text)
    if v is None and is_decimal_number(text):
        raise argparse.ArgumentTypeError(f"{text!r} is beyond what a float holds (too large, or too small to tell "
                                         f"from 0)")
    if v is None:
        raise argparse.ArgumentTypeError(
            f"expected a plain decimal number such as 0.5, 3 or 1e-8 (no blanks, underscores, inf or nan), "
            f"got {text!r}")
    return v


def whole_arg(text):
    """An argparse ``type=``: ``text`` (a str) of ASCII digits with an optional sign (``"12"``,
    ``"-5"``) as an int. Raises ``argparse.ArgumentTypeError`` for anything else (``" 5"``,
    ``"1_000"``, ``"1.0"``, ``"1e3"``, digits of other scripts, which int() takes). Ranges are the
    caller's to check. Also raises it for a number longer than Python converts (4300 digits by
    default)."""
    if not isinstance(text, str) or re.fullmatch(r"[+-]?[0-9]+", text) is None:
        raise argparse.ArgumentTypeError(f"expected a whole number written with the digits 0-9, got {text!r}")
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        raise argparse.ArgumentTypeError(f"a whole number of {len(text)} characters is too long") from None
