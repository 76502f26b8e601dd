"""TensorBoard event files and tf.profiler traces of an engine run (docs/tensorboard.md).

The event files are a second sink of the JSON log: :class:`recsys.monitoring.logger.RunLogger` hands every
record it builds to :class:`ScalarSink`, which writes the figures of the ``step``, ``eval`` and
``summary`` records as scalars at those records' steps, so TensorBoard and the JSON log never
disagree. Each rank writes into its own directory ``<root>/rank<k>`` (a TensorBoard run), the root
being ``--tensorboard-dir``, else ``<--log-path's dir>/tensorboard/<log name>``
(``logs/tensorboard/<job>`` in a run directory). Every attempt's first event is TensorBoard's
``SessionLog.START`` at its first step (after a restore: the step after the restored one): the
TensorBoard server ignores the first START of a run and, at each later one, drops what earlier
attempts wrote from that step on, so a requeued job's curves continue without duplicates.

:class:`ProfileWindow` runs ``tf.profiler`` over the steps of ``--profile-steps``, one step per
call, each under a ``train`` step marker, into the same rank directory
(``plugins/profile/<time>/<host>.xplane.pb``, what TensorBoard's profile plugin opens).

The writer is TensorBoard's own ``EventFileWriter`` (a queue and a writer thread): a figure costs
the building of a small protobuf, a few microseconds (bench/bench_tensorboard.py).
"""
from __future__ import annotations

import contextlib
import os
import time

LOG_SUFFIXES = (".engine.jsonl", ".jsonl", ".json", ".log")
FLUSH_SECS = 5        # a killed job loses at most this many seconds of figures (the JSON log: none)
# The step record's figures and their tags; eval metrics go under eval/, summary figures under summary/.
STEP_TAGS = {"loss": "train/loss", "samples_per_s": "train/samples_per_s", "step_time_ms": "train/step_time_ms",
             "lr": "train/lr", "loss_scale": "train/loss_scale"}
SUMMARY_TAGS = {"throughput_samples_per_s": "summary/throughput_samples_per_s",
                "mean_step_time_ms": "summary/mean_step_time_ms", "p50_step_time_ms": "summary/p50_step_time_ms"}
NOT_METRICS = {"type", "time", "step", "epoch"}
BREAKDOWN_TAG = "step_breakdown"     # the Text tab's table of a benchmark's split-step phases


TRAINING_FILE = "tensorboard.json"   # in --checkpoint-dir: the TensorBoard directory of the training


def root_dir(config):
    """The run's TensorBoard directory (ranks below it), or None (nowhere of the run's to write).

    A training restored from a checkpoint directory continues the TensorBoard run of the training
    that wrote it (``CHECKPOINT_DIR/tensorboard.json``), so that the attempts of one training are
    one run even when each is a run of its own (a local ``--restore`` gets a new run directory and
    log path; a requeued job keeps both, and the file names its own directory)."""
    own = own_root(config)
    if config.tensorboard_dir or not (config.restore and config.checkpoint_dir and config.mode == "train"):
        return own
    return recorded_root(config.checkpoint_dir) or own


def recorded_root(checkpoint_dir):
    """The directory ``tensorboard.json`` names, when it is one of this user's own (not a link): a
    checkpoint directory is not a licence to write events anywhere."""
    import json
    import stat

    try:
        with open(os.path.join(checkpoint_dir, TRAINING_FILE)) as handle:
            root = json.load(handle).get("root")
        info = os.lstat(root)
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return None
    return root


def remember(config, is_chief):
    """Rank 0 of a training with a checkpoint directory names its TensorBoard directory there, once
    (slurm/common/atomicfile.py: a temporary name, then a rename): the training's later attempts write into
    it (:func:`root_dir`). Returns the directory; a file that cannot be written (a full disk) costs
    only that continuity, never the run: (directory, the reason it was not named)."""
    root = None if config.no_tensorboard else root_dir(config)
    if not (is_chief and root and config.checkpoint_dir and config.mode == "train"):
        return root, None
    if recorded_root(config.checkpoint_dir) == root:
        return root, None
    import json

    from slurm.common import atomicfile
    try:
        os.makedirs(root, exist_ok=True)
        os.makedirs(config.checkpoint_dir, exist_ok=True)       # as the checkpointer makes it (mkdir -p)
        atomicfile.write(os.path.join(config.checkpoint_dir, TRAINING_FILE),
                         json.dumps({"version": 1, "root": root}), durable=True)
    except OSError as exc:
        return root, f"{os.path.join(config.checkpoint_dir, TRAINING_FILE)} not written ({exc.strerror or exc})"
    return root, None


