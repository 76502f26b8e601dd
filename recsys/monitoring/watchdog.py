"""The no-progress watchdog: a rank whose steps stop completing says where it waits, and the job ends.

A rank that hangs in a collective (a peer stopped, dead or deadlocked) would otherwise hold the
whole allocation until its time limit, and the job would end as a TIMEOUT that names nothing. A
daemon thread per rank watches the time since the last completed step (``step_done``). When it
passes the limit the rank prints one line (``recsys-train: error: hung: rank R waits in PHASE at
step N ...``), dumps every thread's Python stack to its log (faulthandler), appends a ``hang``
record to the engine log and exits with HANG_EXIT_CODE; srun's ``--kill-on-bad-exit`` then ends
the step's other ranks, so Slurm and a study see a failure with a reason within the limit.

What a rank can honestly say: its own phase (the engine marks the phases where a step waits:
the input, the fused step with its gradient allreduce, the split step's units, the collectives
outside the steps), and, through the other ranks' heartbeats, which peer stopped answering. Each
live rank's watchdog thread rewrites ``rank<R>.json`` in a heartbeat directory beside the engine
log about once a second (phase, step, time of its last progress); a stopped or dead rank's file
goes stale, and the waiting rank names it. A stopped rank itself can say nothing (its watchdog
thread is stopped with it); a rank alive but stuck elsewhere is named with its own phase.

The limit: ``--hang-timeout S`` (or ``$RECSYS_HANG_TIMEOUT``, the profile's ``hang_timeout``)
between steps; by default max(HANG_FLOOR_S, HANG_FACTOR x the slowest step so far). Before the
first step, and in phases that are not steps (evaluation batches, checkpoints), at least the start-up
limit, STARTUP_LIMIT_S unless ``$RECSYS_STARTUP_TIMEOUT`` (the profile's ``startup_timeout``) sets
it: tracing, compiling and writing a large checkpoint take longer than a step. 0 switches the watchdog off.
The watchdog is armed before Horovod's initialisation (rank and size from the launcher), so a rank
stuck in MPI/PMIx or NCCL start-up, or waiting for a peer that never started, is named too.
"""

import faulthandler
import json
import os
import sys
import threading
import time

# Exit status of a rank the watchdog ended (the batch script reads it: a hung step is not requeued).
HANG_EXIT_CODE = 86
HANG_FLOOR_S = 60.0           # the default limit between steps is never shorter than this
HANG_FACTOR = 20.0            # ... and at least this many times the slowest step measured so far
STARTUP_LIMIT_S = 1800.0      # before the first step and outside the steps (eval, checkpoint)
HEARTBEAT_S = 1.0             # how often each rank rewrites its heartbeat
STALE_S = 5.0                 # a heartbeat older than this: that rank's process is not running
ENV = "RECSYS_HANG_TIMEOUT"
STARTUP_ENV = "RECSYS_STARTUP_TIMEOUT"
HOROVOD_INIT = "Horovod's initialisation (hvd.init: MPI/PMIx wire-up, every rank joining)"
MARKER_ENV = "RECSYS_HANG_MARKER"     # set by slurm/job.sbatch.tmpl: a file to create when this fires
# Phase names the engine marks (recsys.engine); the split step's units name themselves there.
INPUT = "the input pipeline (next batch)"
FUSED_STEP = "the training step (forward, backward, gradient exchange, optimizer: one call)"

_current = None               # the process's watchdog (None: off, and every call below is a no-op)


def resolve_limit(flag, environ=None, name=ENV):
    """The limit in seconds from --hang-timeout, else $RECSYS_HANG_TIMEOUT; None: the default
    (scaled from the step time), 0: off. A bad environment value is a ValueError with one line."""
    if flag is not None:
        return float(flag)
    raw = (environ if environ is not None else os.environ).get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"${name}: {raw!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"${name}: must be >= 0 seconds, got {raw!r}")
    return value


def resolve_startup_limit(environ=None):
    """The start-up limit in seconds: $RECSYS_STARTUP_TIMEOUT (a profile's ``startup_timeout``), else
    STARTUP_LIMIT_S. A bad value is a ValueError with one line."""
    value = resolve_limit(None, environ, STARTUP_ENV)
    if value == 0:
        raise ValueError(f"${STARTUP_ENV}: must be > 0 seconds (--hang-timeout 0 switches the watchdog off)")
    return STARTUP_LIMIT_S if value is None else value


def heartbeat_dir(log_path):
    """Where the ranks' heartbeats go: beside the engine log (the run directory, which every node
    sees); None without a log (a rank then cannot tell which peer stopped)."""
    return f"{log_path}.ranks" if log_path else None


