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
