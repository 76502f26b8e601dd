"""One placement decision (issue 20): the plan checked before TensorFlow starts is the plan the
embedding layer holds and the plan the `placement` log record shows, for every group; one table
list (recsys.models.embedding_tables) gives the widths the layers build; an evaluation's summary is a
full version-2 summary and does not say that training continues."""
import numpy as np
import pytest

from conftest import SMALL, read_log, records, run_train, summary
from recsys.placement.decision import plan_for_group
from recsys.train import build_parser, resolve

# The issue's example: with rmsprop the old check (weights + slots against the thresholds)
# replicated 2 tables and the layer (weights only) 3, with different column slices.
CARDS = [1000, 500, 100, 50, 20, 3000, 10, 200, 300, 100]
THRESHOLDS = ["--data-parallel-threshold", "1000", "--column-slice-threshold", "10000"]

# The 16 features of the reference Outbrain set, whose deep widths differ (128 / 19 / 64).
ONEHOT = ["document_id", "ad_id", "document_id_promo", "campaign_id", "platform", "source_id_promo", "source_id",
          "geo_location", "advertiser_id", "geo_location_state", "publisher_id_promo", "publisher_id",
          "geo_location_country"]
MULTIHOT = ["topic_id_list", "entity_id_list", "category_id_list"]


class StubHvd:
    """The two calls the alltoall layer makes while it is built: a rank of a job of ``size``."""

    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


class ChiefOf:
    def __init__(self, size):
        self.size, self.is_chief = size, True


@pytest.fixture(scope="module")
def issue_data(tmp_path_factory):
    from recsys.data import synthetic
    out = tmp_path_factory.mktemp("issue-example")
    synthetic.generate(synthetic.default_spec("dlrm", cardinalities=CARDS), str(out), {"train": 1024, "test": 256},
                       seed=3)
    return out


