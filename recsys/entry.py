"""The ``recsys-train`` console script: on an install without the engine's extra (the login-node
``pip install recsys-submit``), one line naming the extra to install, exit 2, instead of a
traceback from deep inside the engine's imports (issue 48).

Imports nothing but the standard library until the check passes: the engine's flag parsing
already needs numpy (recsys.feature_spec); TensorFlow itself is checked later, by
:mod:`recsys.tfcompat`, before the engine imports it."""
from __future__ import annotations

import importlib.util
import sys
from typing import Optional, Sequence

# What `recsys-train --help` imports from the [train] / [gpu] extras.
NEEDS = ("numpy",)
HINT = "pip install 'recsys-submit[train]' (or 'recsys-submit[gpu]' on a bare-metal GPU node)"


def missing(modules: Sequence[str] = NEEDS) -> Optional[str]:
    """The first of ``modules`` this Python cannot import (found without importing it), else None."""
    return next((name for name in modules if importlib.util.find_spec(name) is None), None)


def train() -> None:
    """``recsys-train``: the check, then :func:`recsys.train.program`."""
    absent = missing()
    if absent:
        print(f"recsys-train: error: this install lacks the training engine's extra (no module {absent}): "
              f"{HINT}", file=sys.stderr)
        raise SystemExit(2)
    from recsys.train import program
    program()
