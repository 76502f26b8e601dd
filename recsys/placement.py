"""``python -m recsys.placement``: where a model's embedding tables would live, and whether they fit.

Without TensorFlow or a GPU, before asking for GPUs: the tables of recsys.models.embedding_tables,
placed by recsys.embeddings.placement as ``recsys-train`` places them with the same flags.

    python -m recsys.placement --model dlrm --feature-spec F --gpus 8 --gpu-memory-gb 80
"""
from __future__ import annotations

import argparse
import sys

from recsys.embeddings.placement import OPTIMIZER_SLOTS, place, slots
from recsys.models.defaults import MODEL_DEFAULTS
from recsys.models.embedding_tables import dense_params, model_groups, spec_channels


def _parse(argv):
    p = argparse.ArgumentParser(
        prog="python -m recsys.placement",
        description="Show where the embedding tables of a model would live and whether they fit the GPUs "
                    "(the plan recsys-train makes with the same flags).")
    p.add_argument("--model", choices=["dlrm", "wide_deep", "ncf"], default="dlrm")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--feature-spec", help="feature_spec.yaml giving the categorical cardinalities")
    src.add_argument("--cardinalities", help="comma-separated table sizes instead of a feature spec "
                                             "(NCF: users,items)")
    p.add_argument("--gpus", type=int, default=8, help="total ranks (GPUs) in the job (default 8)")
    p.add_argument("--gpu-memory-gb", type=float, default=80.0,
                   help="usable memory per GPU in GB (default 80)")
    p.add_argument("--memory-fraction", type=float, default=0.9,
                   help="fraction of GPU memory the plan may use (default 0.9, rest for activations)")
    p.add_argument("--embedding-dim", type=int, default=None,
                   help="embedding width (NCF: --factors; default: the model's reference default)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZER_SLOTS), default=None,
                   help="the run's --optimizer (sets the slot count; default: the model's)")
    p.add_argument("--column-slice-threshold", type=int, default=None,
                   help="split tables with more than N elements by columns, as recsys-train (default: none)")
    p.add_argument("--data-parallel-threshold", type=int, default=None,
                   help="keep tables with fewer than N elements replicated on every rank, as recsys-train")
    p.add_argument("--replicated", action="store_true",
                   help="plan without model parallelism (every rank holds every table)")
    return p.parse_args(argv)


def _channels(args):
    if args.feature_spec:
        from recsys.feature_spec import FeatureSpec
        return spec_channels(args.model, FeatureSpec.from_yaml(args.feature_spec))
    cards = [int(x) for x in args.cardinalities.split(",") if x.strip()]
    if args.model == "ncf":
        if len(cards) != 2:
            raise ValueError("--model ncf takes --cardinalities USERS,ITEMS")
        return {"user_ch": [("user", cards[0])], "item_ch": [("item", cards[1])]}
    channel = "categorical" if args.model == "dlrm" else "onehot_categorical"
    return {channel: [(f"cat_{i}", c) for i, c in enumerate(cards)]}


def main(argv=None):
    args = _parse(argv)
    defaults = MODEL_DEFAULTS[args.model]
    optimizer = args.optimizer or defaults["optimizer"]
    dim = args.embedding_dim or defaults["factors" if args.model == "ncf" else "embedding_dim"]
    try:
        groups = model_groups(args.model, _channels(args), embedding_dim=dim, factors=dim,
                              layers=defaults.get("layers"), combiner=defaults.get("combiner", "sum"),
                              optimizer=optimizer)
    except (OSError, ValueError) as e:
        print(f"recsys.placement: error: {e}", file=sys.stderr)
        return 2
    if args.replicated or args.gpus == 1 or args.model == "ncf":      # recsys-train never spreads NCF's tables
        mode, reason = "replicated", "--replicated" if args.replicated else f"--model {args.model} on {args.gpus} GPU(s)"
    else:
        mode, reason = "model_parallel", "--embedding-placement model_parallel"
    dense = dense_params(args.model, groups, **({"factors": dim} if args.model == "ncf" else {}))
    placement = place(mode, reason, args.gpus, groups,
                      dense_params=dense, dense_slots=slots(optimizer),
                      budget_bytes=int(args.gpu_memory_gb * 1e9 * args.memory_fraction),
                      column_slice_threshold=args.column_slice_threshold,
                      data_parallel_threshold=args.data_parallel_threshold)
    print("\n".join(placement.describe()))
    return 0 if placement.fits else 1


if __name__ == "__main__":
    sys.exit(main())
