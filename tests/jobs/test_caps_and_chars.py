"""Issue 43 item 7, two of its one-line refusals: an array far past the cluster's MaxArraySize
(`--array 10000000` rendered 9,991 chunked jobs a real run would submit) and a profile value
holding a C1 control character or a Unicode line/paragraph separator (sbatch read a partition
holding U+2028 as another name). Both are refused before anything is rendered. All fast but the
last, which reads the limit from the local Slurm cluster."""

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from jobs.errors import RequestError
from jobs.planning.plan import MAX_ARRAY_CHUNKS, plan
from jobs.planning.request import JobRequest
from jobs.profiles import ProfileError, load_profile
from submit_helpers import ci_raw

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("isolated_profile_search_path")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO, **(env or {})), timeout=120)


@pytest.mark.fast
def test_an_array_past_the_chunk_cap_is_refused_in_one_line_naming_the_flag_and_the_limit():
    env = {"RECSYS_MAX_ARRAY_SIZE": "1001"}     # what `scontrol show config` says on the ci cluster
    proc = _cli("render", "benchmark", "--profile", "ci", "--model", "hello", "--nodes", "1", "--array", "10000000",
                env=env)
    limit = MAX_ARRAY_CHUNKS * 1001
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout[:300]
    assert proc.stderr.splitlines() == [
        f"recsys-submit: error: --array 10000000: at most {limit} tasks ({MAX_ARRAY_CHUNKS} jobs of the cluster's "
        "MaxArraySize 1001); ask for fewer tasks or give each task more work"]


@pytest.mark.fast
def test_arrays_up_to_the_cap_are_still_split_and_preprocess_shards_are_capped_too():
    profile = load_profile("ci")
    _, specs = plan([JobRequest(kind="benchmark", model="hello", nodes=1, array=MAX_ARRAY_CHUNKS * 3)], profile,
                    max_array_size=3)
    assert len(specs) == MAX_ARRAY_CHUNKS and sum(s.array_size for s in specs) == MAX_ARRAY_CHUNKS * 3
    shards = JobRequest(kind="preprocess", dataset="criteo", preprocess_mode="array", shards=MAX_ARRAY_CHUNKS * 3 + 1,
                        input="/raw", output="/out")
    with pytest.raises(RequestError, match=r"^--shards 31: at most 30 tasks "):
        plan([shards], profile, max_array_size=3)


@pytest.mark.fast
@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85", "\x80", "\x9f"], ids=ascii)
def test_c1_controls_and_line_separators_in_a_profile_value_are_refused(tmp_path, char):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(dict(ci_raw(), partition=f"gpu{char}x")))
    assert yaml.safe_load(path.read_text())["partition"] == f"gpu{char}x"      # YAML hands it over intact
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    what = "line separator" if char in "\u2028\u2029" else "control character"
    assert str(info.value) == (f"{path}: partition: has the {what} {char!r} (a value that reaches the job "
                               "script must be printable text on one line)")
    proc = _cli("profiles", "validate", str(path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"recsys-submit: error: {info.value}"]


@pytest.mark.fast
def test_printable_non_ascii_profile_values_still_load(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(dict(ci_raw(), account="équipe\u00a0ü"), allow_unicode=True))
    assert load_profile(str(path)).account == "équipe\u00a0ü"


@pytest.mark.slurm
def test_the_array_cap_is_the_clusters_max_array_size_read_once(slurm_cluster, tmp_path):
    """The limit comes from the cluster (`scontrol show config`, asked once), not the profile."""
    real = shutil.which("scontrol", path=slurm_cluster.env["PATH"])
    calls = tmp_path / "scontrol-calls"
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "scontrol").write_text(f"#!/bin/bash\necho \"$*\" >> '{calls}'\nexec '{real}' \"$@\"\n")
    (shim / "scontrol").chmod(0o755)
    env = dict(slurm_cluster.env, PATH=f"{shim}{os.pathsep}{slurm_cluster.env['PATH']}", PYTHONPATH=REPO)
    env.pop("RECSYS_MAX_ARRAY_SIZE", None)
    size = slurm_cluster.run(["scontrol", "show", "config"]).stdout.split("MaxArraySize")[1].split()[1]
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "render", "benchmark", "--profile", "ci", "--model",
                           "hello", "--nodes", "1", "--array", "10000000"], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"recsys-submit: error: --array 10000000: at most {MAX_ARRAY_CHUNKS * int(size)} tasks ({MAX_ARRAY_CHUNKS} "
        f"jobs of the cluster's MaxArraySize {size}); ask for fewer tasks or give each task more work"]
    assert calls.read_text().splitlines() == ["show config"]