def _issue_config(data, optimizer, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    return resolve(build_parser().parse_args(
        ["--model", "dlrm", "--data-path", str(data), "--embedding-dim", "16", "--bottom-mlp", "32,16",
         "--top-mlp", "16,1", "--batch-size", "256", "--embedding-placement", "model_parallel", "--optimizer",
         optimizer, "--embedding-memory-gb", "10", *THRESHOLDS]))


def _cut(plan):
    return [(s.table, s.rank, s.col_start, s.col_end, s.replicated) for s in plan.slices]


@pytest.mark.parametrize("optimizer", ["rmsprop", "adam", "sgd"])
def test_issue_example_one_plan_in_the_check_the_layer_and_the_record(issue_data, optimizer, monkeypatch, tmp_path):
    from recsys.embeddings.group import EmbeddingGroup
    from recsys.monitoring.logger import RunLogger
    from recsys.train import _log_placement

    config = _issue_config(issue_data, optimizer, monkeypatch)
    placement = config.placement
    assert placement.model_parallel and placement.world_size == 4
    (group,) = config.embedding_groups
    plan = placement.plan("embeddings")
    # the check: thresholds in elements, whatever the optimizer
    assert sorted(group.tables[t].rows for t in {s.table for s in plan.slices if s.replicated}) == [10, 20, 50]
    assert _cut(plan) == _cut(plan_for_group(CARDS, [16] * 10, 4, 10000, 1000))
    # the memory estimate counts the optimizer's slots on that same plan
    slots = {"sgd": 0, "rmsprop": 1, "adam": 2}[optimizer]
    assert sum(s.nbytes for s in plan.slices if not s.replicated) == sum(
        (s.col_end - s.col_start) * s.rows * 4 * (1 + slots) for s in plan.slices if not s.replicated)
    # the layer of every rank holds the config's plan itself (it does not plan) and builds its share
    for rank in range(4):
        layer = EmbeddingGroup(group, placement, hvd=StubHvd(4, rank))
        assert layer._mp.plan is plan
        layer._mp.build(None)
        held = sorted((t, c0, c1) for t, c0, c1 in layer._mp.shard_map())
        assert held == sorted((s.table, s.col_start, s.col_end) for s in plan.slices
                              if s.rank == rank and not s.replicated)
        assert [v.shape[0] for v in layer._mp.dp_tables.values()] == [50, 20, 10]
    # the log record
    log = RunLogger(tmp_path / "log.jsonl", console=open("/dev/null", "w"))
    _log_placement(config, ChiefOf(4), log)
    log.close()
    (record,) = records(read_log(tmp_path / "log.jsonl"), "placement")
    (logged,) = record["groups"]
    assert logged["slices"] == [[s.name, s.rank, s.col_start, s.col_end, s.rows, s.nbytes] for s in plan.slices]
    assert logged["replicated_tables"] == ["cat_3", "cat_4", "cat_6"]
    assert record["rank_bytes"] == placement.rank_bytes and record["implementation"] == "horovod-alltoall"
    assert (record["column_slice_threshold"], record["data_parallel_threshold"]) == (10000, 1000)


def test_a_layer_refuses_a_plan_of_another_world_size(issue_data, monkeypatch):
    from recsys.embeddings.group import EmbeddingGroup
    config = _issue_config(issue_data, "sgd", monkeypatch)
    with pytest.raises(ValueError, match="on 4 ranks given to 10 tables on 2 ranks"):
        EmbeddingGroup(config.embedding_groups[0], config.placement, hvd=StubHvd(2, 0))


@pytest.fixture(scope="module")
def reference_wide_deep(tmp_path_factory):
    """A small Wide & Deep dataset whose features are the 16 of the reference Outbrain set."""
    from recsys.data import synthetic
    from recsys.features.spec import FeatureSpec
    spec = synthetic.default_spec("wide_deep", cardinalities=[40 + i for i in range(len(ONEHOT))],
                                  multihot={name: (30, 3) for name in MULTIHOT}).to_dict()
    rename = {f"onehot_{i}": name for i, name in enumerate(ONEHOT)}
    spec["feature_spec"] = {rename.get(k, k): v for k, v in spec["feature_spec"].items()}
    for chunks in spec["source_spec"].values():
        for chunk in chunks:
            chunk["features"] = [rename.get(f, f) for f in chunk["features"]]
    spec["channel_spec"] = {ch: [rename.get(f, f) for f in fs] for ch, fs in spec["channel_spec"].items()}
    out = tmp_path_factory.mktemp("wd-reference")
    synthetic.generate(FeatureSpec(**spec), str(out), {"train": 1024, "test": 512}, seed=5)
    return out


def test_wide_deep_record_lists_every_group_with_the_widths_the_run_built(reference_wide_deep, tmp_path):
    """A real run: its `placement` record has the deep and the wide group, 32 tables, with the
    recipe's per-feature widths, and those are the widths of the tables in its checkpoint."""
    from recsys.checkpoints.contents import checkpoint_weights
    log, ck = tmp_path / "log.jsonl", tmp_path / "ck"
    res = run_train(["--model", "wide_deep", "--data-path", reference_wide_deep, "--embedding-dim", "64",
                     "--deep-hidden-units", "16", "--batch-size", "256", "--eval-batch-size", "512", "--epochs", "1",
                     "--max-steps", "2", "--log-path", log, "--checkpoint-dir", ck])
    assert res.returncode == 0, res.stderr[-3000:]
    (record,) = records(read_log(log), "placement")
    groups = {g["name"]: g for g in record["groups"]}
    assert sorted(groups) == ["deep_embeddings", "wide_embeddings"]
    deep = {name: width for name, _, width, _ in groups["deep_embeddings"]["tables"]}
    assert len(deep) == 16 and sum(deep.values()) == 1235
    assert (deep["document_id"], deep["platform"], deep["geo_location"]) == (128, 19, 64)
    assert [width for _, _, width, _ in groups["wide_embeddings"]["tables"]] == [1] * 16
    assert {c for _, _, _, c in groups["deep_embeddings"]["tables"]} == {None, "sum"}
    weights = checkpoint_weights(str(sorted(ck.glob("ckpt-*"))[-1]))
    for name, group in groups.items():
        built = [weights[f"table:{name}/{t}"].shape for t in range(len(group["tables"]))]
        assert built == [(rows, width) for _, rows, width, _ in group["tables"]], name
    params = records(read_log(log), "params")[0]
    assert [tuple(t) for t in params["embedding_tables"]] == [
        (t[0], t[1], t[2]) for name in ("deep_embeddings", "wide_embeddings") for t in groups[name]["tables"]]


def test_evaluation_summary_is_complete_and_does_not_continue_training(tiny_data, tmp_path):
    data = tiny_data("dlrm")
    ck, train_log, eval_log = tmp_path / "ck", tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    res = run_train(["--model", "dlrm", "--data-path", data, *SMALL["dlrm"], "--epochs", "1", "--max-steps", "3",
                     "--checkpoint-dir", ck, "--log-path", train_log])
    assert res.returncode == 0, res.stderr[-3000:]
    res = run_train(["--model", "dlrm", "--data-path", data, *SMALL["dlrm"], "--run-mode", "evaluate",
                     "--checkpoint-dir", ck, "--log-path", eval_log])
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_log(eval_log)
    s = summary(recs)
    assert s["summary_version"] == 3 and s["world_size"] == 1 and s["mode"] == "evaluate"
    assert s["step"] == s["eval_step"] == 3 and s["evaluated_checkpoint"] == str(ck / "ckpt-0000000003")
    assert s["checkpoint"] is None          # an evaluation writes none
    assert s["global_batch_size"] == 1024 and np.isfinite(s["auc"])
    assert s["auc"] == pytest.approx(summary(read_log(train_log))["auc"], abs=1e-9)
    messages = [r["message"] for r in records(recs, "info")]
    restored = [m for m in messages if m.startswith("restored ")]
    assert restored == [f"restored {ck / 'ckpt-0000000003'} at step 3 epoch 0"]
    assert not any("training continues" in m for m in messages) and "training continues" not in res.stderr
