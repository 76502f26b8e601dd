"""JSON-lines run log (dllogger-like) plus a console progress line, rank 0 only.

Every record is one JSON object per line with a ``type`` key:
``params`` (the run configuration), ``info`` (one-off notes such as the
embedding placement), ``step`` (step, epoch, loss, samples_per_s, lr),
``eval`` (epoch, step, metrics, the mapping evaluated), ``test_eval`` (a validation-judged training's one
test evaluation, with the best weights), ``startup`` (one per start-up phase:
horovod_init, data, model, first_step, with seconds since the process started)
and ``summary`` (throughput, mean step time, final metrics). Lines are flushed as written so a killed job keeps its log.
A ``sink`` (recsys.monitoring.tensorboard.ScalarSink) gets every record too, on any rank that has one, so the
TensorBoard figures are the JSON log's at the same steps.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time


def _plain(value):
    """Make numpy/TF scalars JSON-friendly; non-finite floats become strings."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class RunLogger:
    """Writes records to ``log_path`` (if given) and progress to stderr; silent off rank 0."""

    def __init__(self, log_path=None, enabled=True, console=sys.stderr, progress_every=10, sink=None):
        self.enabled = enabled
        self.sink = sink
        self.console = console
        self.progress_every = max(1, int(progress_every))
        self._file = None
        if enabled and log_path:
            os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)   # as mkdir -p
            self._file = open(log_path, "a", buffering=1, encoding="utf-8")
        self._last_progress = 0.0

    def record(self, kind, **fields):
        if not self.enabled and self.sink is None:
            return
        rec = {"type": kind, "time": round(time.time(), 3)}
        rec.update(_plain(fields))
        if self.sink is not None:
            self.sink.record(rec)
        if self._file is not None:
            self._file.write(json.dumps(rec, sort_keys=False) + "\n")

    def startup(self, phase, **fields):
        """A start-up phase reached, timed from the process start, so that a scaling study
        can show start-up apart from step throughput. Horovod init is collective, so the
        chief's time for it (and after it) is when the slowest rank had joined."""
        self.record("startup", phase=phase, since_start_s=round(time.time() - process_start(), 3), **fields)

    def info(self, message, **fields):
        """A note for humans (console) that is also kept in the JSON log."""
        if self.enabled:
            print(f"[recsys] {message}", file=self.console, flush=True)
        self.record("info", message=message, **fields)

    def step(self, step, epoch, loss, samples_per_s, total_steps=None, **extra):
        self.record("step", step=step, epoch=epoch, loss=loss, samples_per_s=samples_per_s, **extra)
        if not self.enabled:
            return
        if step % self.progress_every == 0 or (total_steps and step >= total_steps):
            total = f"/{total_steps}" if total_steps else ""
            print(f"[recsys] epoch {epoch} step {step}{total} loss {float(loss):.5f} "
                  f"{samples_per_s:,.0f} samples/s", file=self.console, flush=True)

    def eval(self, step, epoch, metrics, mapping="test"):
        self.record("eval", step=step, epoch=epoch, mapping=mapping, **metrics)
        if self.enabled:
            text = " ".join(f"{k} {float(v):.5f}" for k, v in metrics.items())
            on = "" if mapping == "test" else f" ({mapping})"
            print(f"[recsys] eval{on} epoch {epoch} step {step}: {text}", file=self.console, flush=True)

    def summary(self, **fields):
        """The full record to the JSON log; to the console a short line a person reads (what ran,
        why it stopped, the last and the best evaluation, the speed), and the full record as
        ``key=value`` pairs only when there is no JSON log to keep it."""
        self.record("summary", **fields)
        if self.enabled:
            plain = _plain(fields)
            where = f"full record: {self._file.name}" if self._file is not None else None
            print(f"[recsys] summary: {short_summary(plain, where)}", file=self.console, flush=True)
            if self._file is None:
                text = " ".join(f"{k}={_fmt(v)}" for k, v in plain.items())
                print(f"[recsys] summary record: {text}", file=self.console, flush=True)

    def close(self):
        if self.sink is not None:
            self.sink.close()
        if self._file is not None:
            self._file.close()
            self._file = None


def process_start():
    """Wall-clock start of this process (Linux /proc), else when this module was imported."""
    try:
        with open("/proc/self/stat") as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime"))
        import os
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


_IMPORTED = time.time()


METRICS = ("auc", "bce", "map_at_12", "hr_at_10", "ndcg_at_10")   # the metrics, in this order


def _metrics(fields: dict) -> str:
    names = [k for k in METRICS if isinstance(fields.get(k), (int, float))]
    names += sorted(k for k, v in fields.items() if k.startswith(("hr_at_", "ndcg_at_")) and k not in names
                    and isinstance(v, (int, float)))
    return " ".join(f"{k} {fields[k]:.5f}" for k in names)


def stop_reason(fields: dict) -> str:
    """Why the run ended, in words, from its summary record."""
    if fields.get("interrupted"):
        return "interrupted (a signal: checkpointed for the requeue)"
    early = fields.get("early_stopped")
    if isinstance(early, dict):
        return f"early stop at epoch {early.get('epoch')} step {early.get('step')} (patience {early.get('patience')})"
    mode = fields.get("mode")
    if mode == "evaluate":
        return f"evaluated {fields.get('evaluated_checkpoint')}"
    if mode == "predict":
        return f"{fields.get('predicted_rows')} rows scored by {fields.get('evaluated_checkpoint')} in {fields.get('predictions')}"
    if mode in ("benchmark", "inference"):
        return f"{fields.get('timed_steps')} timed steps done"
    return "every step done"


def short_summary(fields: dict, where: str | None = None) -> str:
    """One line of a summary record for a person (the record's full form is the JSON log's)."""
    ranks = fields.get("world_size")
    parts = [f"{fields.get('model')} {fields.get('mode')} on {ranks} rank{'s' if ranks != 1 else ''}, "
             f"step {fields.get('step')} epoch {fields.get('epoch')}: {stop_reason(fields)}"]
    last = _metrics(fields)
    if last:
        which = "validation eval" if isinstance(fields.get("test_eval"), dict) else "eval"
        parts.append(f"last {which} (step {fields.get('eval_step')}): {last}")
    best = fields.get("best_eval")
    validated = isinstance(fields.get("test_eval"), dict)
    if isinstance(best, dict) and best.get("value") is not None:
        parts.append(f"best{' validation' if validated else ''} {best.get('metric')} {best['value']:.5f} at "
                     f"epoch {best.get('epoch')} step {best.get('step')}")
    if validated:
        test = fields["test_eval"]
        parts.append(f"test ({test.get('weights')} weights, step {test.get('step')}): "
                     f"{_metrics(test.get('metrics') or {})}")
    if isinstance(fields.get("final_loss"), (int, float)):
        parts.append(f"final loss {fields['final_loss']:.5g}")
    rate, step_ms = fields.get("throughput_samples_per_s"), fields.get("mean_step_time_ms")
    if isinstance(rate, (int, float)) and isinstance(step_ms, (int, float)):
        parts.append(f"{rate:,.0f} samples/s, {step_ms:.3g} ms/step")
    if where:
        parts.append(where)
    return "; ".join(parts)


def _fmt(v):
    return f"{v:.6g}" if isinstance(v, float) else str(v)
