"""The architecture as a test (docs/architecture.md): the import-linter contracts in setup.cfg hold
for the whole tree, imports inside functions included; an upward import breaks them; and loading
a cluster profile, which is data, imports no module of the execution layer."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("jobs", "recsys", "preproc", "slurm", "cluster_profiles")
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root):
    if not LINT.exists():
        pytest.skip("import-linter is not installed (pip install '.[dev]')")
    env = {"PATH": str(LINT.parent), "PYTHONPATH": str(root), "LC_ALL": "C.UTF-8"}
    return subprocess.run([str(LINT), "setup.cfg", "--no-cache", "--no-logo"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    proc = _lint(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BROKEN" not in proc.stdout and " 0 broken" in proc.stdout, proc.stdout


@pytest.fixture
def tree(tmp_path):
    """A copy of the packages and setup.cfg, to break on purpose."""
    root = tmp_path / "tree"
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "setup.cfg", root / "setup.cfg")
    return root


@pytest.mark.parametrize("module,source,contract", [
    # a profile module importing the CLI: data reaching up to the top layer
    ("jobs/profiles/upward.py", "from jobs.cli import main\n", "jobs: one-way layers"),
    # the same kind of upward import, hidden inside a function, still counts
    ("jobs/runs/late.py", "def submit_again():\n    from jobs.submit import submit\n    return submit\n",
     "jobs: one-way layers"),
    # the CLI going around the API (added to the CLI module itself)
    ("jobs/cli/job_commands.py", "\n\ndef _shortcut():\n    from jobs.status import poll\n    return poll\n",
     "jobs: the CLI goes through jobs.api"),
    # running a study reaching into its analysis (issue 44 item 2), inside a function
    ("jobs/study/running/screen.py", "\n\ndef _table():\n    from jobs.study.analysis.report_table import markdown\n"
     "    return markdown\n", "jobs.study: analysing a study"),
    # the engine knowing the submission layer
    ("recsys/knows_jobs.py", "def f():\n    import jobs.api\n", "the engines and the in-job helpers"),
])
def test_an_upward_import_breaks_a_contract(tree, module, source, contract):
    path = tree / module
    path.write_text((path.read_text() if path.exists() else "") + source)
    proc = _lint(tree)
    assert proc.returncode != 0, proc.stdout
    broken = proc.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, proc.stdout


def test_loading_a_profile_imports_no_module_of_the_execution_layer():
    code = ("import json, sys\nfrom jobs.profiles import load_profile\nload_profile('local')\n"
            "print(json.dumps(sorted(m for m in sys.modules if m == 'jobs' or m.startswith('jobs.'))))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert "jobs.profiles.loader" in loaded and "jobs.profiles.schema" in loaded
    execution = ("jobs.api", "jobs.cli", "jobs.submit", "jobs.status", "jobs.study", "jobs.planning",
                 "jobs.backends", "jobs.runs")
    assert [m for m in loaded if m.startswith(execution)] == [], loaded


@pytest.mark.fast
def test_every_error_the_toolkit_raises_on_purpose_has_one_base():
    """Issue 44 item 4: one base class (slurm.common.errors.ToolkitError, exported as jobs.api.ToolkitError)
    for the submission layer's, the profiles', the YAML reader's and the preprocessing's errors,
    each keeping its builtin base for callers that catch that."""
    from jobs import api
    from jobs.errors import SlurmCommandError, StorageError, SubmitError
    from jobs.study.spec import StudyError
    from preproc.errors import OutputError, PreprocError
    from recsys.errors import DataError, DivergedError, EngineError
    from recsys.features.spec import FeatureSpecError
    from recsys.placement.planner import PlacementError
    from slurm.common.errors import ToolkitError
    from slurm.common.yamlfile import YamlFileError

    assert api.ToolkitError is ToolkitError
    for cls, builtin in ((api.RequestError, ValueError), (StudyError, ValueError), (api.ProfileError, ValueError),
                         (SubmitError, RuntimeError), (SlurmCommandError, RuntimeError),
                         (StorageError, RuntimeError), (YamlFileError, ValueError), (PreprocError, ValueError),
                         (OutputError, ValueError), (FeatureSpecError, ValueError), (PlacementError, ValueError),
                         (EngineError, Exception), (DataError, Exception), (DivergedError, Exception)):
        assert issubclass(cls, ToolkitError) and issubclass(cls, builtin), cls
