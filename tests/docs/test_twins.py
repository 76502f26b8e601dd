"""The docs test's twin profiles and pyxis stand-in (tests/docs/twins.py, tests/pyxis_standin):
the `twin` directive's scope, a twin's container against the built-in's, the host-path rewrite,
and the stand-in's srun line and mount namespace. No cluster: docs/dgx.md's walk-through in
tests/docs/test_examples.py runs them for real."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from jobs.profiles import load_profile, mounts
from tests.docs.examples import extract
from tests.docs.twins import STANDIN, make_twin, rewrite_host_paths

pytestmark = pytest.mark.fast
REPO = Path(__file__).resolve().parents[2]


def test_twin_line_applies_to_the_blocks_after_it():
    text = ("```bash\necho before\n```\n<!-- docs-test: twin dgxa100-pod -->\n"
            "<!-- docs-test: skip: pod -->\n```bash\necho skipped\n```\n```bash\necho after\n```\n")
    before, skipped, after = extract(Path("x.md"), text)
    assert before.twins == () and skipped.twins == after.twins == ("dgxa100-pod",)
    assert skipped.mode == "skip" and after.mode == "run"


def test_dgx_walkthrough_runs_under_the_twin():
    blocks = [b for b in extract(REPO / "docs" / "dgx.md") if b.twins]
    run = [b for b in blocks if b.mode == "run"]
    # the spark profile is twinned too: its own image file lies under the twin's root (a submission
    # checks that a profile's image file is there)
    assert run and all(b.twins == ("dgxa100-pod", "dgxa100-pod-spark") for b in blocks)
    text = "".join(b.text for b in run)
    for command in ("recsys-submit preprocess --profile dgxa100-pod-spark", "recsys-submit train --profile dgxa100-pod",
                    "recsys-submit evaluate --profile dgxa100-pod", "--data-path /data/", "--checkpoint-dir /checkpoints/"):
        assert command in text


def test_twin_keeps_the_container_and_moves_the_host_sides(tmp_path, monkeypatch):
    builtin = yaml.safe_load((REPO / "cluster_profiles" / "dgxa100-pod.yaml").read_text())
    twin = make_twin("dgxa100-pod", tmp_path / "pod")
    (tmp_path / "twins").mkdir()
    (tmp_path / "twins" / "dgxa100-pod.yaml").write_text(twin.text)
    monkeypatch.setenv("RECSYS_PROFILE_PATH", str(tmp_path / "twins"))
    monkeypatch.setattr("jobs.profiles.loader.USER_PROFILE_DIR", tmp_path / "no-user-dir")
    pod, spark, ci = load_profile("dgxa100-pod"), load_profile("dgxa100-pod-spark"), load_profile("ci")
    assert pod.container.image == twin.host_map[builtin["container"]["image"]] == twin.files[0]
    assert pod.container.provides == builtin["container"]["provides"]
    sides = [m.split(":", 1) for m in builtin["container"]["mounts"]]
    assert [mounts.Mount.parse(m).container for m in pod.container.mounts] == [c for _, c in sides]
    assert twin.host_map["/lustre/datasets"] == str(tmp_path / "pod" / "lustre" / "datasets")
    assert mounts.to_host(pod, "/data/criteo/x") == str(tmp_path / "pod" / "lustre" / "datasets" / "criteo" / "x")
    assert (pod.partition, pod.node, pod.max_nodes) == (ci.partition, ci.node, ci.max_nodes)
    assert pod.setup and str(STANDIN) in pod.setup[0]
    # the built-in spark profile extends the twin by name: its own image, the twin's mounts
    assert spark.container.image == "/lustre/images/recsys-spark-3.5.sqsh" and "spark" in spark.container.provides
    assert spark.container.mounts == pod.container.mounts and spark.node == ci.node
    # the image files move under the root with the mounts' host sides (the docs test creates them)
    derived = make_twin("dgxa100-pod-spark", tmp_path / "pod")
    assert twin.files == [str(tmp_path / "pod" / "lustre" / "images" / "tensorflow+23.12-tf2-py3.sqsh")]
    assert derived.files == [str(tmp_path / "pod" / "lustre" / "images" / "recsys-spark-3.5.sqsh")]
    (tmp_path / "twins" / "dgxa100-pod-spark.yaml").write_text(derived.text)
    moved = load_profile("dgxa100-pod-spark")
    assert moved.container.image == derived.files[0] and moved.container.mounts == pod.container.mounts


def test_host_paths_rewritten_as_whole_components():
    host_map = {"/lustre/datasets": "/tmp/t/lustre/datasets"}
    text = "ls /lustre/datasets/x --out=/lustre/datasets '/lustre/datasets' /lustre/datasets2 /a/lustre/datasets\n"
    assert rewrite_host_paths(text, host_map) == (
        "ls /tmp/t/lustre/datasets/x --out=/tmp/t/lustre/datasets '/tmp/t/lustre/datasets' /lustre/datasets2 "
        "/a/lustre/datasets\n")


def _standin(tmp_path, *argv):
    """The stand-in's srun with a recording srun next on PATH; the argv the real one got."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "srun").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SRUN_ARGV"\n')
    (real / "srun").chmod(0o755)
    env = dict(os.environ, PATH=f"{STANDIN}:{real}:/usr/bin:/bin", SRUN_ARGV=str(tmp_path / "argv"))
    subprocess.run(["srun", *argv], env=env, check=True)
    return (tmp_path / "argv").read_text().splitlines()


def test_standin_drops_container_flags_and_enters_the_mounts(tmp_path):
    got = _standin(tmp_path, "--mpi=pmix", "-N", "1", "--container-image=img", "--container-name=recsys-1",
                   "--container-mounts=/h:/data,/c:/c:ro", "--container-workdir=/run", "--container-env=A,B",
                   "bash", "container-entry.sh", "python", "-m", "x")
    assert got == ["--mpi=pmix", "-N", "1", "bash", str(STANDIN / "enter.sh"), "/h:/data,/c:/c:ro", "/run", "--",
                   "bash", "container-entry.sh", "python", "-m", "x"]


def test_standin_passes_plain_steps_through(tmp_path):
    argv = ["--overlap", "--ntasks=1", "python3", "hwsample.py", "--out", "x"]
    assert _standin(tmp_path, *argv) == argv


@pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")
def test_enter_binds_mounts_in_a_private_namespace(tmp_path):
    host, ro_src, inside, ro_dst = (tmp_path / n for n in ("host", "code", "inside", "code-in"))
    host.mkdir()
    ro_src.mkdir()
    (host / "f").write_text("data")
    script = 'cat "$0/f"; echo; pwd; touch "$1/x" 2>/dev/null && echo writable || echo read-only'
    out = subprocess.run(["bash", str(STANDIN / "enter.sh"), f"{host}:{inside},{ro_src}:{ro_dst}:ro", str(tmp_path),
                          "--", "bash", "-c", script, str(inside), str(ro_dst)],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["data", str(tmp_path), "read-only"]
    # the mount point was made on the host, empty, and nothing leaked out of the namespace
    assert inside.is_dir() and list(inside.iterdir()) == [] and list(ro_src.iterdir()) == []