def own_root(config):
    """The directory this process's own flags give: --tensorboard-dir, else beside --log-path."""
    if config.tensorboard_dir:
        return os.path.abspath(config.tensorboard_dir)
    if not config.log_path:
        return None
    name = os.path.basename(config.log_path)
    for suffix in LOG_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[:-len(suffix)]
            break
    return os.path.join(os.path.dirname(os.path.abspath(config.log_path)), "tensorboard", name)


def rank_dir(root, rank):
    return os.path.join(root, f"rank{int(rank)}")


def chosen(ranks, rank):
    """``ranks``: a tuple of ranks, or "all" (--tensorboard-ranks / --profile-ranks)."""
    return ranks == "all" or rank in tuple(ranks)


def scalars(record):
    """``[(tag, value)]`` of one JSON-log record (already plain: recsys.monitoring.logger._plain), and its step."""
    kind, step = record.get("type"), record.get("step")
    if not isinstance(step, int) or kind not in ("step", "eval", "summary"):
        return None, []
    out = []
    if kind == "step":
        out = [(tag, record.get(key)) for key, tag in STEP_TAGS.items()]
        out += [(f"train/lr/{name}", v) for name, v in (record.get("lrs") or {}).items()]
    elif kind == "eval":
        out = [(f"eval/{k}", v) for k, v in record.items() if k not in NOT_METRICS]
    else:
        out = [(tag, record.get(key)) for key, tag in SUMMARY_TAGS.items()]
    return step, [(tag, float(v)) for tag, v in out if isinstance(v, (int, float)) and not isinstance(v, bool)]


def breakdown_table(record):
    """A summary's step breakdown as a Markdown table (phase, mean over ranks, slowest rank), or None.

    It goes to TensorBoard's Text tab, not its Scalars: written once per run, each phase was a
    one-point card, and a study's page opened with a wall of them above the loss curves."""
    breakdown = (record.get("step_breakdown") or {}) if record.get("type") == "summary" else {}
    mean, slowest = breakdown.get("mean") or {}, breakdown.get("slowest_rank") or {}
    phases = [k for k in dict.fromkeys([*mean, *slowest]) if k.endswith("_ms")]
    if not phases:
        return None

    def cell(figures, key):
        value = figures.get(key)
        return f"{value:.3f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
    rank = slowest.get("rank")
    lines = ["| phase | mean over ranks (ms) | slowest rank" + (f" ({rank})" if rank is not None else "") + " (ms) |",
             "|---|---:|---:|"]
    lines += [f"| {k[:-3]} | {cell(mean, k)} | {cell(slowest, k)} |" for k in phases]
    return "\n".join(lines)


class ScalarSink:
    """Writes the figures of the records it is given into one event file of ``logdir``.

    The first event is TensorBoard's START at the attempt's first step: step 1, or, after a restore
    (the ``info`` record with ``restored_step``) of a run whose steps continue the checkpoint's
    (``continues``: train mode; a benchmark counts its steps from 1), the step after the restored
    one, and then no figure of a step at or before it is written. A START is needed in the first
    attempt too: the server (plugin_event_accumulator) purges only at the second START it reads."""

    def __init__(self, logdir, continues=True):
        self.logdir = logdir
        self.continues = continues
        self._writer = None
        self._after = 0           # figures of steps <= this are not written (a restore's step)

    def _start(self, wall_time):
        """The attempt's event file if not open yet, and a START at its first step."""
        from tensorboard.compat.proto import event_pb2
        if self._writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
            self._writer = EventFileWriter(self.logdir, max_queue_size=100, flush_secs=FLUSH_SECS)
        self._writer.add_event(event_pb2.Event(wall_time=wall_time or time.time(), step=self._after + 1,
                                               session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    def record(self, record):
        """One JSON-log record: its figures written, a restore (``restored_step``) noted."""
        from tensorboard.compat.proto import event_pb2, summary_pb2
        if self.continues and record.get("type") == "info" and isinstance(record.get("restored_step"), int):
            self._after = record["restored_step"]
            self._start(record.get("time"))
            return
        step, figures = scalars(record)
        if not figures or step <= self._after:
            return
        if self._writer is None:
            self._start(record.get("time"))
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in figures])
        self._writer.add_event(event_pb2.Event(wall_time=record.get("time") or time.time(), step=step,
                                               summary=summary))
        table = breakdown_table(record)
        if table is not None:
            from tensorboard.plugins.text.summary_v2 import text_pb
            self._writer.add_event(event_pb2.Event(wall_time=record.get("time") or time.time(), step=step,
                                                   summary=text_pb(BREAKDOWN_TAG, table)))
        if record.get("type") != "step":
            self._writer.flush()      # an evaluation or the end: on disk now

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def open_sink(config, rank):
    """This rank's sink, or None (--no-tensorboard, no directory, or not a chosen rank)."""
    root = None if config.no_tensorboard else root_dir(config)
    if root is None or not chosen(config.tensorboard_ranks, rank):
        return None
    return ScalarSink(rank_dir(root, rank), continues=config.mode == "train")


