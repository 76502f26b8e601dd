"""``python -m recsys.train`` / ``recsys-train``: train, evaluate, benchmark or run inference.

One process per rank. With more than one rank (srun --mpi=pmix, mpirun) the
engine joins Horovod; a single process never imports it. The parsed flags become
one typed :class:`recsys.config.TrainConfig`, checked (paths, feature spec, batch
divisibility) before TensorFlow is imported, so a typo costs a one-line error, not
a minute of start-up. Errors below the entry point are :mod:`recsys.errors`
exceptions, printed here as one line: exit 2 for bad input, 1 for divergence.

Examples::

    recsys-train --model dlrm --synthetic
    recsys-train --model wide_deep --data-path /data/outbrain --amp --xla --log-path run.jsonl
    srun --mpi=pmix -N2 --ntasks-per-node=8 python -m recsys.train --model dlrm --data-path /data/criteo
    mpirun -np 2 -x PATH python -m recsys.train --model ncf --synthetic --checkpoint-dir ck
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import socket
import tempfile

from recsys.config import TrainConfig
from recsys.embeddings.placement import IMPLEMENTATIONS
from recsys.errors import EngineError
from recsys.models.defaults import MODEL_DEFAULTS
from slurm.common.cpulist import parse_cpulist

MODELS = ("dlrm", "wide_deep", "ncf")
MODES = ("train", "evaluate", "predict", "benchmark", "inference")
EVALUATE_CHECKPOINTS = ("best", "latest")
AFFINITY = ("off", "all", "exclusive", "unique_contiguous", "unique_interleaved", "numa")
PROG = "recsys-train"
MAX_LOGGED_RANKS = 8      # the placement log lines show this many ranks of each group


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
                         "TensorFlow does not see (default: $RECSYS_DEVICE, else auto; recsys.devices)")
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
                         "waits and dumping its stack (recsys.watchdog; docs/reliability.md); 0: off (default: "
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


def _log_tensorboard(config, dist, log):
    """Where this run's event files go (``tensorboard_dir``, read by ``recsys-submit tensorboard``), and
    that directory named in the checkpoint directory for the training's later attempts."""
    from recsys import tensorboard
    root, failed = tensorboard.remember(config, dist.is_chief)
    if root is None:
        return
    own = tensorboard.own_root(config)
    why = "" if root == own else f" (the training's first attempt's, from {config.checkpoint_dir}/{tensorboard.TRAINING_FILE})"
    log.info(f"tensorboard: event files in {root}{why}", tensorboard_dir=root)
    if failed:
        log.info(f"warning: {failed}: a later --restore of this training starts a TensorBoard run of its own",
                 warning="tensorboard_not_named")


def _checkpoint_to_evaluate(config, log):
    """--run-mode evaluate's (and predict's) checkpoint: the one CHECKPOINT_DIR/best.json names (``--evaluate-checkpoint
    best``, the default), else the latest (None); the log says which and why."""
    from recsys.checkpoint import best_checkpoint
    if config.evaluate_checkpoint == "latest":
        log.info("--evaluate-checkpoint latest: evaluating the newest checkpoint")
        return None
    path, why = best_checkpoint(config.checkpoint_dir)
    log.info(f"evaluating {'the best checkpoint, ' + path if path else 'the newest checkpoint'}: {why}",
             evaluate_checkpoint=path)
    return path


def parse_submission(argv) -> argparse.Namespace:
    """A job's command line parsed by this parser for recsys-submit (which renders or submits it):
    EngineError with one line instead of an exit; imports neither TensorFlow nor NumPy."""
    argv = [str(a) for a in argv]
    if "-h" in argv or "--help" in argv:
        raise EngineError("engine arguments (after `--`): --help is not a job; run `python -m recsys.train --help`")
    return build_parser(_SubmissionParser).parse_args(argv)


def check_submission(argv, world_size, check_data=True, check_existence=True, produced=()) -> TrainConfig:
    """The engine's own checks of a job's command line, made by recsys-submit before it submits
    anything (TrainConfig.for_submission: flags, values, batch over `world_size` ranks, the data
    named and present). Raises EngineError with one line."""
    return TrainConfig.for_submission(parse_submission(argv), world_size, check_data=check_data,
                                      check_existence=check_existence, produced=produced)


