"""A study's frozen code without a cluster: the copy is named by its content, made once and
reused, a refresh is recorded, and a point's script runs the copy (its helpers and PYTHONPATH).
That a point submitted after the checkout was edited still runs the copy is
tests/jobs/test_study_allocation.py's, on the cluster."""

import os

import pytest

from jobs.profiles import load_profile
from jobs.study.running import frozen, run
from jobs.study.analysis import report_table
from jobs.study.running import record as study_record
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
    record = study_record.StudyRecord(name="s", study_dir=str(tmp_path / "study"), profile="ci", profile_path=None,
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
    assert study_record.StudyRecord.load(record.study_dir).code["sha256"] == new["sha256"]     # saved


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


def _profile(tmp_path, value):
    path = tmp_path / "site.yaml"
    path.write_text(f"extends: ci\nenv:\n  RECSYS_SITE_MARK: {value}\n")
    return load_profile(str(path))


def test_the_profile_is_frozen_resolved_and_loads_back_as_the_same_profile(tmp_path):
    profile = _profile(tmp_path, "one")
    study = str(tmp_path / "study")
    copy = frozen.freeze_profile(study, profile)
    assert copy["file"] == os.path.join("code", f"profile-{profile.content_sha256()[:16]}.yaml")
    assert copy["sha256"] == profile.content_sha256() and copy["source"] == profile.path
    text = open(os.path.join(study, copy["file"])).read()
    assert "extends" not in text and "RECSYS_SITE_MARK: one" in text     # self-contained: no parent needed
    again = frozen.load_frozen_profile(study, copy)
    assert again.content_sha256() == profile.content_sha256() and again.env["RECSYS_SITE_MARK"] == "one"
    with open(os.path.join(study, copy["file"]), "a") as handle:         # the copy edited by hand
        handle.write("max_nodes: 2\n")
    with pytest.raises(frozen.StorageError, match=r"frozen profile .* was changed after it was frozen"):
        frozen.load_frozen_profile(study, copy)


def test_a_later_run_plans_with_the_studys_profile_unless_refreshed(tmp_path, monkeypatch):
    root = _checkout(tmp_path / "checkout")
    monkeypatch.setattr(frozen, "checkout", lambda: root)
    first = _profile(tmp_path, "one")
    record = study_record.StudyRecord(name="s", study_dir=str(tmp_path / "study"), profile="site", profile_path=first.path,
                             scheduler="slurm", spec={}, created=0.0)
    os.makedirs(record.study_dir)
    said = []
    run._frozen_code(record, False, said.append, first)
    record.save()
    assert record.profile_copy["sha256"] == first.content_sha256() and not said
    edited = _profile(tmp_path, "two")      # the user's profile file edited between two runs
    used = run._study_profile(record.study_dir, edited, False, said.append)
    assert used.env["RECSYS_SITE_MARK"] == "one" and used.content_sha256() == first.content_sha256()
    assert len(said) == 1 and "differs from the study's frozen copy" in said[0] and "--refresh-code" in said[0]
    point = study_record.PointRecord(id="p", nodes=1, gpus_per_node=1, gpus=1, batch_per_gpu=1, global_batch=1,
                            variant={}, variant_label="default", repeat=0)
    point.add_attempt("/runs/a", record)
    assert point.profile == {"/runs/a": first.content_sha256()} and point.code == {"/runs/a": record.code["sha256"]}
    # a plan with another profile than the study froze, without a refresh, is refused
    with pytest.raises(run.StudyError, match="frozen profile changed"):
        run._frozen_code(record, False, said.append, edited)
    assert run._study_profile(record.study_dir, edited, True, said.append) is edited     # --refresh-code
    run._frozen_code(record, True, said.append, edited)
    assert record.code_changes == [{"profile_from": first.content_sha256(), "profile_to": edited.content_sha256(),
                                    "at": record.profile_copy["frozen_at"]}]
    assert "profile refreshed" in said[-1]
    loaded = study_record.StudyRecord.load(record.study_dir)
    assert loaded.profile_copy["sha256"] == edited.content_sha256() and loaded.code_changes == record.code_changes
    assert run._study_profile(record.study_dir, edited, False, said.append).env["RECSYS_SITE_MARK"] == "two"


def test_the_report_says_whether_every_point_ran_one_profile():
    from jobs.study.analysis import report_table

    code = {"points": {"a": "c" * 64, "b": "c" * 64}, "same": True, "profiles": {"a": "p" * 64, "b": "p" * 64},
            "profile_same": True, "changes": []}
    assert report_table._code_text(code).endswith(f"; every point ran with the study's frozen profile {'p' * 16}")
    code.update(profiles={"a": "p" * 64, "b": "q" * 64}, profile_same=False)
    assert report_table._code_text(code).endswith(f"; profile NOT one copy: a {'p' * 16}, b {'q' * 16}")
    code.update(profiles={"a": None, "b": None}, profile_same=False)        # a study from before frozen profiles
    assert report_table._code_text(code).endswith("(study-dir code/)")
