"""The ``recsys-train`` console script: on an install without the engine's extra (the login-node
``pip install recsys-submit``), one line naming the extra to install, exit 2, instead of a
traceback from deep inside the engine's imports (issue 48).

Imports nothing but the standard library until the check passes: the engine's flag parsing
already needs numpy (recsys.features.spec); TensorFlow itself is checked later, by
:mod:`recsys.runtime.tfcompat`, before the engine imports it. On a Python or machine the extras do not
install on (:mod:`recsys.runtime.platforms`: setup.cfg's markers leave TensorFlow out there), a missing
numpy or TensorFlow is refused naming what is supported instead (issue 48 item 3)."""
from __future__ import annotations

import importlib.util
import sys
from typing import Optional, Sequence

from recsys.runtime.platforms import Host, refusal, this_host

# What `recsys-train --help` imports from the [train] / [gpu] extras.
NEEDS = ("numpy",)
HINT = "pip install 'recsys-submit[train]' (or 'recsys-submit[gpu]' on a bare-metal GPU node)"
# Where neither extra installs: what to do instead.
ELSEWHERE = ("run the engine in an NGC TensorFlow container (docs/dgx.md), or on x86_64 make the venv "
             "with Python 3.11 (bash install/user-env.sh --python python3.11)")


def missing(modules: Sequence[str] = NEEDS) -> Optional[str]:
    """The first of ``modules`` this Python cannot import (found without importing it), else None."""
    return next((name for name in modules if importlib.util.find_spec(name) is None), None)


def platform_error(host: Host) -> Optional[str]:
    """The refusal for ``host`` when numpy or TensorFlow is missing and no extra installs them there."""
    if missing((*NEEDS, "tensorflow")) is None:
        return None
    return refusal("recsys-train", ("train", "gpu"), host, ELSEWHERE)


def train() -> None:
    """``recsys-train``: the checks, then :func:`recsys.train.program`."""
    unsupported = platform_error(this_host())
    if unsupported:
        print(unsupported, file=sys.stderr)
        raise SystemExit(2)
    absent = missing()
    if absent:
        print(f"recsys-train: error: this install lacks the training engine's extra (no module {absent}): "
              f"{HINT}", file=sys.stderr)
        raise SystemExit(2)
    from recsys.train import program
    program()