def resolve(namespace) -> TrainConfig:
    """The checked :class:`~recsys.config.TrainConfig` of a parsed command line (the embedding
    placement decided in it) and a checkpoint to restore checked: all before TensorFlow starts."""
    config = TrainConfig.from_args(namespace)
    _check_sharded_checkpoint(config)
    return config


def _check_sharded_checkpoint(config):
    """A sharded checkpoint to restore must be complete and of this model: checked before anything runs."""
    if not config.checkpoint_dir or not (config.restore or config.mode in ("evaluate", "predict", "inference")):
        return
    from recsys.checkpoint import AtomicCheckpointer, CheckpointError
    from recsys.sharded_checkpoint import signature, validate
    latest = AtomicCheckpointer(config.checkpoint_dir, None, writer=False).latest()
    if latest is not None:
        try:
            validate(latest, signature(config.model, config.embedding_tables))
        except CheckpointError as e:
            raise EngineError(str(e)) from None


def _synthetic_dir(config):
    if config.checkpoint_dir:
        return os.path.join(config.checkpoint_dir, "synthetic-data")
    if config.log_path:
        return os.path.join(os.path.dirname(os.path.abspath(config.log_path)), f"synthetic-{config.model}")
    return tempfile.mkdtemp(prefix=f"recsys-synthetic-{config.model}-")