def optimizer_figures(groups, loss_scaler):
    """The step record's extra figures: every optimizer group's learning rate (``lrs``, W&D has two),
    and the dynamic loss scale under --amp."""
    out = {}
    lrs = {}
    for name, opt, _ in groups:
        lr = getattr(opt, "learning_rate", None)
        try:
            lrs[name] = float(lr.numpy() if hasattr(lr, "numpy") else lr)
        except (TypeError, ValueError):
            continue
    if len(lrs) > 1:
        out["lrs"] = lrs
    if loss_scaler is not None:
        out["loss_scale"] = float(loss_scaler.loss_scale.numpy())
    return out


def mark_run(logdir):
    """An event file without figures in a traced rank's directory, unless it has one: TensorBoard's
    profile plugin (2.15, ``generate_runs``) lists traces only under runs, directories that hold an
    event file, and a rank outside ``--tensorboard-ranks`` (or under ``--no-tensorboard``) writes none
    otherwise, so its trace was listed by the study report and never shown."""
    if any(name.startswith("events.out.tfevents.") for name in os.listdir(logdir)):
        return
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    EventFileWriter(logdir, filename_suffix=".profile").close()


class ProfileWindow:
    """tf.profiler over steps ``start``..``end`` (global step numbers, inclusive) into ``logdir``.

    Inside the window a call trains one step (:meth:`limit`), so that each step is one ``train``
    marker in the trace viewer; a run that ends inside the window stops the profiler in
    :meth:`close`."""

    def __init__(self, logdir=None, steps=None, mark=False):
        self.logdir = logdir
        self.mark = mark            # this rank writes no figures: its directory needs an event file of its own
        self.start, self.end = steps or (0, -1)
        self.running = False
        self.done = False

    @classmethod
    def of(cls, config, rank):
        root = root_dir(config) if config.profile_steps else None
        if root is None or not chosen(config.profile_ranks, rank):
            return cls()
        figures = not config.no_tensorboard and chosen(config.tensorboard_ranks, rank)
        return cls(rank_dir(root, rank), config.profile_steps, mark=not figures)

    @property
    def active(self):
        return self.logdir is not None and not self.done

    def limit(self, before, n):
        """Steps the call after step ``before`` may train: it ends before the window, one step in it."""
        if not self.active or before >= self.end:
            return n
        if before + 1 >= self.start:
            return 1
        return min(n, self.start - 1 - before)

    @contextlib.contextmanager
    def steps(self, before, n=1):
        """Around the call that trains steps ``before+1``..``before+n``: the profiler started at the
        window's first step, a step marker in it, stopped after its last."""
        step = before + 1
        if not self.active or not (self.start <= step <= self.end):
            yield
            return
        import tensorflow as tf
        if not self.running:
            os.makedirs(self.logdir, exist_ok=True)
            if self.mark:
                mark_run(self.logdir)
            tf.profiler.experimental.start(self.logdir)
            self.running = True
        with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
            yield
        if before + n >= self.end:
            self.close()

    def close(self):
        if self.running:
            import tensorflow as tf
            tf.profiler.experimental.stop()
            self.running = False
            self.done = True
