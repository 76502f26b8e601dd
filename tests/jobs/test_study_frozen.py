"""A study's frozen code without a cluster: the copy is named by its content, made once and
reused, a refresh is recorded, and a point's script runs the copy (its helpers and PYTHONPATH).
That a point submitted after the checkout was edited still runs the copy is
tests/jobs/test_study_allocation.py's, on the cluster."""

import os

import pytest

from jobs.profiles import load_profile
from jobs.study import frozen, run
from jobs.study.spec import StudySpec, expand

pytestmark = pytest.mark.fast


def _checkout(root, engine="x = 1\n"):
    for package, name, text in (("recsys", "engine.py", engine), ("slurm", "bind.sh", "echo\n"),
                                ("recsys/__pycache__", "engine.cpython-311.pyc", "junk")):
        os.makedirs(root / package, exist_ok=True)
        (root / package / name).write_text(text)
    return str(root)


def test_the_copy_is_named_by_its_content_and_made_once(tmp_path):
    root = _checkout(tmp_path / "checkout")
    study = tmp_path / "study"
    first = frozen.freeze(str(study), root)
    assert first["dir"] == str(study / "code" / first["sha256"][:16])
    assert sorted(os.listdir(first["dir"])) == ["recsys", "slurm"]
    assert not os.path.exists(os.path.join(first["dir"], "recsys", "__pycache__"))
    marker = os.path.join(first["dir"], "recsys", "engine.py")
    os.utime(marker, (1, 1))
    again = frozen.freeze(str(study), root)
    assert again["sha256"] == first["sha256"] and os.stat(marker).st_mtime == 1     # reused, not copied
    _checkout(tmp_path / "checkout", engine="x = 2\n")
    edited = frozen.freeze(str(study), root)
    assert edited["sha256"] != first["sha256"] and open(marker).read() == "x = 1\n"
    assert sorted(os.listdir(study / "code")) == sorted([first["sha256"][:16], edited["sha256"][:16]])
    assert first["git_commit"] is None      # not a git work tree


def test_a_refresh_is_recorded_and_otherwise_the_studys_copy_stays(tmp_path, monkeypatch):
    root = _checkout(tmp_path / "checkout")
    monkeypatch.setattr(frozen, "checkout", lambda: root)
    record = run.StudyRecord(name="s", study_dir=str(tmp_path / "study"), profile="ci", profile_path=None,
                             scheduler="slurm", spec={}, created=0.0)
    os.makedirs(record.study_dir)
    said = []
    code = run._frozen_code(record, False, said.append)
    _checkout(tmp_path / "checkout", engine="x = 2\n")
    assert run._frozen_code(record, False, said.append) == code and not record.code_changes
    new = run._frozen_code(record, True, said.append)
    assert new["sha256"] != code["sha256"]
    assert record.code_changes == [{"from": code["sha256"], "to": new["sha256"], "at": new["frozen_at"]}]
    assert said and "code refreshed" in said[0]
    assert run.StudyRecord.load(record.study_dir).code["sha256"] == new["sha256"]     # saved


def test_a_points_script_runs_the_copy(tmp_path):
    from jobs.schedulers import backend_for
    from jobs.planning.plan import plan

    spec = StudySpec.from_dict(dict(name="f", model="ncf", batch_size=512, steps=2, warmup_steps=1, gpus=[1]))
    profile = load_profile("ci")
    point = expand(spec, profile)[0]
    code = {"dir": str(tmp_path / "code" / "abc"), "sha256": "abc"}
    _, specs = plan([run.point_request(point, spec, profile, code)], profile)
    text = backend_for(profile).dry_run(specs, str(tmp_path / "run"), check=False).text()
    assert f"export RECSYS_SLURM_DIR={code['dir']}/slurm" in text
    assert f"export PYTHONPATH={code['dir']}" in text
    _, specs = plan([run.point_request(point, spec, profile)], profile)
    plain = backend_for(profile).dry_run(specs, str(tmp_path / "run"), check=False).text()
    assert "PYTHONPATH" not in plain.split("# --- profile environment ---")[1].split("# ---")[0]
