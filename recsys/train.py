"""``python -m recsys.train`` / ``recsys-train``: train, evaluate, benchmark or run inference.

One process per rank. With more than one rank (srun --mpi=pmix, mpirun) the
engine joins Horovod; a single process never imports it. The parsed flags become
one typed :class:`recsys.configuration.train_config.TrainConfig`, checked (paths, feature spec, batch
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

import dataclasses
import os
import shutil
import sys
import socket
import tempfile

from recsys.configuration.flags import PROG, build_parser, parse_submission
from recsys.configuration.train_config import TrainConfig
from recsys.errors import EngineError
from slurm.common.cpulist import parse_cpulist

MAX_LOGGED_RANKS = 8      # the placement log lines show this many ranks of each group


def _log_tensorboard(config, dist, log):
    """Where this run's event files go (``tensorboard_dir``, read by ``recsys-submit tensorboard``), and
    that directory named in the checkpoint directory for the training's later attempts."""
    from recsys.monitoring import tensorboard
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
    from recsys.checkpoints.atomic import best_checkpoint
    if config.evaluate_checkpoint == "latest":
        log.info("--evaluate-checkpoint latest: evaluating the newest checkpoint")
        return None
    path, why = best_checkpoint(config.checkpoint_dir)
    log.info(f"evaluating {'the best checkpoint, ' + path if path else 'the newest checkpoint'}: {why}",
             evaluate_checkpoint=path)
    return path


def check_submission(argv, world_size, check_data=True, check_existence=True, produced=()) -> TrainConfig:
    """The engine's own checks of a job's command line, made by recsys-submit before it submits
    anything (TrainConfig.for_submission: flags, values, batch over `world_size` ranks, the data
    named and present). Raises EngineError with one line."""
    return TrainConfig.for_submission(parse_submission(argv), world_size, check_data=check_data,
                                      check_existence=check_existence, produced=produced)


def resolve(namespace) -> TrainConfig:
    """The checked :class:`~recsys.configuration.train_config.TrainConfig` of a parsed command line (the embedding
    placement decided in it) and a checkpoint to restore checked: all before TensorFlow starts."""
    config = TrainConfig.from_args(namespace)
    _check_sharded_checkpoint(config)
    return config


def _check_sharded_checkpoint(config):
    """A sharded checkpoint to restore must be complete and of this model: checked before anything runs."""
    if not config.checkpoint_dir or not (config.restore or config.mode in ("evaluate", "predict", "inference")):
        return
    from recsys.checkpoints.atomic import AtomicCheckpointer, CheckpointError
    from recsys.checkpoints.sharded import signature, validate
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
    from recsys.runtime.tfcompat import prepare
    tf_notes = prepare()    # before TensorFlow's import: a TF/Keras the engine cannot run on is one line, exit 2
    from recsys.runtime import devices
    device_mode, _ = devices.device_mode(config.device, os.environ)   # a bad $RECSYS_DEVICE: one line, exit 2
    from recsys.monitoring import watchdog
    from recsys.monitoring.logger import RunLogger
    from recsys.runtime.distributed import Distributed, launcher_rank
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
    from recsys.monitoring.tensorboard import open_sink
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
        from recsys.features.spec import FeatureSpec
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
    """recsys.runtime.devices.check on this process: GPUs given (Slurm, CUDA_VISIBLE_DEVICES, nvidia-smi)
    that TensorFlow does not see stop the run before any work (EngineError, exit 2)."""
    from recsys.runtime import devices
    if mode == "cpu" or tf_gpus:
        return
    smi = devices.nvidia_smi_list()
    expected = devices.expected_gpus(os.environ, smi)
    if not expected.count and mode != "gpu":
        return
    from recsys.runtime.tfcompat import detect
    found = detect()
    error = devices.check(expected, mode, tf_gpus, found.distribution, found.tensorflow or "",
                          tf.test.is_built_with_cuda(), devices.count_nvidia_smi(smi))
    if error:
        raise EngineError(error)


def _log_notes(config, gpus, log):
    """The configuration's warnings (a short run, a configuration too slow for this hardware):
    one line each on stderr and in the JSON log, before the first step."""
    from recsys.configuration.slow import slow_warning
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
    from recsys.features.spec import FeatureSpecError
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
