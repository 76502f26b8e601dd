"""Container paths (issue 34, items 6 and 7): the paths a container job is given are container
paths; the login node's checks, the lead-time warning and the requeue guard on the batch host look
at their host paths through the profile's mounts. Profiles here are written into tmp_path with
host directories in tmp_path, one with dgxa100-pod's container paths and one that renames them."""

import json
import os
import re
import subprocess

import pytest

from jobs.errors import RequestError
from jobs.planning.plan import plan
from jobs.planning.request import JobRequest
from jobs.planning.requeue import lead_time_warning
from jobs.profiles import ProfileError, load_profile
from jobs.profiles.mounts import to_container, to_host
from jobs.submit import render_plan

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("isolated_profile_search_path")]


def _profile(tmp_path, name, mounts, extra="", image=None):
    """dgxa100-pod with these mounts, and its image file in tmp_path (a submission checks that the
    profile's squashfs is there), or ``image`` (a registry reference) as given."""
    path = tmp_path / f"{name}.yaml"
    lines = "\n".join(f"    - {m}" for m in mounts)
    if image is None:
        image = tmp_path / "images" / "tensorflow+23.12-tf2-py3.sqsh"
        image.parent.mkdir(exist_ok=True)
        image.write_bytes(b"hsqs")
    path.write_text(f"extends: dgxa100-pod\ncontainer:\n  image: {image}\n  mounts:\n{lines}\n{extra}")
    return load_profile(str(path))


def _dataset(root):
    os.makedirs(root, exist_ok=True)
    (root / "feature_spec.yaml").write_text("")   # the submit-side check lists it, never parses it


@pytest.fixture
def renamed(tmp_path):
    """A site whose mounts rename everything: host `store/sets` is `/datasets` (read-only),
    host `store/ck` is `/ckpt` in the container."""
    store = tmp_path / "store"
    _dataset(store / "sets" / "criteo" / "parquet")
    (store / "ck").mkdir()
    return _profile(tmp_path, "renamed", [f"{store}/sets:/datasets:ro", f"{store}/ck:/ckpt"]), store


def test_docs_dgx_training_example_passes_the_submission_checks(tmp_path):
    """docs/dgx.md's `--data-path /data/criteo/parquet` with dgxa100-pod's mounts (hosts in tmp):
    refused before ('no such directory', the login node looked at /data), accepted now."""
    host = tmp_path / "lustre"
    _dataset(host / "datasets" / "criteo" / "parquet")
    (host / "checkpoints").mkdir()
    profile = _profile(tmp_path, "pod", [f"{host}/datasets:/data", f"{host}/checkpoints:/checkpoints"])
    request = JobRequest(kind="train", model="dlrm", nodes=2,
                         engine_args=["--data-path", "/data/criteo/parquet", "--embedding-placement",
                                      "model_parallel"])
    _, [spec] = plan([request], profile, submitting=True)
    # the engine gets the container path, unchanged
    assert spec.command[spec.command.index("--data-path") + 1] == "/data/criteo/parquet"
    os.rmdir(host / "checkpoints")
    (host / "datasets" / "criteo" / "parquet" / "feature_spec.yaml").unlink()
    with pytest.raises(RequestError, match=r"^--data-path /data/criteo/parquet \(host path "
                                           r"\S+/lustre/datasets/criteo/parquet\): no feature_spec.yaml"):
        plan([request], profile, submitting=True)


def test_renamed_mounts_translate_both_ways(renamed):
    profile, store = renamed
    assert to_host(profile, "/datasets/criteo/parquet") == f"{store}/sets/criteo/parquet"
    assert to_host(profile, "/ckpt") == f"{store}/ck"
    assert to_host(profile, "/data/criteo") is None      # dgxa100-pod's name: not this site's
    assert to_container(profile, f"{store}/ck/run1") == "/ckpt/run1"
    assert to_host(load_profile("ci"), "/anything") == "/anything"   # no container: host paths


def test_path_no_mount_covers_is_one_line(renamed):
    profile, _ = renamed
    for flag, value in (("--data-path", "/data/criteo/parquet"), ("--checkpoint-dir", "/scratch/ck")):
        args = ["--data-path", "/datasets/criteo/parquet", flag, value]
        with pytest.raises(RequestError) as err:
            plan([JobRequest(kind="train", model="dlrm", engine_args=args)], profile)   # render checks it too
        assert str(err.value).startswith(f"{flag} {value}: not inside the container of profile renamed")
        assert "\n" not in str(err.value) and "/datasets (ro)" in str(err.value)