class Watchdog:
    """One rank's watchdog thread; the engine calls phase() and step_done() (cheap: attributes)."""

    def __init__(self, rank, size, limit=None, log_path=None, stream=None, clock=time.monotonic, exit=os._exit,
                 startup_limit=STARTUP_LIMIT_S):
        self.rank, self.size, self.limit = int(rank), int(size), limit
        self.startup_limit = float(startup_limit)
        self.log_path, self.beats = log_path, heartbeat_dir(log_path) if size > 1 else None
        self.stream = stream or sys.stderr
        self._clock, self._exit = clock, exit
        self.phase_name, self.step, self.stepping = "start-up", 0, False
        self.slowest = 0.0
        self._last = clock()
        self._stop = threading.Event()
        self._thread = None

    # --- called by the engine ----------------------------------------------------------
    def phase(self, name):
        """Where this rank is now (a step's unit, or a collective)."""
        self.phase_name = name

    def step_done(self, step=None):
        """A step completed: the clock restarts; its duration feeds the default limit."""
        now = self._clock()
        if self.stepping:
            self.slowest = max(self.slowest, now - self._last)
        self.stepping = True
        self.step = self.step + 1 if step is None else int(step)
        self._last = now

    def outside_steps(self, name):
        """A phase that is not a step (evaluation, checkpoint): progress now, the long limit."""
        self.phase_name, self.stepping, self._last = name, False, self._clock()

    # --- the limit and the thread ---------------------------------------------------------
    def current_limit(self):
        if not self.stepping:
            return max(self.startup_limit, self.limit or 0.0)
        if self.limit:
            return self.limit
        return max(HANG_FLOOR_S, HANG_FACTOR * self.slowest)

    def start(self):
        if self.beats:
            os.makedirs(self.beats, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="recsys-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()

    def _run(self):
        interval = min(HEARTBEAT_S, max(0.1, (self.limit or HEARTBEAT_S) / 10))
        previous = self._clock()
        while not self._stop.wait(interval):
            if self.tick(previous, interval):
                return
            previous = self._clock()

    def tick(self, previous, interval):
        """One look: True when it fired. A tick that comes far later than asked means this process
        was not running (SIGSTOP, a Slurm suspend, a debugger): that time is not counted, so a
        resumed job goes on and a stopped rank that is resumed only to be killed does not blame a
        peer for its own pause."""
        now = self._clock()
        gap = now - previous
        if gap > interval + max(2.0, 3 * interval):
            self._last += gap - interval
        self._beat()
        waited = now - self._last
        if waited > self.current_limit():
            self.fire(waited)
            return True
        return False

    def _beat(self):
        if not self.beats:
            return
        path = os.path.join(self.beats, f"rank{self.rank}.json")
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w") as handle:
                json.dump({"rank": self.rank, "phase": self.phase_name, "step": self.step,
                           "time": time.time(), "idle_s": round(self._clock() - self._last, 3)}, handle)
            os.replace(tmp, path)
        except OSError:
            pass            # a heartbeat is best effort; the limit still holds

    def peers(self, now=None):
        """[(rank, what)] of the other ranks, from their heartbeats: 'no heartbeat for N s' for a
        rank whose process is not running (stopped, dead), else its phase and step."""
        if not self.beats:
            return []
        now = time.time() if now is None else now
        out = []
        for rank in range(self.size):
            if rank == self.rank:
                continue
            try:
                with open(os.path.join(self.beats, f"rank{rank}.json")) as handle:
                    beat = json.load(handle)
                age = now - float(beat["time"])
            except (OSError, ValueError, KeyError, TypeError):
                out.append((rank, "no heartbeat at all", True))
                continue
            if age > STALE_S:
                out.append((rank, f"no heartbeat for {age:.0f} s: stopped or gone; last seen in "
                                  f"{beat.get('phase')} at step {beat.get('step')}", True))
            else:
                out.append((rank, f"alive, in {beat.get('phase')} at step {beat.get('step')}", False))
        return out

    def message(self, waited, peers):
        """The one line: who, where, for how long, and which peer it waits for when knowable."""
        line = (f"hung: rank {self.rank} waits in {self.phase_name} at step {self.step}: no step completed "
                f"for {waited:.0f} s (limit {self.current_limit():.0f} s)")
        silent = [f"rank {r} ({what})" for r, what, stale in peers if stale]
        if silent:
            line += "; waits for " + ", ".join(silent)
        elif peers:
            line += "; every other rank is alive (a deadlock, not a stopped rank): " + \
                    ", ".join(f"rank {r} {what}" for r, what, _ in peers[:4])
        elif self.size > 1:
            line += "; which rank it waits for is not known (no --log-path, so no heartbeats)"
        return line

    def fire(self, waited):
        """Say it, dump the stacks, record it, end the process (HANG_EXIT_CODE)."""
        peers = self.peers()
        line = self.message(waited, peers)
        try:
            print(f"recsys-train: error: {line}", file=self.stream, flush=True)
            faulthandler.dump_traceback(file=self.stream, all_threads=True)
            self.stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
        if self.log_path:
            record = {"type": "hang", "time": round(time.time(), 3), "rank": self.rank, "phase": self.phase_name,
                      "step": self.step, "waited_s": round(waited, 1), "limit_s": round(self.current_limit(), 1),
                      "waits_for": [r for r, _, stale in peers if stale], "message": line}
            try:    # one line appended (the chief's logger may hold the file open: lines stay whole)
                with open(self.log_path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(record) + "\n")
            except OSError:
                pass
        marker = os.environ.get(MARKER_ENV)
        if marker:                  # the batch script's sign that the step hung (no requeue, exit 86)
            try:
                open(marker, "a").close()
            except OSError:
                pass
        self._exit(HANG_EXIT_CODE)


def start(rank, size, limit, log_path=None, startup_limit=STARTUP_LIMIT_S, phase_name=None):
    """Start this process's watchdog (limit 0: none). Returns it, or None."""
    global _current
    if limit == 0:
        return None
    _current = Watchdog(rank, size, limit, log_path, startup_limit=startup_limit)
    if phase_name:
        _current.phase_name = phase_name
    _current.start()
    return _current


def joined(rank, size):
    """Horovod's rank and size once it has initialised (the launcher's were used before)."""
    if _current is not None:
        _current.rank, _current.size = int(rank), int(size)
        _current.phase_name = "start-up"


def stop():
    global _current
    if _current is not None:
        _current.stop()
    _current = None


def phase(name):
    if _current is not None:
        _current.phase_name = name


def step_done(step=None):
    if _current is not None:
        _current.step_done(step)


def outside_steps(name):
    if _current is not None:
        _current.outside_steps(name)
