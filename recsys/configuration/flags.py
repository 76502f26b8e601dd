"""recsys-train's command line: the flags, their types and help, and the parser the submission layer
checks a job's engine arguments with (one line instead of an exit).

Pure Python that imports no TensorFlow: ``recsys-submit`` parses a job's arguments with it on the
login node, and ``python -m recsys.train --help`` answers before TensorFlow starts.
"""
from __future__ import annotations

import argparse
import sys

from recsys.errors import EngineError
from recsys.models.defaults import MODEL_DEFAULTS
from recsys.placement.decision import IMPLEMENTATIONS

MODELS = ("dlrm", "wide_deep", "ncf")
MODES = ("train", "evaluate", "predict", "benchmark", "inference")
EVALUATE_CHECKPOINTS = ("best", "latest")
AFFINITY = ("off", "all", "exclusive", "unique_contiguous", "unique_interleaved", "numa")
PROG = "recsys-train"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + line
        print(f"{PROG}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


class _SubmissionParser(_Parser):
    def error(self, message):  # recsys-submit reports it, naming the engine arguments
        raise EngineError(f"engine arguments (after `--`): {message}")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only when there is one (None/False mean 'model default' or 'off')."""

    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


class _DeprecatedMode(argparse.Action):
    """`--mode`, the old name of `--run-mode` (renamed: `recsys-submit preprocess --mode` is the
    preprocessing mode); still accepted, with one warning line."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{PROG}: warning: --mode is deprecated; use --run-mode {values}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _ints(text):
    try:
        out = [int(x) for x in str(text).replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}")
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return out


def _ranks(text):
    """``all`` or comma-separated ranks (--tensorboard-ranks, --profile-ranks)."""
    if str(text).strip() == "all":
        return "all"
    try:
        out = tuple(sorted({int(x) for x in str(text).replace(",", " ").split()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all' or ranks separated by commas, got {text!r}")
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected 'all' or ranks >= 0, got {text!r}")
    return out


def _step_range(text):
    """START-END, global steps from 1, inclusive (--profile-steps)."""
    start, sep, end = str(text).partition("-")
    try:
        start, end = int(start), int(end if sep else start)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START-END (steps), got {text!r}")
    if start < 1 or end < start:
        raise argparse.ArgumentTypeError(f"expected 1 <= START <= END, got {text!r}")
    return (start, end)


def _ref(key, fmt=None):
    vals = []
    for m in MODELS:
        v = MODEL_DEFAULTS[m].get(key)
        if v is not None:
            vals.append(f"{m} {','.join(map(str, v)) if isinstance(v, list) else v}")
    return "reference default: " + "; ".join(vals) if vals else ""


def build_parser(parser_class=_Parser):
    p = parser_class(prog=PROG, description="Train, evaluate or benchmark DLRM, Wide & Deep or NCF (NeuMF) on a "
                "feature-spec dataset, one process per rank (Horovod when several ranks). Defaults left "
                "unset take the model's reference value, or a small value with --synthetic.",
                formatter_class=_Formatter)
    g = p.add_argument_group("run")
    g.add_argument("--model", required=True, choices=MODELS, help="model to build")
    g.add_argument("--run-mode", dest="mode", choices=MODES, default="train",
                   help="train (epochs, eval and checkpoint per epoch); evaluate (metrics of a checkpoint); "
                        "predict (a checkpoint's score of every test row, written to --predictions); "
                        "benchmark (timed training steps after warm-up); inference (timed forward passes)")
    g.add_argument("--mode", dest="mode", choices=MODES, action=_DeprecatedMode, help=argparse.SUPPRESS)
    g.add_argument("--seed", type=int, default=12345, help="seed of weights, shuffling and negatives")
    g.add_argument("--log-path", help="append JSON-lines records (params, steps, eval, summary) to this file")
    g.add_argument("--log-every", type=int, default=10, help="write a step record every N steps")
    d = p.add_argument_group("data")
    d.add_argument("--data-path", help="directory holding feature_spec.yaml and the data it lists")
    d.add_argument("--feature-spec", help="feature spec YAML (default: DATA_PATH/feature_spec.yaml)")
    d.add_argument("--synthetic", action="store_true",
                   help="generate a small synthetic dataset for the model (under --checkpoint-dir, next to "
                        "--log-path, or in a temporary directory) when no --data-path is given; small model sizes")
    d.add_argument("--synthetic-rows", type=int, help="training rows of the synthetic dataset (test: a quarter)")
    d.add_argument("--reader", choices=("tfdata", "merlin"), default="tfdata",
                   help="tfdata (default) or merlin: the Merlin dataloader over parquet mappings, e.g. NVTabular "
                        "output (pip install .[nvtabular]; docs/data.md)")
    t = p.add_argument_group("training")
    t.add_argument("--batch-size", type=int, help="GLOBAL batch size (split evenly over ranks); " + _ref("batch_size"))
    t.add_argument("--eval-batch-size", type=int, help="global evaluation batch size; " + _ref("eval_batch_size"))
    t.add_argument("--epochs", type=int, help="training epochs; " + _ref("epochs"))
    t.add_argument("--max-steps", type=int, default=0, help="stop after this many global steps (0: no limit)")
    t.add_argument("--lr", type=float, help="learning rate (W&D: the deep part); " + _ref("lr"))
    t.add_argument("--warmup-steps", type=int,
                   help="linear LR warm-up steps (W&D default: --deep-warmup-epochs); " + _ref("warmup_steps"))
    t.add_argument("--optimizer", choices=("sgd", "adagrad", "adam", "rmsprop"),
                   help="optimizer (W&D: the deep part; the wide part is FTRL); " + _ref("optimizer"))
    p_d = p.add_argument_group("DLRM")
    p_d.add_argument("--embedding-dim", type=int, help="embedding width; " + _ref("embedding_dim"))
    p_d.add_argument("--bottom-mlp", type=_ints, help="bottom MLP widths, last = embedding dim; " + _ref("bottom_mlp"))
    p_d.add_argument("--top-mlp", type=_ints, help="top MLP widths, last = 1; " + _ref("top_mlp"))
    p_d.add_argument("--interaction", choices=("dot", "cat"), default="dot", help="feature interaction")
    p_d.add_argument("--decay-start-step", type=int, help="step where polynomial LR decay starts; " + _ref("decay_start_step"))
    p_d.add_argument("--decay-steps", type=int, help="length of the LR decay (0: none); " + _ref("decay_steps"))
    p_d.add_argument("--decay-power", type=float, help="power of the polynomial decay; " + _ref("decay_power"))
    w = p.add_argument_group("Wide & Deep")
    w.add_argument("--linear-lr", type=float, help="FTRL learning rate of the wide part; " + _ref("linear_lr"))
    w.add_argument("--deep-hidden-units", type=_ints, help="deep MLP widths; " + _ref("deep_hidden_units"))
    w.add_argument("--deep-dropout", type=float, help="dropout in the deep MLP; " + _ref("deep_dropout"))
    w.add_argument("--deep-warmup-epochs", type=float, help="deep LR warm-up in epochs; " + _ref("deep_warmup_epochs"))
    w.add_argument("--combiner", choices=("sum", "mean"), help="multi-hot combiner; " + _ref("combiner"))
    n = p.add_argument_group("NCF")
    n.add_argument("--factors", type=int, help="GMF factors; " + _ref("factors"))
    n.add_argument("--layers", type=_ints, help="MLP tower widths (first = user+item embeddings); " + _ref("layers"))
    n.add_argument("--dropout", type=float, help="MLP tower dropout; " + _ref("dropout"))
    n.add_argument("--negative-samples", type=int, help="training negatives per positive; " + _ref("negative_samples"))
    n.add_argument("--valid-negative", type=int, help="evaluation negatives per user; " + _ref("valid_negative"))
    n.add_argument("--topk", type=int, help="k of HR@k and NDCG@k; " + _ref("topk"))
    n.add_argument("--beta1", type=float, help="Adam beta1; " + _ref("beta1"))
    n.add_argument("--beta2", type=float, help="Adam beta2; " + _ref("beta2"))
    n.add_argument("--adam-eps", type=float, help="Adam epsilon; " + _ref("adam_eps"))
    pf = p.add_argument_group("performance and parallelism")
    pf.add_argument("--amp", action="store_true", help="mixed precision (mixed_float16 + dynamic loss scaling)")
    pf.add_argument("--device", choices=("auto", "cpu", "gpu"), default=None,
                    help="cpu: a CPU run even where GPUs were given (no GPU check); gpu: refuse when TensorFlow "
                         "sees no GPU; auto: refuse when Slurm / CUDA_VISIBLE_DEVICES / nvidia-smi give GPUs that "
                         "TensorFlow does not see (default: $RECSYS_DEVICE, else auto; recsys.runtime.devices)")
    pf.add_argument("--xla", action="store_true", help="XLA-compile the forward/backward pass (jit_compile)")
    pf.add_argument("--no-tf32", action="store_true", help="disable TF32 matmuls on Ampere+ (on by default)")
    pf.add_argument("--benchmark-warmup-steps", type=int, default=20,
                    help="steps excluded from throughput figures (benchmark/inference, and train summaries)")
    pf.add_argument("--benchmark-steps", type=int, default=100, help="timed steps in benchmark/inference mode")
    pf.add_argument("--breakdown-steps", type=int, default=0,
                    help="benchmark mode: after the timed steps, N more as a split step whose phases (input wait, "
                         "compute, embedding exchange, gradient exchange, optimizer) are timed one by one: the "
                         "summary's step_breakdown (0: none)")
    pf.add_argument("--steps-per-call", type=int, default=8,
                    help="training steps per compiled call on one rank (a call also ends at each --log-every "
                         "step and at --max-steps; signals are seen between calls); 1: one step per call. Runs "
                         "of several ranks always use 1 (docs/benchmarks.md)")
    pf.add_argument("--embedding-placement", choices=("auto", "replicated", "model_parallel"), default="auto",
                    help="model_parallel: each rank holds its share of the tables (recsys.embeddings), ids and "
                         "vectors exchanged with alltoall (--embedding-implementation); auto: model parallel when replicated tables do not fit --embedding-memory-gb")
    pf.add_argument("--embedding-memory-gb", type=float, default=None,
                    help="memory budget per rank for embeddings + dense weights (default: $RECSYS_EMBEDDING_MEMORY_GB "
                         "from the profile, else the job's or node's memory / ranks on the node)")
    pf.add_argument("--column-slice-threshold", type=int, default=None,
                    help="model-parallel: split tables with more elements than this by columns "
                         "(tables are also split automatically until memory is balanced)")
    pf.add_argument("--data-parallel-threshold", type=int, default=None,
                    help="model-parallel: keep tables with fewer elements than this replicated")
    pf.add_argument("--embedding-implementation", choices=IMPLEMENTATIONS, default=IMPLEMENTATIONS[0],
                    help="the model-parallel embedding layer: horovod-alltoall (this project's, CPU and GPU ranks) "
                         "or distributed-embeddings (NVIDIA's, GPU ranks; only when named here: a failing "
                         "import stops the run; docs/embeddings.md)")
    pf.add_argument("--sparse-as-dense", action="store_true",
                    help="allreduce embedding gradients densely instead of allgathering IndexedSlices")
    tb = p.add_argument_group("TensorBoard and profiler (docs/tensorboard.md)")
    tb.add_argument("--tensorboard-dir", metavar="DIR",
                    help="event files of the step, eval and summary figures, DIR/rank<k> per rank (default: "
                         "<--log-path's dir>/tensorboard/<its name>; none without either)")
    tb.add_argument("--no-tensorboard", action="store_true", help="write no event files")
    tb.add_argument("--tensorboard-ranks", type=_ranks, default="0", metavar="RANKS",
                    help="ranks that write event files: comma-separated, or all")
    tb.add_argument("--profile-steps", type=_step_range, metavar="START-END",
                    help="tf.profiler trace of global steps START to END (train, benchmark) into the TensorBoard "
                         "directory, one step per call inside the window")
    tb.add_argument("--profile-ranks", type=_ranks, default="all", metavar="RANKS",
                    help="ranks that trace --profile-steps: comma-separated, or all")
    pf.add_argument("--affinity", choices=AFFINITY, default="off",
                    help="CPU affinity of this rank when the launcher did not bind it (slurm/bind.sh does): "
                         "exclusive/unique_contiguous = contiguous equal share of the allowed CPUs per local rank, "
                         "unique_interleaved = round-robin share, numa = the NUMA node of the local rank, all/off = unchanged")
    pf.add_argument("--intra-op-threads", type=int, default=0, help="TF intra-op threads (0: TF default)")
    pf.add_argument("--inter-op-threads", type=int, default=0, help="TF inter-op threads (0: TF default)")
    pf.add_argument("--hang-timeout", type=float, default=None, metavar="SECONDS",
                    help="end the run (exit 86) when no step completes for this long, each rank naming where it "
                         "waits and dumping its stack (recsys.monitoring.watchdog; docs/reliability.md); 0: off (default: "
                         "$RECSYS_HANG_TIMEOUT from the profile's hang_timeout, else max(60 s, 20 x the slowest "
                         "step); at least 30 min before the first step and around evaluations and checkpoints)")
    c = p.add_argument_group("checkpoints")
    c.add_argument("--checkpoint-dir", help="save a checkpoint here after every epoch and on SIGUSR2 (then exit 0)")
    c.add_argument("--restore", action="store_true",
                   help="continue from the newest checkpoint in --checkpoint-dir (exact step); a fresh start if none")
    c.add_argument("--keep-checkpoints", type=int, default=3, help="checkpoints kept")
    c.add_argument("--early-stop-patience", type=int, metavar="N",
                   help="stop when N evaluations in a row (one per epoch) have not beaten the best of the run's "
                        "metric (AUC; NCF: HR@k) by more than --early-stop-min-delta; 0: never; default 0, 2 "
                        "on small data")
    c.add_argument("--early-stop-min-delta", type=float, metavar="D",
                   help="a gain over the best of at most D does not restart the early stop's count (it still "
                        "makes a new best); default 0, 0.001 on small data")
    c.add_argument("--keep-best", action=argparse.BooleanOptionalAction, default=None,
                   help="keep the checkpoint of the best evaluation from pruning and name it in "
                        "CHECKPOINT_DIR/best.json; default off, on for small data")
    c.add_argument("--evaluate-checkpoint", choices=EVALUATE_CHECKPOINTS, default="best",
                   help="--run-mode evaluate and predict: the checkpoint CHECKPOINT_DIR/best.json names (best, "
                        "the default; the latest when there is none) or the latest")
    c.add_argument("--predictions", metavar="DIR",
                   help="--run-mode predict: write the scores here (a new or empty directory), one parquet file "
                        "per rank: the dataset's key columns, file, row, score")
    return p


def parse_submission(argv) -> argparse.Namespace:
    """A job's command line parsed by this parser for recsys-submit (which renders or submits it):
    EngineError with one line instead of an exit; imports neither TensorFlow nor NumPy."""
    argv = [str(a) for a in argv]
    if "-h" in argv or "--help" in argv:
        raise EngineError("engine arguments (after `--`): --help is not a job; run `python -m recsys.train --help`")
    return build_parser(_SubmissionParser).parse_args(argv)
