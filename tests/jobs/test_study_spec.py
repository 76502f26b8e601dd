"""Study specs: expansion into points (pure functions) and bad input refused by `recsys-submit
study run` with one line naming the key or point, exit 2, nothing created or submitted. The
checks run before any Slurm command, so no cluster is needed here."""

import os
import subprocess
import sys

import pytest
import yaml

from jobs.profiles import load_profile
from jobs.study.spec import KEYS, StudyError, expand, load_spec, spec_from_flags

pytestmark = pytest.mark.fast

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_gpu_counts_become_nodes_by_the_profile_node_size():
    points = expand(spec_from_flags("dlrm", "1,2,4,8", batch_size=512), load_profile("ci"))
    assert [(p.gpus, p.nodes, p.gpus_per_node, p.batch_per_gpu) for p in points] == \
        [(1, 1, 1, 512), (2, 1, 2, 256), (4, 2, 2, 128), (8, 4, 2, 64)]
    assert all(p.global_batch == 512 for p in points)
    req = points[2].request(spec_from_flags("dlrm", "1,2,4,8", batch_size=512), "ci")
    assert (req.kind, req.nodes, req.gpus_per_node) == ("benchmark", 2, 2)
    assert req.engine_args[req.engine_args.index("--batch-size") + 1] == "512"


def test_weak_scaling_variants_and_repeats_are_crossed():
    spec = spec_from_flags("ncf", "1,2", scaling="weak", batch_size=100, repeats=2,
                           variants=["amp=false,true", "xla=false,true"])
    points = expand(spec, load_profile("ci"))
    assert len(points) == 2 * 4 * 2
    assert {(p.gpus, p.global_batch) for p in points} == {(1, 100), (2, 200)}
    amp_xla = next(p for p in points if p.variant == {"amp": True, "xla": True} and p.gpus == 2 and p.repeat == 1)
    assert amp_xla.id == "g2-n1x2-amp-true_xla-true-r1"
    assert "--amp" in amp_xla.engine_args and "--xla" in amp_xla.engine_args
    plain = next(p for p in points if p.variant == {"amp": False, "xla": False})
    assert "--amp" not in plain.engine_args and "--xla" not in plain.engine_args


def test_points_run_the_step_breakdown_unless_the_spec_says_0():
    def flags(spec):
        args = expand(spec, load_profile("ci"))[0].engine_args
        return args[args.index("--breakdown-steps") + 1] if "--breakdown-steps" in args else None

    assert flags(spec_from_flags("dlrm", "1", batch_size=512)) == "20"          # the default
    assert flags(spec_from_flags("dlrm", "1", batch_size=512, breakdown_steps=5)) == "5"
    assert flags(spec_from_flags("dlrm", "1", batch_size=512, breakdown_steps=0)) is None
    with pytest.raises(StudyError, match="breakdown_steps: -1 is not a non-negative integer"):
        spec_from_flags("dlrm", "1", breakdown_steps=-1)
    with pytest.raises(StudyError, match="engine_args: --breakdown-steps is set by the study"):
        spec_from_flags("dlrm", "1", engine_args=["--breakdown-steps", "3"])


def test_engine_flags_are_checked_once_per_distinct_argument_set(monkeypatch):
    """4 sizes x 3 precisions x 2 repeats = 24 points, but strong scaling gives every size the
    same global batch, so only the 3 precision variants differ: 3 parses, not 24."""
    import jobs.study.spec as study_mod

    seen = []
    real = study_mod.check_engine_args
    monkeypatch.setattr(study_mod, "check_engine_args",
                        lambda spec, point: seen.append(tuple(point.engine_args)) or real(spec, point))
    spec = spec_from_flags("dlrm", "1,2,4,8", batch_size=4096, repeats=2, variants=["precision=tf32,fp32,amp"])
    points = expand(spec, load_profile("ci"))
    assert len(points) == 24
    assert len(seen) == len(set(seen)) == len({tuple(p.engine_args) for p in points}) == 3


