"""A preprocess -> train -> evaluate chain built and submitted with the Python API alone, and
the CLI building the same chain from its flags (both go through jobs.planning.request.build_chain)."""

import pytest

from jobs.api import build_chain, submit
from jobs.cli import build_parser, requests_from_args
from jobs.errors import RequestError

CHAIN = dict(dataset="movielens", preprocess_from="/raw/ml", data_path="/data/ml", then_evaluate=True,
             profile="ci", nodes=1, gpus_per_node=1, time="5")


@pytest.mark.fast
def test_cli_and_api_build_the_same_chain():
    api_chain = build_chain("train", "hello", engine_args=["--sleep", "1"], after=["12,13"], **CHAIN)
    args = build_parser().parse_args(
        ["train", "--profile", "ci", "--model", "hello", "--dataset", "movielens", "--preprocess-from",
         "/raw/ml", "--data-path", "/data/ml", "--then-evaluate", "--nodes", "1", "--gpus-per-node", "1",
         "--time", "5", "--after", "12,13"])
    args.kind = args.command
    assert requests_from_args(args, ["--sleep", "1"]) == api_chain
    assert [r.kind for r in api_chain] == ["preprocess", "train", "evaluate"]
    assert api_chain[0].after == ["12", "13"] and api_chain[1].after == []
    assert api_chain[1].engine_args == ["--data-path", "/data/ml", "--sleep", "1"]
    with pytest.raises(RequestError, match="--preprocess-from: needs --data-path"):
        build_chain("train", "hello", preprocess_from="/raw", profile="ci")
    with pytest.raises(RequestError, match="unknown field 'gpus'"):
        build_chain("train", "hello", gpus=2)


@pytest.mark.slurm
def test_api_chain_is_three_jobs_with_afterok_in_slurm(slurm_env, tmp_path):
    # a held job in front keeps the whole chain pending, so Slurm shows every dependency
    held = slurm_env.run(["sbatch", "--parsable", "--hold", "-p", "debug", "-t", "1", "-o", "/dev/null",
                          "--wrap", "true"], check=True).stdout.strip().split(";")[0]
    chain = build_chain("train", "hello", after=[held], **CHAIN)
    record = submit(chain, "ci", runs_dir=str(tmp_path / "runs"), log=None)
    try:
        assert [j.key for j in record.jobs] == ["preprocess", "train", "evaluate"]
        ids = [j.job_id for j in record.jobs]
        out = slurm_env.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%E|%j"], check=True).stdout
        deps = {line.split("|")[0]: line.split("|")[1:] for line in out.splitlines()}
        waits_for = [held] + ids[:2]
        for job_id, before in zip(ids, waits_for):
            dependency, _name = deps[job_id]
            assert dependency.startswith(f"afterok:{before}"), (job_id, dependency)
        assert [deps[i][1] for i in ids] == ["preprocess-movielens", "train-hello", "evaluate-hello"]
        assert [j.after_ok for j in record.jobs] == [[held], [ids[0]], [ids[1]]]
        script = open(record.jobs[0].script).read()
        assert "-m preproc movielens run --input /raw/ml --output /data/ml" in script
    finally:
        slurm_env.run(["scancel", held] + [j.job_id for j in record.jobs])
