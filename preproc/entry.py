"""The ``recsys-preproc`` console script: on an install without the [preproc] extra (the
login-node ``pip install recsys-submit``), one line naming the extra, exit 2, instead of a
traceback from a dataset module's imports (issue 48). Imports only the standard library until
the check passes; Spark itself is needed only when a stage runs. On a Python or machine the extra
does not install on (:mod:`recsys.runtime.platforms`), the line names what is supported instead."""
from __future__ import annotations

import importlib.util
import sys
from typing import Optional, Sequence

from recsys.runtime.platforms import refusal, this_host

# What listing the datasets and their flags (`recsys-preproc --help`) imports from the extra.
NEEDS = ("numpy",)
HINT = "pip install 'recsys-submit[preproc]' (the NVTabular engine: 'recsys-submit[nvtabular]')"
# Where the extra does not install: what to do instead.
ELSEWHERE = ("make the venv with Python 3.11 (python3.11 -m venv), or preprocess in the Spark image "
             "(cluster_profiles/images/spark-rapids.Dockerfile)")


def missing(modules: Sequence[str] = NEEDS) -> Optional[str]:
    """The first of ``modules`` this Python cannot import (found without importing it), else None."""
    return next((name for name in modules if importlib.util.find_spec(name) is None), None)


def main() -> None:
    """``recsys-preproc``: the check, then :func:`preproc.cli.main`."""
    absent = missing()
    unsupported = refusal("recsys-preproc", ("preproc",), this_host(), ELSEWHERE) if absent else None
    if unsupported:
        print(unsupported, file=sys.stderr)
        raise SystemExit(2)
    if absent:
        print(f"recsys-preproc: error: this install lacks the preprocessing extra (no module {absent}): "
              f"{HINT}", file=sys.stderr)
        raise SystemExit(2)
    from preproc.cli import main as preproc_main
    sys.exit(preproc_main())
