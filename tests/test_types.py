"""Issue 44 item 4: the type checker (mypy, `[dev]`; settings in setup.cfg's [mypy]) passes on the
submission layer, jobs/, and on the engine's configuration and planning modules (the configuration,
the model defaults and table list, the placement and its two commands), in the fast tier: their
annotated functions are checked on every change."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast
REPO = Path(__file__).resolve().parents[1]
CHECKED = ["jobs", "recsys/configuration", "recsys/placement", "recsys/models/defaults.py",
           "recsys/models/embedding_tables.py", "recsys/place_tables.py", "recsys/plan_tables.py"]


def test_mypy_passes_on_the_submission_layer_and_the_engine_planning():
    res = subprocess.run([sys.executable, "-m", "mypy", *CHECKED], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert "No module named mypy" not in res.stderr, "mypy is part of [dev]: pip install -c install/constraints.txt '.[dev]'"
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "Success: no issues found" in res.stdout


def test_every_public_function_of_the_api_is_annotated():
    """jobs.api is what a program calls: every public function says what it takes and returns
    (mypy then checks their bodies above), the records by their classes."""
    import inspect

    from jobs import api

    missing = []
    for name, obj in vars(api).items():
        if name.startswith("_") or not inspect.isfunction(obj) or obj.__module__ != "jobs.api":
            continue
        sig = inspect.signature(obj)
        if sig.return_annotation is inspect.Signature.empty:
            missing.append(f"{name}: return")
        missing += [f"{name}: {p.name}" for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
    assert not missing, missing
    assert inspect.signature(api.status).return_annotation == "StatusResult"