def prepare_synthetic(config, dist, log):
    """Rank 0 writes the dataset (atomically, spec last); every rank then reads it.

    Returns (the config reading it, a directory to remove when the run ends or None)."""
    from recsys.data import synthetic
    node_local = dist.size > 1 and not (config.checkpoint_dir or config.log_path)
    if node_local:
        # No shared directory given: each node's local rank 0 writes a node-local copy
        # (the data is deterministic by seed), named by job step and node so that
        # ranks of one node agree and emulated nodes on one host do not collide.
        job = (f"{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '')}"
               if "SLURM_JOB_ID" in os.environ else str(os.getppid()))
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        out = os.path.join(tempfile.gettempdir(), f"recsys-synthetic-{config.model}-{config.seed}-{job}-{node}")
    else:
        out = _synthetic_dir(config)
    spec_path = os.path.join(out, "feature_spec.yaml")
    writer = dist.local_rank == 0 if node_local else dist.is_chief
    if writer and not os.path.isfile(spec_path):
        rows = config.synthetic_rows
        spec = synthetic.default_spec(config.model, num_files=max(2, dist.size))
        test_rows = max(rows // 4, config.eval_batch_size)
        synthetic.generate(spec, out, {"train": rows, "test": test_rows}, seed=config.seed)
        log.info(f"synthetic {config.model} dataset: {spec_path} ({rows} train rows)")
    dist.barrier()
    # A dataset in a fresh temporary directory is removed when the run ends.
    temporary = out if (dist.size == 1 and not (config.checkpoint_dir or config.log_path)) else None
    return dataclasses.replace(config, feature_spec=spec_path, data_path=out), temporary


def apply_affinity(mode, local_rank, local_size):
    """Pin this process when the launcher did not; returns the CPU list or None."""
    if mode in ("off", "all") or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if mode == "numa":
        nodes = sorted(int(n[4:]) for n in os.listdir("/sys/devices/system/node") if n.startswith("node")
                       and n[4:].isdigit()) if os.path.isdir("/sys/devices/system/node") else [0]
        node = nodes[local_rank % len(nodes)]
        try:
            with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
                mine = parse_cpulist(f.read(), allow_empty=True)
        except OSError:
            return None
        mine = [c for c in mine if c in cpus] or cpus
    elif mode == "unique_interleaved":
        mine = cpus[local_rank::local_size] or cpus
    else:
        per = max(1, len(cpus) // local_size)
        mine = cpus[local_rank * per:(local_rank + 1) * per] or cpus
    os.sched_setaffinity(0, mine)
    return mine


def run(config):
    """Everything after argument checks: TF set-up, Horovod, data, model, the chosen mode."""
    from recsys.tfcompat import prepare
    tf_notes = prepare()    # before TensorFlow's import: a TF/Keras the engine cannot run on is one line, exit 2
    from recsys import devices
    device_mode, _ = devices.device_mode(config.device, os.environ)   # a bad $RECSYS_DEVICE: one line, exit 2
    from recsys.distributed import Distributed, launcher_rank
    from recsys.logger import RunLogger
    from recsys import watchdog
    try:
        hang_limit = watchdog.resolve_limit(config.hang_timeout)
        startup_limit = watchdog.resolve_startup_limit()
    except ValueError as exc:      # a bad $RECSYS_HANG_TIMEOUT or $RECSYS_STARTUP_TIMEOUT: one line, exit 2
        raise EngineError(str(exc)) from None
    cpus = None
    if config.affinity != "off":
        local_rank = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("SLURM_LOCALID", 0)))
        local_size = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE", 1)) or 1)
        cpus = apply_affinity(config.affinity, local_rank, local_size)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    tf.config.threading.set_intra_op_parallelism_threads(config.intra_op_threads)
    tf.config.threading.set_inter_op_parallelism_threads(config.inter_op_threads)
    tf.config.experimental.enable_tensor_float_32_execution(not config.no_tf32)
    # Armed before Horovod's initialisation: a rank stuck there (MPI/PMIx, a peer that never started) is named.
    watchdog.start(launcher_rank() if config.world_size > 1 else 0, config.world_size, hang_limit, config.log_path,
                   startup_limit=startup_limit, phase_name=watchdog.HOROVOD_INIT if config.world_size > 1 else None)
    dist = Distributed(use_horovod=config.world_size > 1)
    watchdog.joined(dist.rank, dist.size)
    gpus = tf.config.list_physical_devices("GPU")
    _check_devices(tf, device_mode, len(gpus))    # GPUs given but TensorFlow sees none: one line, exit 2
    if gpus:
        tf.config.experimental.set_memory_growth(gpus[dist.local_rank % len(gpus)], True)
        tf.config.set_visible_devices(gpus[dist.local_rank % len(gpus)], "GPU")
    from recsys.tensorboard import open_sink
    log = RunLogger(config.log_path, enabled=dist.is_chief, progress_every=config.log_every,
                    sink=open_sink(config, dist.rank))
    log.startup("horovod_init", world_size=dist.size)
    _log_tensorboard(config, dist, log)
    _log_notes(config, len(gpus), log)
    for line in tf_notes:
        log.info(line, warning="tensorflow_version")
    for kind, line in (("horovod_without_nccl", devices.nccl_warning(
            len(gpus), dist.hvd is not None, bool(dist.hvd is not None and dist.hvd.nccl_built()))),
            ("amp_on_cpu", devices.amp_warning(config.amp, len(gpus)))):
        if line:
            log.info(line, warning=kind)
    if config.embedding_implementation == "distributed-embeddings":
        from recsys.embeddings.de_adapter import load
        load()      # asked for by name: an import failure is one line with the real error, exit 2
    temporary = None
    try:
        if config.amp:
            tf.keras.mixed_precision.set_global_policy("mixed_float16")
        tf.keras.utils.set_random_seed(config.seed)
        if not config.feature_spec:
            config, temporary = prepare_synthetic(config, dist, log)
        log.startup("data")
        from recsys.feature_spec import FeatureSpec
        spec = FeatureSpec.from_yaml(config.feature_spec)
        log.record("params", **config.as_dict(), horovod=dist.hvd is not None, gpus=len(gpus), affinity_cpus=cpus)
        from recsys.engine import Engine
        from recsys.models.tasks import TASKS
        task = TASKS[config.model](config, spec, dist, log)
        if config.mode in ("train", "evaluate"):
            task.check_data()
            from recsys.data import evaluation_problem
            from recsys.errors import DataError
            # one class or one row: the AUC would be NaN (on test, and on validation when it judges the epochs)
            problem = evaluation_problem(spec) or evaluation_problem(spec, task.eval_mapping)
            if problem:
                raise DataError(problem)
        _log_placement(config, dist, log)
        engine = Engine(config, task, dist, log)
        log.startup("model")
        if config.restore or config.mode in ("evaluate", "predict", "inference"):
            if engine.checkpointer is not None and engine.checkpointer.latest() is not None:
                engine.restore(_checkpoint_to_evaluate(config, log) if config.from_checkpoint
                               else None)
            elif config.restore:
                log.info(f"--restore: no checkpoint in {config.checkpoint_dir}, starting from scratch")
        if config.mode == "train":
            engine.train()
        elif config.mode == "evaluate":
            engine.evaluate_checkpoint()
        elif config.mode == "predict":
            engine.write_predictions()
        elif config.mode == "benchmark":
            engine.benchmark()
        else:
            engine.inference()
    finally:
        watchdog.stop()
        log.close()
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)
    dist.shutdown()
    return 0


