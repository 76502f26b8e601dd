"""``python -m recsys.place_tables``: where a model's embedding tables would live, and whether they fit.

Without TensorFlow or a GPU, before asking for GPUs: the tables of recsys.models.embedding_tables,
placed by recsys.placement.decision as ``recsys-train`` places them with the same flags.

    python -m recsys.place_tables --model dlrm --feature-spec F --gpus 8 --gpu-memory-gb 80

Prints every table group's tables on every rank, each rank's memory and ``fits`` / ``DOES NOT FIT``.
Exit codes: 0 fits; 1 does not fit (and one line on stderr saying how many GPUs would fit it);
2 bad input (one line on stderr, no traceback).
"""
from __future__ import annotations

import argparse
import sys

from recsys.models.defaults import MODEL_DEFAULTS
from recsys.models.embedding_tables import dense_params, model_groups, spec_channels
from recsys.placement.decision import IMPLEMENTATIONS, OPTIMIZER_SLOTS, place, slots
from recsys.placement.planner import PlacementError
from slurm.common.errors import ToolkitError

PROG = "python -m recsys.place_tables"
# The largest job the "would fit on N GPUs" search considers.
MAX_GPUS = 1 << 16


class InputError(ToolkitError, ValueError):
    """Bad command-line input: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):           # argparse's usage block is not one line
        raise InputError(message)


def _parse(argv):
    p = _Parser(
        prog=PROG,
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
    p.add_argument("--embedding-implementation", choices=IMPLEMENTATIONS, default=IMPLEMENTATIONS[0],
                   help="the run's model-parallel layer, as recsys-train (distributed-embeddings keeps a group "
                        "it cannot spread over every rank data parallel)")
    args = p.parse_args(argv)
    _check(args)
    return args


def _check(args):
    """Every value a plan needs, checked: InputError with a one-line message naming the flag."""
    if args.gpus < 1:
        raise InputError(f"--gpus must be >= 1, got {args.gpus}")
    if args.gpus > MAX_GPUS:
        raise InputError(f"--gpus must be <= {MAX_GPUS}, got {args.gpus}")
    if not args.gpu_memory_gb > 0:
        raise InputError(f"--gpu-memory-gb must be > 0, got {args.gpu_memory_gb:g}")
    if not 0 < args.memory_fraction <= 1:
        raise InputError(f"--memory-fraction must be in (0, 1], got {args.memory_fraction:g}")
    for flag in ("embedding_dim", "column_slice_threshold", "data_parallel_threshold"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise InputError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")


def _cardinalities(text):
    cards = []
    for k, field in enumerate(text.split(",")):
        try:
            value = int(field.strip())
        except ValueError:
            raise InputError(f"--cardinalities: {field.strip()!r} (table {k}) is not an integer") from None
        if value < 1:
            raise InputError(f"--cardinalities: table {k} has {value} rows, must be >= 1")
        cards.append(value)
    return cards


def _channels(args):
    if args.feature_spec:
        from recsys.features.spec import FeatureSpec
        return spec_channels(args.model, FeatureSpec.from_yaml(args.feature_spec))
    cards = _cardinalities(args.cardinalities)
    if args.model == "ncf":
        if len(cards) != 2:
            raise InputError("--model ncf takes --cardinalities USERS,ITEMS")
        return {"user_ch": [("user", cards[0])], "item_ch": [("item", cards[1])]}
    channel = "categorical" if args.model == "dlrm" else "onehot_categorical"
    return {channel: [(f"cat_{i}", c) for i, c in enumerate(cards)]}


def _placement(args, groups, dense, optimizer, gpus, mode=None):
    if mode is None:
        mode = "replicated" if (args.replicated or gpus == 1 or args.model == "ncf") else "model_parallel"
    # recsys-train never spreads NCF's tables
    reason = ("--replicated" if args.replicated else f"--model {args.model} on {gpus} GPU(s)"
              if mode == "replicated" else "--embedding-placement model_parallel")
    return place(mode, reason, gpus, groups, dense_params=dense, dense_slots=slots(optimizer),
                 budget_bytes=int(args.gpu_memory_gb * 1e9 * args.memory_fraction),
                 column_slice_threshold=args.column_slice_threshold,
                 data_parallel_threshold=args.data_parallel_threshold,
                 implementation=args.embedding_implementation)


def gpus_that_fit(fits, start):
    """The smallest GPU count above ``start`` for which ``fits(n)`` holds (None up to MAX_GPUS):
    doubling, then a bisection, then a check of the neighbours below the answer."""
    hi = start + 1
    while not fits(hi):
        if hi >= MAX_GPUS:
            return None
        hi = min(2 * hi, MAX_GPUS)
    lo = max(start, hi // 2)                     # fits(lo) is False or lo == start
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def _does_not_fit(args, groups, dense, optimizer, placement):
    """The one stderr line of a plan that does not fit: what it needs, and the GPUs that would fit it."""
    need = max(placement.rank_bytes) / 1e9
    usable = placement.capacity_bytes / 1e9
    head = f"does not fit: a rank needs {need:.3f} GB of the {usable:.3f} GB usable per GPU " \
           f"(--gpu-memory-gb {args.gpu_memory_gb:g} x --memory-fraction {args.memory_fraction:g})"
    if args.replicated or args.model == "ncf":
        why = "--replicated" if args.replicated else "--model ncf keeps its tables on every rank"
        return f"{head}; more GPUs do not help ({why}): every rank holds every table"
    n = gpus_that_fit(lambda g: _placement(args, groups, dense, optimizer, g, "model_parallel").fits, args.gpus)
    if n is None:
        return f"{head}; no job of up to {MAX_GPUS} GPUs fits it (a table's columns cannot be split further)"
    return f"{head}; {n} GPUs would fit it (--gpus {n})"


def main(argv=None):
    try:
        args = _parse(argv)
        defaults = MODEL_DEFAULTS[args.model]
        optimizer = args.optimizer or defaults["optimizer"]
        dim = args.embedding_dim if args.embedding_dim is not None else \
            defaults["factors" if args.model == "ncf" else "embedding_dim"]
        groups = model_groups(args.model, _channels(args), embedding_dim=dim, factors=dim,
                              layers=defaults.get("layers"), combiner=defaults.get("combiner", "sum"),
                              optimizer=optimizer)
        dense = dense_params(args.model, groups, **({"factors": dim} if args.model == "ncf" else {}))
        placement = _placement(args, groups, dense, optimizer, args.gpus)
        print("\n".join(placement.describe()))
        if placement.fits:
            return 0
        print(f"{PROG}: {_does_not_fit(args, groups, dense, optimizer, placement)}", file=sys.stderr)
        return 1
    except (InputError, PlacementError, OSError, ValueError, KeyError) as e:
        message = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"{PROG}: error: {message.splitlines()[0] if message else type(e).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
