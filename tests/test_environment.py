"""Issue 44 item 5: every `RECSYS_*` variable is declared once (slurm/common/environment.py) with its
meaning, and listed in one docs table (docs/environment.md). Scans the tracked files."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from slurm.common.environment import KINDS, NOT_VARIABLES, VARIABLES, markdown_table

pytestmark = pytest.mark.fast
REPO = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\bRECSYS_[A-Z0-9_]*")
PRODUCT = ("jobs/", "recsys/", "preproc/", "slurm/", "cluster_profiles/", "install/")
DECLARATION = "slurm/common/environment.py"


def _names_by_file() -> dict:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    out = {}
    for name in files:
        path = REPO / name
        if name in (DECLARATION, "tests/test_environment.py") or not path.is_file() or path.is_symlink():
            continue
        try:
            found = set(NAME.findall(path.read_text(errors="ignore")))
        except OSError:
            continue
        if found:
            out[name] = found
    return out


def test_every_name_the_tree_reads_or_documents_is_declared():
    undeclared = {f"{n} ({f})" for f, names in _names_by_file().items() for n in names
                  if n not in VARIABLES and n not in NOT_VARIABLES}
    assert not undeclared, f"declare these in {DECLARATION}: {sorted(undeclared)}"


def test_every_declared_name_is_used_and_test_tooling_stays_out_of_the_product():
    by_file = _names_by_file()
    used = set().union(*by_file.values())
    assert not sorted(set(VARIABLES) - used), "declared but used nowhere"
    in_product = {n for f, names in by_file.items() if f.startswith(PRODUCT) for n in names}
    leaked = sorted(n for n in in_product if n in VARIABLES and VARIABLES[n].kind == "test tooling")
    assert not leaked, f"test tooling read by the product: {leaked}"
    assert all(v.kind in KINDS and v.meaning and v.read_by for v in VARIABLES.values())


def test_the_docs_table_is_the_declarations():
    text = (REPO / "docs" / "environment.md").read_text()
    table = text.split("<!-- BEGIN environment table -->\n", 1)[1].split("<!-- END environment table -->", 1)[0]
    assert table == markdown_table(), ("docs/environment.md is stale: python -c 'from slurm.common.environment import "
                                       "markdown_table; print(markdown_table(), end=\"\")'")
