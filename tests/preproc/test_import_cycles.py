"""The preprocessing modules import each other one way only (no cycle to dodge with late imports)."""
import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

PREPROC = Path(__file__).resolve().parents[2] / "preproc"


def _is_module(name):
    path = PREPROC / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(module):
    """preproc modules (dotted below preproc: "movielens.format") named by any import statement of
    preproc/<module path>.py (top level or in functions)."""
    tree = ast.parse((PREPROC / f"{module.replace('.', '/')}.py").read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("preproc"):
            base = node.module.partition(".")[2]
            out.add(base or None)
            out.update(name for name in (f"{base}.{a.name}".lstrip(".") for a in node.names) if _is_module(name))
        elif isinstance(node, ast.Import):
            out.update(a.name.partition(".")[2] for a in node.names if a.name.startswith("preproc."))
    out.discard(None)
    return out


@pytest.mark.parametrize("pipeline,generator", [("movielens.cli", "movielens.generate"),
                                                ("outbrain.cli", "outbrain.generate")])
def test_generator_does_not_import_its_pipeline(pipeline, generator):
    assert pipeline not in _imports(generator)
    # the pipeline uses the generator (its `generate` stage) with a plain top-level import
    assert generator in _imports(pipeline)
    dataset = pipeline.partition(".")[0]
    shared = f"{dataset}.format" if dataset == "movielens" else f"{dataset}.tables"
    assert shared in _imports(generator) and shared in _imports(pipeline)
