"""Atomic checkpoints, the best one (``--keep-best``, the early stop's count) and the USR2 "save and exit" request.

A checkpoint is a directory ``<dir>/ckpt-<step>`` holding a ``tf.train.Checkpoint``
(model, optimizers with their slots and iteration counters, the global step and
epoch variables) plus ``meta.json`` (step, epoch, batches already consumed in that
epoch). It is written under a temporary name in the same directory and renamed,
so a job killed mid-save never leaves a checkpoint that ``--restore`` would pick.

Every step that can be interrupted keeps a complete checkpoint findable (tests/faults kill
writers at random points): a checkpoint replaced by a newer copy of the same step is renamed
to ``ckpt-<step>.old-<pid>`` first and still listed until the new copy is in place; a pruned
one is renamed to ``.trash-...`` before it is deleted, so a half-deleted checkpoint is never
listed. What a killed writer left behind is cleared by the next writer (:meth:`recover`). A
write that fails (a full disk) removes its temporary directory and raises
:class:`CheckpointWriteError`, one line, with the previous checkpoint untouched.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import time

from recsys.errors import EngineError
from slurm.common import atomicfile

_CKPT_RE = re.compile(r"^ckpt-(\d+)$")
_OLD_RE = re.compile(r"^ckpt-(\d+)\.old-\d+$")      # a checkpoint being replaced by a new copy
_LEFTOVER = (".tmp-ckpt-", ".trash-")               # written or deleted by a writer that was killed
META = "meta.json"
PREFIX = "ckpt"


class CheckpointError(EngineError):
    """A checkpoint that cannot be restored (missing, incomplete, of another model): exit 2."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint that could not be written (e.g. a full disk): nothing half-written is left, the
    previous checkpoint stays; the run stops with exit 1."""
    exit_code = 1


def write_failure(final, err, previous):
    """The one-line CheckpointWriteError of a failed save of ``final``."""
    reason = getattr(err, "strerror", None) or (str(getattr(err, "message", "") or err).strip().splitlines() or
                                                [type(err).__name__])[0]
    return CheckpointWriteError(f"cannot write checkpoint {final}: {reason}; nothing of it is left and the "
                                f"previous checkpoint {previous or '(none)'} is kept")


def _fsync_dir(path):
    """Make a rename in ``path`` durable (best effort: not every file system allows it)."""
    try:
        atomicfile.fsync_dir(path)
    except OSError:
        pass


def publish(tmp, final):
    """Rename a fully written checkpoint directory into place. The same step saved twice (epoch
    end, then a signal) replaces the older copy, which stays listed (as ``.old-<pid>``) until
    the new one is in place; a reader never sees a half-written one."""
    if os.path.exists(final):
        old = final + f".old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        discard(old)
    else:
        os.rename(tmp, final)
    _fsync_dir(os.path.dirname(final))


def discard(path):
    """Delete a checkpoint directory so that no reader ever lists it half-deleted: rename it out
    of the listing first, then remove it."""
    trash = os.path.join(os.path.dirname(path), f".trash-{os.path.basename(path)}-{os.getpid()}")
    try:
        os.rename(path, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def recover(directory):
    """Clear what a killed writer left in ``directory``: put back a replaced checkpoint whose new
    copy never arrived, delete temporary and half-deleted directories. Call before writing."""
    if not directory or not os.path.isdir(directory):
        return
    names = os.listdir(directory)
    for name in names:
        m = _OLD_RE.match(name)
        final = os.path.join(directory, f"ckpt-{m.group(1)}") if m else None
        if m and not os.path.exists(final):
            try:
                os.rename(os.path.join(directory, name), final)
            except OSError:
                pass
        elif m:
            discard(os.path.join(directory, name))
    for name in names:
        if name.startswith(_LEFTOVER):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


class AtomicCheckpointer:
    """Save/restore a ``tf.train.Checkpoint`` atomically, keeping the newest ``keep``."""

    def __init__(self, directory, checkpoint, keep=3, writer=True):
        self.directory = directory
        self.checkpoint = checkpoint
        self.keep = max(1, int(keep))
        self.writer = writer
        self.protected = set()      # paths never pruned: the best checkpoint (--keep-best)
        if writer and directory:
            os.makedirs(directory, exist_ok=True)
            recover(directory)

    def list(self):
        """Complete checkpoints as ``[(step, path)]``, oldest first."""
        if not self.directory or not os.path.isdir(self.directory):
            return []
        found, replaced = {}, {}
        for name in os.listdir(self.directory):
            m = _CKPT_RE.match(name) or _OLD_RE.match(name)
            path = os.path.join(self.directory, name)
            if m and os.path.isfile(os.path.join(path, META)):
                (found if _CKPT_RE.match(name) else replaced)[int(m.group(1))] = path
        # A copy being replaced counts only while its replacement is not in place yet.
        for step, path in replaced.items():
            found.setdefault(step, path)
        return sorted(found.items())

    def latest(self):
        found = self.list()
        return found[-1][1] if found else None

    def save(self, step, **meta):
        """Write ``ckpt-<step>``; only the writer rank touches the disk. Returns the path."""
        final = os.path.join(self.directory, f"ckpt-{int(step):010d}")
        if not self.writer:
            return final
        tmp = os.path.join(self.directory, f".tmp-ckpt-{int(step):010d}-{os.getpid()}")
        previous = self.latest()
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            self.checkpoint.write(os.path.join(tmp, PREFIX))
            info = dict(meta, step=int(step), saved_at=time.time())
            write_json(os.path.join(tmp, META), info, atomic=False)
            publish(tmp, final)
        except Exception as err:     # OSError, or TensorFlow's OpError for the same cause
            shutil.rmtree(tmp, ignore_errors=True)
            raise write_failure(final, err, previous) from None
        self._prune()
        return final

    def prune(self):
        """Delete what falls outside the newest ``keep`` and the protected (the writer only)."""
        if self.writer and self.directory:
            self._prune()

    def _prune(self):
        for _, path in self.list()[:-self.keep]:
            if path not in self.protected:
                discard(path)

    def restore(self, path=None):
        """Load ``path`` (or the newest checkpoint); returns its meta dict."""
        path = path or self.latest()
        if path is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        meta_path = os.path.join(path, META)
        if not os.path.isfile(meta_path):
            raise CheckpointError(f"{path}: not a complete checkpoint (no {META})")
        self.checkpoint.read(os.path.join(path, PREFIX)).assert_existing_objects_matched()
        with open(meta_path) as f:
            meta = json.load(f)
        meta["path"] = path
        return meta


def write_json(path, obj, atomic=True):
    """Write ``obj`` as JSON, flushed to disk; ``atomic``: under a temporary name, then renamed and
    the directory synced (slurm/common/atomicfile.py, the tree's one scheme)."""
    if atomic:
        atomicfile.write(path, json.dumps(obj), durable=True)
        return
    with open(path, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())


ATTEMPT = "attempt.json"


def note_attempt(directory, **fields):
    """Record in ``<directory>/attempt.json`` how long this attempt took to start and to write a
    checkpoint: the submission layer warns when a job's USR2 lead time leaves less than that
    (a requeued job would make no progress). Best effort: a full disk must not stop training here."""
    try:
        write_json(os.path.join(directory, ATTEMPT), dict(fields, written_at=time.time()))
    except OSError:
        pass


class StopRequest:
    """Set by SIGUSR2 (Slurm's ``--signal=B:USR2@T`` forwarded to the step): save and exit 0."""

    def __init__(self, signals=(signal.SIGUSR2,)):
        self.requested = False
        self.signum = None
        self._previous = {}
        for s in signals:
            try:
                self._previous[s] = signal.signal(s, self._handle)
            except ValueError:   # not the main thread
                pass

    def _handle(self, signum, frame):
        self.requested = True
        self.signum = signum

    def restore_handlers(self):
        for s, h in self._previous.items():
            signal.signal(s, h)


BEST = "best.json"
BEST_VERSION = 1


class BestEvaluation:
    """The best evaluation of a run by its watched metric (higher is better) and the evaluations
    since the last one that beat the best by more than ``min_delta``, which the early stop counts
    against ``patience`` (0: never stop early). A gain within ``min_delta`` still makes a new best
    (its checkpoint is the one kept) but does not restart the count: noise does not prolong a run.

    Its :meth:`state` goes into every checkpoint's meta.json, so a requeued or ``--restore``'d run
    goes on counting where the checkpoint left it. A checkpoint is saved before its step is
    evaluated, so its state holds the evaluations before that step; ``last_step`` says which."""

    def __init__(self, metric, patience=0, min_delta=0.0):
        self.metric, self.patience, self.min_delta = metric, int(patience or 0), float(min_delta or 0.0)
        self.value = self.step = self.epoch = self.checkpoint = self.last_step = None
        self.metrics = {}
        self.since_best = 0

    def update(self, step, epoch, metrics, checkpoint=None, counting=True) -> bool:
        """Count the evaluation of ``step``; True when it is the new best (a NaN never is). Not
        ``counting`` (an evaluation inside the learning rate's warm-up): judged for the best, never
        a step towards the early stop."""
        value = metrics.get(self.metric)
        value = math.nan if value is None else float(value)
        self.last_step = int(step)
        finite = math.isfinite(value)
        gained = finite and (self.value is None or value > self.value + self.min_delta)
        improved = finite and (self.value is None or value > self.value)
        if improved:
            self.value, self.step, self.epoch, self.checkpoint = value, int(step), int(epoch), checkpoint
            self.metrics = {k: float(v) for k, v in metrics.items()}
        self.since_best = 0 if gained else self.since_best + (1 if counting else 0)
        return improved

    @property
    def stop(self) -> bool:
        """Patience spent: ``patience`` evaluations in a row did not beat the best by ``min_delta``."""
        return self.patience > 0 and self.since_best >= self.patience

    def state(self) -> dict:
        return dict(version=BEST_VERSION, metric=self.metric, value=self.value, step=self.step, epoch=self.epoch,
                    checkpoint=self.checkpoint, metrics=self.metrics, since_best=self.since_best,
                    last_step=self.last_step)

    def restored(self, state):
        """Take the counts of a checkpoint's ``state`` (a state of another metric or version starts
        afresh); the patience stays this run's."""
        if not isinstance(state, dict) or state.get("version") != BEST_VERSION or state.get("metric") != self.metric:
            return self
        self.value, self.step, self.epoch = state.get("value"), state.get("step"), state.get("epoch")
        self.checkpoint, self.metrics = state.get("checkpoint"), dict(state.get("metrics") or {})
        self.since_best, self.last_step = int(state.get("since_best") or 0), state.get("last_step")
        return self

    def summary(self) -> dict:
        """The summary record's ``best_eval``: the best evaluation, its step, epoch and checkpoint."""
        return dict(metric=self.metric, value=self.value, step=self.step, epoch=self.epoch,
                    checkpoint=self.checkpoint, metrics=self.metrics)


def best_checkpoint(directory):
    """(path or None, why) of the checkpoint ``<directory>/best.json`` names: None when there is no
    best.json (no --keep-best run wrote one), it cannot be read, or its checkpoint is gone. A moved
    checkpoint directory still works: the checkpoint is looked up by its name in ``directory``."""
    try:
        with open(os.path.join(directory, BEST)) as handle:
            best = json.load(handle)
    except FileNotFoundError:
        return None, f"no {BEST} in {directory} (a run with --keep-best writes one)"
    except (OSError, ValueError) as exc:
        return None, f"{os.path.join(directory, BEST)} is unreadable ({exc})"
    name = os.path.basename(str(best.get("checkpoint") or "").rstrip("/"))
    path = os.path.join(directory, name) if name else None
    if not path or not os.path.isdir(path):
        return None, f"{BEST} names {best.get('checkpoint')!r}, which is not in {directory}"
    return path, (f"{BEST}: {best.get('metric')} {best.get('value')} at step {best.get('step')} "
                  f"(--evaluate-checkpoint latest for the newest)")


def write_best(directory, best):
    """``<directory>/best.json``: which checkpoint is the run's best so far (atomic; rank 0)."""
    write_json(os.path.join(directory, BEST), dict(best.summary(), version=BEST_VERSION, written_at=time.time()))
