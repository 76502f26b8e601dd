"""``python -m recsys.plan_tables``: what recsys-train would build for a command line on N ranks,
as JSON, without TensorFlow: the tables, the placement, the dense parameters.

The submission layer projects a study onto GPU counts it never ran (``recsys-submit study
project``); it knows the engine only as commands, so it asks this one. Every figure comes from
the engine's own derivation (recsys.configuration.train_config.TrainConfig.from_args: the parser, the model's
defaults, the feature spec or the synthetic one, the placement recsys-train applies), so the
projection and the run cannot disagree on what lives where.

stdin:  {"points": [{"world_size": N, "argv": [recsys-train flags ...]}, ...]}, or a table list the
        engine's placement rule (recsys.placement.decision.plan_for_group) spreads as one group:
        {"tables": [[name, rows, width, ids per sample, outputs per sample], ...], "world_sizes": [N, ...],
         "dense_params": P, "implementation": "horovod-alltoall" | "distributed-embeddings",
         "dp_input": true (ids exchanged; false: every rank reads its own tables' ids, 0 id bytes),
         "optimizer_slots": k, "model_parallel": true, "column_slice_threshold": null,
         "data_parallel_threshold": null}
stdout: {"<N>": {"mode", "model_parallel", "sparse_as_dense", "dense_params", "dense_bytes",
                  "rank_bytes": [...], "capacity_bytes",
                  "tables": [[group, name, rows, width, ids per sample, id_bytes, mp, outputs], ...],
                  "slices": [[table index, rank, col_start, col_end], ...]}}   (model-parallel tables)
Exit 2 with one line on stderr on bad input.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from recsys.configuration.flags import build_parser
from recsys.configuration.train_config import TrainConfig
from recsys.errors import EngineError

WORLD_ENV = "WORLD_SIZE"        # the first variable recsys.runtime.distributed.launcher_world_size reads


def _spec(cfg):
    if cfg.feature_spec:
        from recsys.features.spec import FeatureSpec
        return FeatureSpec.from_yaml(cfg.feature_spec)
    from recsys.data.synthetic import default_spec
    return default_spec(cfg.model)


def describe(argv, world_size):
    """The engine's tables, placement and dense size for `argv` on `world_size` ranks."""
    from recsys.features.spec import categorical_dtype
    os.environ[WORLD_ENV] = str(int(world_size))
    # the flags checked as on a submit host (no data read: a login node projects without it),
    # then the engine's own tables and placement from the feature spec (the dataset's, or the
    # synthetic one)
    cfg = TrainConfig.for_submission(build_parser().parse_args(list(argv)), int(world_size), check_data=False)
    if not cfg.feature_spec and cfg.data_path:
        path = os.path.join(cfg.data_path, "feature_spec.yaml")
        if not os.path.isfile(path):
            raise ValueError(f"--data-path {cfg.data_path}: no feature_spec.yaml in it")
        cfg = dataclasses.replace(cfg, feature_spec=path)
    cfg = cfg._with_placement()
    spec = _spec(cfg)
    placement = cfg.placement
    tables, slices = [], []
    for group, plan in placement.groups:
        mp = placement.model_parallel and not placement.data_parallel_group(group.name)
        base = len(tables)
        for t in group.tables:
            hot = spec.hotness(t.feature) if t.feature in spec.feature_spec else 1
            id_bytes = 8 if categorical_dtype(t.rows) == "int64" else 4
            tables.append([group.name, t.name, t.rows, t.width, int(hot), id_bytes, bool(mp), 1])
        if mp:
            slices += [[base + s.table, s.rank, s.col_start, s.col_end] for s in plan.slices if not s.replicated]
    return {"mode": placement.mode, "model_parallel": placement.model_parallel,
            "sparse_as_dense": bool(cfg.sparse_as_dense), "dense_params": int(cfg.dense_parameters),
            "dense_bytes": int(placement.dense_bytes), "rank_bytes": list(placement.rank_bytes),
            "capacity_bytes": placement.capacity_bytes, "batch_size": cfg.batch_size,
            "tables": tables, "slices": slices}


def describe_tables(request, world_size):
    """The same description for an explicit table list placed as one group."""
    from recsys.features.spec import categorical_dtype
    from recsys.placement.decision import BYTES_PER_PARAM, plan_for_group
    tables = request["tables"]
    slots = int(request.get("optimizer_slots", 0))
    mp = bool(request.get("model_parallel", True)) and world_size > 1
    plan = plan_for_group([int(t[1]) for t in tables], [int(t[2]) for t in tables], int(world_size),
                          request.get("column_slice_threshold"), request.get("data_parallel_threshold"),
                          names=[str(t[0]) for t in tables], optimizer_slots=slots, model_parallel=mp,
                          implementation=request.get("implementation") or "horovod-alltoall")
    dense = int(request.get("dense_params", 0))
    dense_bytes = dense * BYTES_PER_PARAM * (1 + slots)
    replicated = {s.table for s in plan.slices if s.replicated}
    return {"mode": "model_parallel" if mp else "replicated", "model_parallel": mp, "sparse_as_dense": False,
            "dense_params": dense, "dense_bytes": dense_bytes,
            "rank_bytes": [b + dense_bytes for b in plan.embedding_bytes], "capacity_bytes": None,
            "tables": [["tables", str(t[0]), int(t[1]), int(t[2]), int(t[3]),
                        0 if not request.get("dp_input", True) else
                        8 if categorical_dtype(int(t[1])) == "int64" else 4, mp and i not in replicated,
                        int(t[4]) if len(t) > 4 else 1]
                       for i, t in enumerate(tables)],
            "slices": [[s.table, s.rank, s.col_start, s.col_end] for s in plan.slices if mp and not s.replicated]}


def main(argv=None):
    # no flags: --help prints this module's description (the stdin and stdout formats) and exits 0
    argparse.ArgumentParser(prog="python -m recsys.plan_tables", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    try:
        request = json.load(sys.stdin)
        if "tables" in request:
            out = {str(n): describe_tables(request, int(n)) for n in request["world_sizes"]}
        else:
            out = {str(p["world_size"]): describe(p["argv"], p["world_size"]) for p in request["points"]}
        json.dump(out, sys.stdout)
        return 0
    except SystemExit as exc:       # the parser's error exit: its message is on stderr already
        return 2 if exc.code else 0
    except (EngineError, ValueError, KeyError, TypeError, OSError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"python -m recsys.plan_tables: error: {text}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