def test_spec_file_and_example_in_docs(tmp_path):
    spec = load_spec(os.path.join(REPO, "docs", "studies", "dlrm-strong.yaml"))
    assert [p.id for p in expand(spec, load_profile("ci"))] == \
        ["g1-n1x1-amp-false-r0", "g2-n1x2-amp-false-r0", "g4-n2x2-amp-false-r0", "g8-n4x2-amp-false-r0"]
    with pytest.raises(StudyError, match=r"^.*bad\.yaml: scaling: 'linear' is not one of strong, weak$"):
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump({"model": "dlrm", "gpus": [1], "scaling": "linear"}))
        load_spec(str(path))


BAD = [
    ({"model": "dlrm", "gpus": [1], "gpu_count": 2}, "gpu_count: unknown key"),
    ({"model": "dlrm", "gpus": []}, "gpus: empty point list"),
    ({"model": "dlrm", "points": []}, "points: empty point list"),
    ({"model": "dlrm", "gpus": [1, 16]}, "point n8x2: --nodes: 8 nodes requested but profile 'ci' has 4"),
    ({"model": "dlrm", "points": [{"nodes": 1, "gpus_per_node": 4}]}, "point n1x4: --gpus-per-node"),
    ({"model": "dlrm", "gpus": [1, 2], "batch_size": 1001}, "batch_size: 1001 does not divide over the 2 GPUs of point n1x2"),
    ({"model": "dlrm", "gpus": [1], "engine_args": ["--no-such-flag"]},
     "point g1-n1x1-r0: the engine rejects its flags: unrecognized arguments: --no-such-flag"),
    ({"model": "dlrm", "gpus": [1], "variants": {"embedding_dim": ["wide"]}},
     "the engine rejects its flags: argument --embedding-dim: invalid int value: 'wide'"),
    ({"model": "dlrm", "gpus": [1], "engine_args": ["--batch-size", "8"]}, "engine_args: --batch-size is set by the study"),
    ({"model": "bert", "gpus": [1]}, "model: 'bert' is not one of"),
]


@pytest.mark.parametrize("spec,message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_spec_is_one_line_exit_2_nothing_created(tmp_path, spec, message):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    runs = tmp_path / "runs"
    env = dict(os.environ, RECSYS_RUNS_DIR=str(runs))
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "study", "run", str(path), "--profile", "ci"],
                          cwd=REPO, env=env, text=True, capture_output=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("recsys-submit: error: "), proc.stderr
    assert message in lines[0]
    assert not runs.exists()