def _check_devices(tf, mode, tf_gpus):
    """recsys.devices.check on this process: GPUs given (Slurm, CUDA_VISIBLE_DEVICES, nvidia-smi)
    that TensorFlow does not see stop the run before any work (EngineError, exit 2)."""
    from recsys import devices
    if mode == "cpu" or tf_gpus:
        return
    smi = devices.nvidia_smi_list()
    expected = devices.expected_gpus(os.environ, smi)
    if not expected.count and mode != "gpu":
        return
    from recsys.tfcompat import detect
    found = detect()
    error = devices.check(expected, mode, tf_gpus, found.distribution, found.tensorflow or "",
                          tf.test.is_built_with_cuda(), devices.count_nvidia_smi(smi))
    if error:
        raise EngineError(error)


def _log_notes(config, gpus, log):
    """The configuration's warnings (a short run, a configuration too slow for this hardware):
    one line each on stderr and in the JSON log, before the first step."""
    from recsys.slow_config import slow_warning
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    slow = slow_warning(config, gpus, config.intra_op_threads or cores)
    for kind, line in list(config.notes) + ([("slow_on_this_hardware", slow)] if slow else []):
        log.info(line, warning=kind)


def _log_placement(config, dist, log):
    """The placement decided before TensorFlow started, as the layers use it: one line saying
    which and why, the ``placement`` record and the plan of every group (rank 0)."""
    if not dist.is_chief:
        return
    placement = config.placement
    if placement.model_parallel:
        implementation = placement.implementation
        log.info(f"embedding tables model parallel on {dist.size} ranks ({placement.reason}); "
                 f"implementation: {implementation}")
    else:
        implementation = "replicated"
        if dist.size > 1:
            log.info(f"embedding tables replicated on every rank ({placement.reason}; gradients allreduced)")
    log.record("placement", **placement.as_record(), implementation=implementation)
    for line in placement.describe(max_ranks=MAX_LOGGED_RANKS):
        log.info(line)


def _fail(message, code=2):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv=None):
    from recsys.feature_spec import FeatureSpecError
    try:
        return run(resolve(build_parser().parse_args(argv)))
    except EngineError as err:     # bad flags or data, divergence: one line, not a traceback
        _fail(str(err), err.exit_code)
    except FeatureSpecError as err:  # bad or too small dataset
        _fail(str(err))


def program(argv=None):
    """The process's entry (``python -m recsys.train``, ``recsys-train``): main, then an exit that
    skips the interpreter's teardown. When main returns, everything the run wrote is closed (run's
    ``finally``) and Horovod is shut down (MPI finalized on every rank); what teardown still does
    is unload TensorFlow's modules and join its threads, which only costs time: 0.6-0.9 s per
    process measured on the test box (tiny DLRM, 1 and 2 ranks under mpirun, against 0.05 s),
    paid by every job, study point and test run. atexit handlers still run and stdio is
    flushed; an error exit (SystemExit from main) takes the usual way."""
    import atexit

    code = main(argv) or 0
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    program()
