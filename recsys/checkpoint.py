"""Atomic checkpoints and the USR2 "save and exit" request.

A checkpoint is a directory ``<dir>/ckpt-<step>`` holding a ``tf.train.Checkpoint``
(model, optimizers with their slots and iteration counters, the global step and
epoch variables) plus ``meta.json`` (step, epoch, batches already consumed in that
epoch). It is written under a temporary name in the same directory and renamed,
so a job killed mid-save never leaves a checkpoint that ``--restore`` would pick.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time

_CKPT_RE = re.compile(r"^ckpt-(\d+)$")
META = "meta.json"
PREFIX = "ckpt"


class CheckpointError(RuntimeError):
    pass


def publish(tmp, final):
    """Rename a fully written checkpoint directory into place. The same step saved twice (epoch
    end, then a signal) replaces the older copy; a reader never sees a half-written one."""
    if os.path.exists(final):
        old = final + f".old-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


class AtomicCheckpointer:
    """Save/restore a ``tf.train.Checkpoint`` atomically, keeping the newest ``keep``."""

    def __init__(self, directory, checkpoint, keep=3, writer=True):
        self.directory = directory
        self.checkpoint = checkpoint
        self.keep = max(1, int(keep))
        self.writer = writer
        if writer and directory:
            os.makedirs(directory, exist_ok=True)

    def list(self):
        """Complete checkpoints as ``[(step, path)]``, oldest first."""
        if not self.directory or not os.path.isdir(self.directory):
            return []
        found = []
        for name in os.listdir(self.directory):
            m = _CKPT_RE.match(name)
            path = os.path.join(self.directory, name)
            if m and os.path.isfile(os.path.join(path, META)):
                found.append((int(m.group(1)), path))
        return sorted(found)

    def latest(self):
        found = self.list()
        return found[-1][1] if found else None

    def save(self, step, **meta):
        """Write ``ckpt-<step>``; only the writer rank touches the disk. Returns the path."""
        final = os.path.join(self.directory, f"ckpt-{int(step):010d}")
        if not self.writer:
            return final
        tmp = os.path.join(self.directory, f".tmp-ckpt-{int(step):010d}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        self.checkpoint.write(os.path.join(tmp, PREFIX))
        info = dict(meta, step=int(step), saved_at=time.time())
        with open(os.path.join(tmp, META), "w") as f:
            json.dump(info, f)
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, final)
        self._prune()
        return final

    def _prune(self):
        for _, path in self.list()[:-self.keep]:
            shutil.rmtree(path, ignore_errors=True)

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
