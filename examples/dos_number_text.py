"""The package's number readers (``python/deep_optimizer_states/number_text.py``) for the scripts
beside this file, loaded by path: importing the package would import torch, which some of them
(``timeline_summary.py``, ``dos_compare.py``) do not need. ``number_text`` is that module;
``decimal_arg`` and ``whole_arg`` are its argparse types (strict numbers: no blanks, underscores,
``inf`` or ``nan``)."""

import importlib.util
import os

HERE = os.path.dirname(os.path.realpath(__file__))


def _load():
    """The module at ``../python/deep_optimizer_states/number_text.py`` (relative to this file),
    executed under the name ``dos_number_text_impl``. Raises ``FileNotFoundError`` when the file is
    missing (this file copied out of the repository without it)."""
    path = os.path.join(HERE, "..", "python", "deep_optimizer_states", "number_text.py")
    spec = importlib.util.spec_from_file_location("dos_number_text_impl", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


number_text = _load()
decimal_arg = number_text.decimal_arg
whole_arg = number_text.whole_arg