def test_bad_flags_and_missing_spec(tmp_path):
    env = dict(os.environ, RECSYS_RUNS_DIR=str(tmp_path / "runs"))
    cases = [(["study", "run", str(tmp_path / "nope.yaml"), "--profile", "ci"], "nope.yaml: file: cannot read: No such file"),
             (["study", "run", "--model", "dlrm", "--gpus", "1,x", "--profile", "ci"], "--gpus: '1,x' is not a list"),
             (["study", "run", "--model", "ncf", "--gpus", "1", "--variant", "amp", "--profile", "ci"], "--variant: 'amp'"),
             (["study", "run", "--model", "ncf", "--gpus", "1", "--max-concurrent", "0", "--profile", "ci"],
              "--max-concurrent: must be at least 1"),
             (["study", "report", "no-such-study"], "study: 'no-such-study' is not a study directory")]
    for argv, message in cases:
        proc = subprocess.run([sys.executable, "-m", "jobs.cli", *argv], cwd=REPO, env=env, text=True,
                              capture_output=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, (argv, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def _opened(tmp_path, **flags):
    from jobs.study.running.run import open_study

    spec = spec_from_flags("ncf", flags.pop("gpus", "1,2"), batch_size=512, name="grow", **flags)
    return open_study(spec, load_profile("ci"), str(tmp_path / "study-grow"))[0]


def test_a_study_gains_points_values_and_repeats_but_keeps_its_measurement(tmp_path):
    """Extending (issue 21): sizes, variant values and repeats add points and keep the old ones;
    what a point measures may not change, and a new variant key would rename every point."""
    first = _opened(tmp_path, variants=["amp=false"])
    assert [p.id for p in first.points] == ["g1-n1x1-amp-false-r0", "g2-n1x2-amp-false-r0"]
    grown = _opened(tmp_path, gpus="1,2,4", variants=["amp=false,true"], repeats=2)
    ids = [p.id for p in grown.points]
    assert ids[:2] == ["g1-n1x1-amp-false-r0", "g2-n1x2-amp-false-r0"] and len(ids) == 3 * 2 * 2
    assert grown.spec["repeats"] == 2 and grown.spec["gpus"] == [1, 2, 4]
    with pytest.raises(StudyError, match=r"^--gpus/--variant flags: steps: .* was run with steps 100, not 20;"):
        _opened(tmp_path, variants=["amp=false"], steps=20)
    with pytest.raises(StudyError, match=r"^--gpus/--variant flags: variants.xla: "):
        _opened(tmp_path, variants=["amp=false", "xla=true"])
    with pytest.raises(StudyError, match=r"^--gpus/--variant flags: batch_size: "):
        from jobs.study.running.run import open_study

        open_study(spec_from_flags("ncf", "1,2", batch_size=1024, name="grow", variants=["amp=false"]),
                   load_profile("ci"), str(tmp_path / "study-grow"))


def test_only_a_state_slurm_reported_as_terminal_fails_a_point(tmp_path):
    from jobs.runs.records import PARTIAL, SUBMITTED, SUBMITTING, JobStatus, RunRecord
    from jobs.study.running import run
    from jobs.study.running import record as study_record

    def job(state, summary=None):
        return JobStatus(key="main", job_id="7", name="p", state=state, tasks={"7": state}, summary=summary)

    assert study_record._classify(job("UNKNOWN"))[0] == study_record.UNKNOWN
    assert study_record._classify(job("PENDING"))[0] == study_record.PENDING
    assert study_record._classify(job("CANCELLED"))[0] == study_record.FAILED
    assert study_record._classify(job("COMPLETED", {"throughput_samples_per_s": 1.0}))[0] == study_record.DONE
    assert study_record._classify(job("COMPLETED"))[0] == study_record.FAILED        # no summary: the engine did not finish

    def attempt(state, uncertain=False):
        run_dir = tmp_path / f"{state}-{uncertain}"
        run_dir.mkdir()
        RunRecord(run_dir=str(run_dir), profile="ci", profile_path=None, scheduler="slurm", state=state,
                  uncertain=uncertain, error="job 'main' refused").save()
        return study_record._without_job(str(run_dir))

    assert attempt(SUBMITTING)[0] == study_record.UNKNOWN            # died while sbatch was in flight
    assert attempt(PARTIAL, uncertain=True)[0] == study_record.UNKNOWN
    assert attempt(PARTIAL) == (study_record.FAILED, "not submitted: job 'main' refused")
    assert attempt(SUBMITTED)[0] == study_record.FAILED


def test_a_spec_with_three_mistakes_reports_all_three(tmp_path, capsys):
    """Issue 44 item 3: a study spec is checked like a profile, every mistake at once, each one line
    with its key, an unknown key with a "did you mean" (it stopped at the first mistake, no hint)."""
    from jobs import cli

    spec = tmp_path / "s.yaml"
    spec.write_text("model: dlrm\ngpus: [1, 2]\nrepeat: 3\nbatch_size: -4\nvariants: {precision: [fp16]}\n")
    with pytest.raises(StudyError) as err:
        load_spec(str(spec))
    assert err.value.problems == [
        f"{spec}: repeat: unknown key (did you mean 'repeats'? known: {', '.join(KEYS)})",
        f"{spec}: batch_size: -4 is not a positive integer",
        f"{spec}: variants.precision: 'fp16' is not one of tf32, fp32, amp"]
    assert str(err.value) == err.value.problems[0]
    assert cli.main(["study", "run", str(spec), "--profile", "ci", "--dry-run"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"recsys-submit: error: {p}" for p in err.value.problems]