def test_checkpoints_under_a_read_only_mount_refused(renamed):
    profile, _ = renamed
    args = ["--data-path", "/datasets/criteo/parquet", "--checkpoint-dir", "/datasets/ck"]
    with pytest.raises(RequestError, match=r"^--checkpoint-dir /datasets/ck: under the read-only mount"):
        plan([JobRequest(kind="train", model="dlrm", engine_args=args)], profile)


def test_requeue_guard_and_lead_time_look_at_the_host_path(renamed, tmp_path):
    """The guard lists the checkpoint dir on the batch host (outside the container): it must list
    the host path, or every attempt counts as idle and the job stops after 3 requeues."""
    profile, store = renamed
    ckpt = store / "ck" / "run1"
    ckpt.mkdir()
    (ckpt / "ckpt-7").mkdir()
    (ckpt / "attempt.json").write_text(json.dumps({"startup_s": 9000, "checkpoint_s": 60}))
    request = JobRequest(kind="train", model="dlrm", time="01:00:00",
                         engine_args=["--data-path", "/datasets/criteo/parquet", "--checkpoint-dir", "/ckpt/run1"])
    _, [spec] = plan([request], profile, submitting=True)
    assert spec.checkpoint_dir == str(ckpt)
    assert spec.command[spec.command.index("--checkpoint-dir") + 1] == "/ckpt/run1"
    warning = lead_time_warning(spec, str(tmp_path / "run"))
    assert warning and "9000 s of start-up" in warning and str(ckpt) in warning
    [(_, text)] = render_plan([request], profile, run_dir=str(tmp_path / "run"))
    guard = text[text.index("recsys_ckpt_dir="):text.index("recsys_ckpt_at_start=")]
    out = subprocess.run(["bash", "-c", guard + "recsys_newest_ckpt"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ckpt-7", (guard, out)


def test_preprocess_checks_before_submission(tmp_path):
    """docs/dgx.md's preprocessing example as it was: output under a read-only mount, a jar no
    mount covers, an image declared without Spark: each one line, nothing planned."""
    host = tmp_path / "h"
    ro = _profile(tmp_path, "ro", [f"{host}/raw:/data:ro", f"{host}/out:/out"],
                  "  provides: [spark]\n")
    pre = dict(kind="preprocess", dataset="criteo", input="/data/criteo/raw", gpus_per_node=8)
    with pytest.raises(RequestError, match=r"^--output /data/criteo/parquet: under the read-only mount"):
        plan([JobRequest(output="/data/criteo/parquet", **pre)], ro)
    with pytest.raises(RequestError, match=r"^--input /raw: not inside the container"):
        plan([JobRequest(**dict(pre, input="/raw"), output="/out/p")], ro)
    jar = ["--rapids-jar", "/opt/rapids/rapids-4-spark.jar"]
    with pytest.raises(RequestError, match=r"^--rapids-jar /opt/rapids/rapids-4-spark.jar: not inside the container"):
        plan([JobRequest(output="/out/p", engine_args=jar, **pre)], ro)
    with pytest.raises(RequestError, match=r"^recsys-submit preprocess --engine spark: the image of profile "
                                           r"dgxa100-pod \(/lustre/images/tensorflow\+23.12-tf2-py3.sqsh\) holds "
                                           r"tensorflow, horovod, not spark"):
        plan([JobRequest(output="/data/criteo/parquet", engine_args=jar, **pre)], load_profile("dgxa100-pod"))
    # the preprocessing profile's image declares Spark and its own RAPIDS jar: accepted as printed
    _, specs = plan([JobRequest(output="/data/criteo/parquet", engine_args=jar, **pre)],
                    load_profile("dgxa100-pod-spark"))
    assert "spark-standalone.sh" in str(specs[0].command[1])
    # a jar under a mount is fine with an image that does not declare RAPIDS
    plan([JobRequest(output="/out/p", engine_args=["--rapids-jar", "/out/rapids.jar"], **pre)], ro)


def test_training_refused_by_an_image_declared_without_tensorflow():
    with pytest.raises(RequestError, match=r"^recsys-submit train: the image of profile dgxa100-pod-spark .* "
                                           r"not tensorflow, horovod"):
        plan([JobRequest(kind="train", model="dlrm", nodes=2, engine_args=["--synthetic"])],
             load_profile("dgxa100-pod-spark"))


@pytest.mark.parametrize("body, key", [
    ("container:\n  image: x\n  mounts: [data:/data]\n", "container.mounts[0]"),
    ("container:\n  image: x\n  workdir: /workspace\n", "container.workdir"),
    ("container:\n  image: x\n  provides: [pyspark]\n", "container.provides[0]"),
    ("scratch: raid/scratch\n", "scratch"),
])
def test_bad_container_keys_are_one_line(tmp_path, body, key):
    path = tmp_path / "bad.yaml"
    path.write_text("extends: ci\n" + body)
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert re.search(rf": {re.escape(key)}: ", str(err.value)), str(err.value)


def test_chain_hands_its_output_over_at_the_host_path(tmp_path):
    """preprocess -> train: the data the chain's preprocess writes need not exist at submission;
    both paths are compared as host paths (the output under /data, --data-path under it)."""
    host = tmp_path / "lustre"
    profile = _profile(tmp_path, "chain", [f"{host}/raw:/raw:ro", f"{host}/datasets:/data"],
                       "  provides: [tensorflow, horovod, spark]\n")
    chain = [JobRequest(kind="preprocess", dataset="criteo", input="/raw/criteo", output="/data/criteo"),
             JobRequest(kind="train", model="dlrm", engine_args=["--data-path", "/data/criteo"])]
    _, specs = plan(chain, profile, submitting=True)
    assert [s.key for s in specs] == ["preprocess", "train"]
    with pytest.raises(RequestError, match=r"^--data-path /data/criteo \(host path \S+/datasets/criteo\): no such"):
        plan(chain[1:], profile, submitting=True)


def test_a_multinode_job_on_a_registry_image_is_warned_with_the_import_command(tmp_path):
    """Issue 47 item 6: every node of a multinode job imports a registry image (about 10 GB, the
    registry's credentials on the compute nodes); a squashfs file on the shared file system is
    imported once. The warning gives the enroot command for this image; one node, or a file, says nothing."""
    from jobs.planning.container_paths import registry_image_warning

    host = tmp_path / "lustre"
    _dataset(host / "datasets" / "criteo" / "parquet")
    (host / "checkpoints").mkdir()
    pod = _profile(tmp_path, "pod", [f"{host}/datasets:/data", f"{host}/checkpoints:/checkpoints"],
                   image="nvcr.io/nvidia/tensorflow:23.12-tf2-py3")
    request = JobRequest(kind="train", model="dlrm", nodes=2, engine_args=["--data-path", "/data/criteo/parquet"])
    _, [spec] = plan([request], pod, submitting=True)
    line = registry_image_warning(spec, pod)
    assert line == ("job main: each of its 2 nodes imports the registry image nvcr.io/nvidia/tensorflow:23.12-tf2-py3 "
                    "(about 10 GB for an NGC image; the registry's credentials on every node); import it once to the "
                    "shared file system, `enroot import -o /shared/images/tensorflow+23.12-tf2-py3.sqsh "
                    "docker://nvcr.io#nvidia/tensorflow:23.12-tf2-py3`, and name that file as the profile's "
                    "container.image")
    _, [one] = plan([JobRequest(kind="train", model="dlrm", nodes=1,
                                engine_args=["--data-path", "/data/criteo/parquet"])], pod, submitting=True)
    assert registry_image_warning(one, pod) is None
    squashed = _profile(tmp_path, "squashed", [f"{host}/datasets:/data", f"{host}/checkpoints:/checkpoints"])
    _, [spec] = plan([request], squashed, submitting=True)
    assert registry_image_warning(spec, squashed) is None
    assert registry_image_warning(spec, load_profile("ci")) is None          # no container


def test_the_built_in_pod_names_a_squashfs_file_and_a_missing_one_is_refused_before_submission(tmp_path):
    """Issue 47 item 6: dgxa100-pod's image is a squashfs file on the shared file system (imported
    once), not a registry image every node imports; a submission whose image file is not there is one
    line naming the key and the import command's form, before anything is planned. Rendering (a
    script for another machine) does not look."""
    pod = load_profile("dgxa100-pod")
    assert pod.container.image == "/lustre/images/tensorflow+23.12-tf2-py3.sqsh"
    host = tmp_path / "lustre"
    _dataset(host / "datasets" / "criteo" / "parquet")
    (host / "checkpoints").mkdir()
    missing = _profile(tmp_path, "missing", [f"{host}/datasets:/data", f"{host}/checkpoints:/checkpoints"],
                       image=tmp_path / "nowhere" / "tf.sqsh")
    request = JobRequest(kind="train", model="dlrm", nodes=2, engine_args=["--data-path", "/data/criteo/parquet"])
    with pytest.raises(RequestError, match=rf"^container.image {re.escape(str(tmp_path))}/nowhere/tf.sqsh of profile "
                                           r"missing: no such file on this host: import the image there first "
                                           r"\(`enroot import -o FILE docker://REGISTRY#IMAGE`, docs/dgx.md\)$"):
        plan([request], missing, submitting=True)
    plan([request], missing)                                     # rendering: not looked at
    (tmp_path / "nowhere").mkdir()
    (tmp_path / "nowhere" / "tf.sqsh").mkdir()
    with pytest.raises(RequestError, match=r"tf.sqsh of profile missing: not a file on this host"):
        plan([request], missing, submitting=True)
