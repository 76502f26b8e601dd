"""The preprocessing modules import each other one way only (no cycle to dodge with late imports)."""
import ast
from pathlib import Path

import pytest

PREPROC = Path(__file__).resolve().parents[2] / "preproc"


def _imports(module):
    """preproc modules named by any import statement of preproc/<module>.py (top level or in functions)."""
    tree = ast.parse((PREPROC / f"{module}.py").read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("preproc"):
            out.add(node.module.split(".")[1] if "." in node.module else None)
            if node.module == "preproc":
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("preproc."))
    out.discard(None)
    return out


@pytest.mark.parametrize("pipeline,generator", [("movielens", "generate_movielens"),
                                                ("outbrain", "generate_outbrain")])
def test_generator_does_not_import_its_pipeline(pipeline, generator):
    assert pipeline not in _imports(generator)
    # the pipeline uses the generator (its `generate` stage) with a plain top-level import
    assert generator in _imports(pipeline)
    shared = f"{pipeline}_format" if pipeline == "movielens" else f"{pipeline}_tables"
    assert shared in _imports(generator) and shared in _imports(pipeline)
