"""A study in one allocation on the local cluster WITH accounting: one sbatch for all its points,
every point's steps on the first nodes of the allocation (the node set it recorded), the same
results a study of separate jobs gives; the allocation cancelled after its first point finished
keeps that point, and the next `study run` submits only the rest, in one new allocation, after
the checkout (a copy of it) and its `ci` profile have been edited: the rest still runs the study's
frozen code and profile; while another user's job of the shared study name is queued that re-run
is refused, and goes on with --overlap-other-users. A
second study (separate jobs) started at the same moment on the same shared-nodes profile never
runs beside it (Slurm's singleton: start and end from sacct).

One sequence of real CLI calls (NCF, three points of 1 and 2 ranks, 2 timed steps, and the other
study's one point) in a module fixture; the tests read what it saw.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from study_helpers import TINY_NCF, info, record, report, status, study_dir, submitted, watch, write_spec
from submit_helpers import REPO, Cli
from tests.waiting import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.horovod, pytest.mark.slow]

NAME = "ncf-alloc"
SPEC = dict(name=NAME, model="ncf", batch_size=512, warmup_steps=1, steps=2, breakdown_steps=0,
            time="00:05:00", engine_args=TINY_NCF, placement="allocation",
            points=[{"nodes": 1, "gpus_per_node": 1}, {"nodes": 2, "gpus_per_node": 1},
                    {"nodes": 1, "gpus_per_node": 2}])
FIRST = "g1-n1x1-r0"
EDITED = "RECSYS_PROFILE_EDITED"     # the env value the profile gains between the two runs
ALONE = dict(name="ncf-alone", model="ncf", batch_size=512, warmup_steps=1, steps=2, breakdown_steps=0,
             time="00:05:00", engine_args=TINY_NCF, points=[{"nodes": 1, "gpus_per_node": 1}])


def _checkout_copy(directory):
    """A copy of this checkout's packages to run `recsys-submit` from (PYTHONPATH first), so the
    test can edit the code without touching the repository."""
    for package in ("jobs", "recsys", "slurm", "cluster_profiles"):
        shutil.copytree(os.path.join(REPO, package), directory / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return directory


def _sacct(cluster, *args):
    out = cluster.run(["sacct", "-n", "-P", *args], check=True).stdout
    return [line.split("|") for line in out.splitlines() if line]


def _allocation_job(point_record, run_dir):
    with open(os.path.join(run_dir, "jobs.json")) as handle:
        return json.load(handle)["jobs"][0]["job_id"]


@pytest.fixture(scope="module")
def seen(slurm_cluster_acct, tmp_path_factory):
    pytest.importorskip("horovod.tensorflow")
    cluster = slurm_cluster_acct
    copy = _checkout_copy(tmp_path_factory.mktemp("checkout"))
    cli = Cli(dict(cluster.env, PYTHONPATH=str(copy)), tmp_path_factory.mktemp("alloc-study-runs"))
    spec = write_spec(tmp_path_factory.mktemp("spec") / "alloc.yaml", **SPEC)
    alone = write_spec(tmp_path_factory.mktemp("spec") / "alone.yaml", **ALONE)
    out = {"cli": cli, "cluster": cluster, "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
    # both studies started together: the other one's point and this allocation share the nodes
    started = [subprocess.Popen([sys.executable, "-m", "jobs.cli", "study", "run", str(path), "--profile", "ci"],
                                cwd=copy, env=cli.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for path in (spec, alone)]
    (out1, err1), (out2, err2) = (proc.communicate(timeout=300) for proc in started)
    assert [p.returncode for p in started] == [0, 0], out1 + err1 + out2 + err2
    out["run1"] = subprocess.CompletedProcess([], 0, out1, err1)
    out["alone_dir"] = study_dir(subprocess.CompletedProcess([], 0, out2, err2))
    directory = out["dir"] = study_dir(out["run1"])
    first = next(p for p in record(directory)["points"] if p["id"] == FIRST)
    out["job1"] = _allocation_job(first, first["runs"][0])
    # cancel the allocation once its first point has finished
    wait_for(lambda: "exit_code" in info(first["runs"][0]), timeout=300, what="the first point to finish")
    cluster.run(["scancel", out["job1"]], check=True)
    wait_for(lambda: [r for r in _sacct(cluster, "-X", "-j", out["job1"], "-o", "State")
                      if r[0].startswith("CANCELLED")], timeout=120, what="sacct to see the allocation cancelled")
    out["status1"] = status(cli, directory)
    # the checkout is edited between the points: an engine that can no longer start, and the
    # profile (a value every later job would export)
    with open(copy / "recsys" / "engine" / "__init__.py", "a") as handle:
        handle.write("\nraise SystemExit('the edited checkout ran')\n")
    profile = copy / "cluster_profiles" / "ci.yaml"
    text = profile.read_text()
    assert "  RECSYS_DEVICE: cpu\n" in text
    profile.write_text(text.replace("  RECSYS_DEVICE: cpu\n", f"  RECSYS_DEVICE: cpu\n  {EDITED}: edited\n"))
    rerun = [sys.executable, "-m", "jobs.cli", "study", "run", str(spec), "--profile", "ci"]
    # another user's job of the shared study name (root may submit as another user; held: it never
    # runs): the re-run is refused, then goes on with --overlap-other-users
    held = None
    if os.geteuid() == 0:
        held = cluster.run(["sbatch", "--parsable", "--uid=nobody", "--hold", "--job-name=recsys-study-shared",
                            "--chdir=/tmp", "--output=/dev/null", "--wrap", "true"], check=True).stdout.strip()
        before = open(os.path.join(directory, "study.json")).read()
        refused = subprocess.run(rerun, cwd=copy, env=cli.env, text=True, capture_output=True, timeout=300)
        out["refused"] = (held, refused, open(os.path.join(directory, "study.json")).read() == before)
        rerun.append("--overlap-other-users")
    out["run2"] = subprocess.run(rerun, cwd=copy, env=cli.env, text=True, capture_output=True, timeout=300)
    if held:
        cluster.run(["scancel", held], check=True)
    assert out["run2"].returncode == 0, out["run2"].stdout + out["run2"].stderr
    out["watch"] = watch(cli, directory)
    out["alone_watch"] = watch(cli, out["alone_dir"])
    out["report"] = report(cli, directory)
    out["alone_report"] = report(cli, out["alone_dir"])
    out["record"] = record(directory)
    out["jobs"] = _sacct(cluster, "-X", "-S", out["since"], "-o", "JobID,JobName,NNodes,Start,End")
    return out


def _alone_job(seen):
    point = record(seen["alone_dir"])["points"][0]
    return _allocation_job(point, point["runs"][0])


def test_the_allocation_is_one_sbatch_of_the_largest_points_nodes(seen):
    assert submitted(seen["run1"]) == (3, 3)
    second = {_allocation_job(None, p["runs"][-1]) for p in seen["record"]["points"] if len(p["runs"]) == 2}
    assert len(second) == 1, seen["record"]
    # everything Slurm ran meanwhile: one sbatch per `study run` of the allocation study, and the
    # other study's one point
    jobs = {j[0]: j for j in seen["jobs"]}
    assert sorted(jobs) == sorted([seen["job1"], *second, _alone_job(seen)]), seen["jobs"]
    assert jobs[seen["job1"]][2] == "2" and jobs[next(iter(second))][2] == "2"


def test_two_studies_started_together_never_run_at_the_same_moment(seen):
    spans = sorted((int(time.mktime(time.strptime(j[3], "%Y-%m-%dT%H:%M:%S"))),
                    int(time.mktime(time.strptime(j[4], "%Y-%m-%dT%H:%M:%S"))), j[0]) for j in seen["jobs"])
    assert len(spans) == 3 and all(j[1] == "recsys-study-shared" for j in seen["jobs"]), seen["jobs"]
    for (_, end, job), (start, _, later) in zip(spans, spans[1:]):
        assert start >= end, f"job {later} started at {start}, before job {job} ended at {end}"


def test_a_cancelled_allocation_keeps_the_finished_point_and_fails_the_rest(seen):
    rc, st = seen["status1"]
    by_id = {p["id"]: p for p in st["points"]}
    assert by_id[FIRST]["state"] == "done", by_id[FIRST]
    for point_id, point in by_id.items():
        if point_id != FIRST:
            assert point["state"] == "failed", point
            assert f"allocation (job {seen['job1']}) ended CANCELLED" in point["reason"], point


def test_the_rerun_submits_only_the_rest_and_nothing_runs_twice(seen):
    assert submitted(seen["run2"]) == (2, 3)
    assert FIRST not in seen["run2"].stdout
    rc, st = seen["watch"]
    assert rc == 0 and st["counts"]["done"] == 3, st
    attempts = {p["id"]: len(p["runs"]) for p in seen["record"]["points"]}
    assert attempts == {FIRST: 1, "g2-n2x1-r0": 2, "g2-n1x2-r0": 2}, attempts
    for point in st["points"]:     # each point's summary from the attempt that finished it
        assert point["summary"]["world_size"] == (1 if point["id"] == FIRST else 2), point


def test_every_point_ran_the_studys_frozen_code_not_the_edited_checkout(seen):
    rec = seen["record"]
    code = rec["code"]
    assert code["dir"] == os.path.join(seen["dir"], "code", code["sha256"][:16]) and not rec["code_changes"]
    assert "SystemExit" not in open(os.path.join(code["dir"], "recsys", "engine", "__init__.py")).read()
    for point in rec["points"]:
        assert set(point["code"]) == set(point["runs"]) and set(point["code"].values()) == {code["sha256"]}
        script = open(os.path.join(point["runs"][-1], "main.sbatch")).read()
        assert f"export RECSYS_SLURM_DIR={code['dir']}/slurm" in script
        assert f"export PYTHONPATH={code['dir']}" in script
    proc, rep = seen["report"]
    assert rep["code"]["same"] is True
    assert f"every point ran the study's frozen copy {code['sha256'][:16]}" in proc.stdout + open(
        os.path.join(seen["dir"], "report", "scaling.md")).read()


def test_another_users_study_job_refuses_the_run_until_overlap_is_given(seen):
    if "refused" not in seen:
        pytest.skip("only root can submit a job as another user here")
    held, refused, unchanged = seen["refused"]
    assert refused.returncode == 2 and unchanged, refused.stderr
    lines = [line for line in refused.stderr.splitlines() if "error" in line]
    assert lines and lines[0].startswith(f"recsys-submit: error: study: job {held} of user nobody ("), refused.stderr
    assert "--overlap-other-users" in lines[0]
    assert f"job {held} of user nobody" in seen["run2"].stderr and "may run beside" in seen["run2"].stderr


def test_every_point_ran_with_the_studys_profile_not_the_edited_one(seen):
    rec = seen["record"]
    frozen = rec["profile_copy"]["sha256"]
    assert "differs from the study's frozen copy" in seen["run2"].stderr, seen["run2"].stderr
    ran = {p["id"]: p["summary"]["provenance"]["profile_sha256"] for p in seen["watch"][1]["points"]}
    assert set(ran.values()) == {frozen}, (frozen, ran)     # the engine's own provenance, every point
    for point in rec["points"]:
        assert set(point["profile"].values()) == {frozen}
        assert EDITED not in open(os.path.join(point["runs"][-1], "main.sbatch")).read()
    _, rep = seen["report"]
    assert rep["code"]["profile_same"] is True
    assert f"every point ran with the study's frozen profile {frozen[:16]}" in open(
        os.path.join(seen["dir"], "report", "scaling.md")).read()


def test_every_step_ran_on_the_first_nodes_of_its_allocation(seen):
    cluster = seen["cluster"]
    for point in seen["record"]["points"]:
        run_dir = point["runs"][-1]
        job = _allocation_job(point, run_dir)
        allocation = [r for r in _sacct(cluster, "-X", "-j", job, "-o", "NodeList")][0][0]
        nodes = cluster.run(["scontrol", "show", "hostnames", allocation], check=True).stdout.split()
        recorded = info(run_dir)["nodelist"]
        assert recorded == ",".join(nodes[:point["nodes"]]), (point["id"], recorded, nodes)
        steps = {r[0]: r[1] for r in _sacct(cluster, "-j", job, "-o", "JobID,NodeList")}
        # the point's srun step is the one whose rank logs it wrote; its node list is the recorded one
        step_nodes = [cluster.run(["scontrol", "show", "hostnames", n], check=True).stdout.split()
                      for s, n in steps.items() if s.split(".")[-1].isdigit()]
        assert nodes[:point["nodes"]] in step_nodes, (point["id"], steps)


def test_the_report_gives_the_separate_jobs_checks_and_names_the_node_sets(seen):
    proc, rep = seen["report"]
    assert proc.returncode == 0, proc.stderr
    rows = {r["gpus"]: r for r in rep["rows"]}
    assert set(rows) == {1, 2}
    for row in rep["rows"]:
        for cell in row["variants"].values():
            assert cell["throughput"] > 0 and cell["efficiency"] is not None, row
    # the 1-rank point as a separate job: the same measurement, summary for summary (its figures
    # are not compared: 2 timed steps on a 2-core host shared with other work differ up to 9x)
    rc, alone = seen["alone_watch"]
    assert rc == 0 and alone["counts"]["done"] == 1, alone
    _, alone_rep = seen["alone_report"]
    mine, theirs = rows[1]["variants"]["default"], alone_rep["rows"][0]["variants"]["default"]
    assert mine["n"] == theirs["n"] == 1 and mine["throughput"] > 0 and theirs["throughput"] > 0
    ours = next(p for p in seen["watch"][1]["points"] if p["id"] == FIRST)["summary"]
    other = alone["points"][0]["summary"]
    assert set(ours) == set(other) and ours["world_size"] == other["world_size"] == 1
    assert ours["global_batch_size"] == other["global_batch_size"] == 512
    assert alone_rep["node_sets"]["allocation"] is False and rep["node_sets"]["allocation"] is True
    sets = rep["node_sets"]
    assert set(sets["points"]) == {FIRST, "g2-n2x1-r0", "g2-n1x2-r0"}
    assert sets["points"]["g2-n2x1-r0"].startswith(sets["points"][FIRST] + ",")
    assert sets["shared"] is True
    markdown = open(os.path.join(seen["dir"], "report", "scaling.md")).read()
    assert "node sets:" in markdown and "one node set" in markdown
