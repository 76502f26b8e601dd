"""After `study run --refresh-code` a cell's repeats may have run two frozen copies of the code:
the report keeps each copy's repeats apart, in a column of its own as a variant's are, and says so
(issue 47, item 11); they were pooled into one median without a word. In-memory study records."""

import pytest

from jobs.study.analysis import report as study_report
from jobs.study.running.record import PointRecord, PointStatus, StudyRecord, StudyStatus

pytestmark = pytest.mark.fast

OLD, NEW = "a" * 64, "b" * 64


def test_repeats_of_two_code_copies_are_not_pooled(tmp_path):
    points, statuses = [], []
    throughput = {(1, 0): 1000.0, (1, 1): 1010.0, (1, 2): 2000.0, (2, 0): 1900.0, (2, 1): 1950.0, (2, 2): 3900.0}
    for gpus in (1, 2):
        for r in range(3):
            pid, run_dir = f"g{gpus}-n1x{gpus}-r{r}", str(tmp_path / f"g{gpus}-r{r}")
            points.append(PointRecord(id=pid, nodes=1, gpus_per_node=gpus, gpus=gpus, batch_per_gpu=512 // gpus,
                                      global_batch=512, variant={}, variant_label="default", repeat=r,
                                      runs=[run_dir], code={run_dir: NEW if r == 2 else OLD}))
            statuses.append(PointStatus(id=pid, state="done", job_state="COMPLETED", run_dir=run_dir, job_id="9",
                                        attempts=1, summary={"type": "summary", "world_size": gpus,
                                                             "throughput_samples_per_s": throughput[(gpus, r)]}))
    record = StudyRecord(name="t", study_dir=str(tmp_path), profile="ci", profile_path=None, scheduler="slurm",
                         spec={"name": "t", "model": "dlrm", "scaling": "strong", "warmup_steps": 2, "steps": 5},
                         created=0.0, points=points, code={"sha256": NEW})
    status = StudyStatus(study_dir=str(tmp_path), points=statuses, counts={}, done=True, calls=0, elapsed_s=0.0)
    report = study_report.build(record, status)
    old, new = f"default @ code {OLD[:12]}", f"default @ code {NEW[:12]}"
    assert report["variants"] == [old, new]
    one = next(r for r in report["rows"] if r["gpus"] == 1)["variants"]
    assert one[old]["points"] == ["g1-n1x1-r0", "g1-n1x1-r1"] and one[old]["throughput"] == 1005.0
    assert one[new]["points"] == ["g1-n1x1-r2"] and one[new]["throughput"] == 2000.0
    two = next(r for r in report["rows"] if r["gpus"] == 2)["variants"]
    assert two[new]["speedup"] == pytest.approx(3900.0 / 2000.0)         # each copy's own baseline
    assert report["warnings"][0].startswith("code: the points ran 2 frozen copies (aaaaaaaaaaaa, bbbbbbbbbbbb")
    # one copy: the columns are the variants as before
    for p in record.points:
        p.code = {p.runs[0]: OLD}
    assert study_report.build(record, status)["variants"] == ["default"]
