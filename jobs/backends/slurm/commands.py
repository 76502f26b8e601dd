"""Thin wrappers around the Slurm client commands (sbatch, squeue, sacct, scontrol, scancel).

The only place that runs them, so that retries, one-line errors and which failures are
transient live in one module. sbatch is retried on transient controller failures with exponential back-off, and a
retry after an attempt that may have reached the controller first asks squeue whether it went
through (every job carries a unique `--comment=recsys:<token>`), so a job is never submitted
twice; giving up says whether the job went in, did not, or (controller unreachable) cannot tell.
sbatch inherits the submitter's submit locks (jobs.submit marks them inheritable), so a submitter
killed while sbatch still runs leaves its lock held until sbatch itself has exited: nobody
settles the run as "never submitted" while its job may still go in (jobs.recovery).
"""

import os
import re
import time

from jobs.errors import SlurmCommandError, SubmitError

TRANSIENT = (
    "socket timed out",
    "unable to contact slurm controller",
    "slurm temporarily unable",
    "resource temporarily unavailable",
    "connection timed out",
    "connection refused",
    "zero bytes were transmitted",
    "slurm_persist_conn_open",
)
NOT_DELIVERED = ("connect failure", "connection refused")
# every job the controller knows, with its comment (where a submission's token is looked for)
SQUEUE_TOKENS = ["squeue", "-h", "-a", "-o", "%F|%k", "--states=all"]


def _env():
    return None  # inherit os.environ (SLURM_CONF, PATH), read at call time


def run(args, timeout=120, check=False, inherit=False):
    """Run one Slurm client command; returns CompletedProcess (text). `inherit`: the command
    inherits the file descriptors this process marked inheritable (sbatch: the submit locks)."""
    import subprocess   # lazily: `render` never runs a Slurm command

    try:
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=_env(),
                              close_fds=not inherit)
    except FileNotFoundError:
        raise error(f"{args[0]}: command not found (is Slurm installed and on PATH?)") from None
    except subprocess.TimeoutExpired:
        raise error(f"{args[0]}: no answer within {timeout} s") from None
    if check and proc.returncode != 0:
        raise error(f"{' '.join(args[:2])}: {first_line(proc.stderr or proc.stdout)}")
    return proc


def error(message):
    """The SlurmCommandError of a failed command, transient when the controller did not answer."""
    return SlurmCommandError(message, transient=is_transient(message))


def failed(command, proc):
    """The SlurmCommandError of a command that exited non-zero: its first error line."""
    return error(f"{command}: {first_line(proc.stderr)}")


def first_line(text):
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return "(no message)"


def is_transient(message):
    low = (message or "").lower()
    return any(t in low for t in TRANSIENT)


def find_by_token(token):
    """Job id of a queued/running/recent job whose comment is recsys:<token>; None when absent.
    Raises SlurmCommandError when squeue itself cannot answer (then nothing is known)."""
    proc = run(SQUEUE_TOKENS, timeout=60)
    if proc.returncode != 0:
        raise failed("squeue", proc)
    return job_with_token(proc.stdout, token)


def job_with_token(text, token):
    """The job id in `squeue -h -o %F|%k` output whose comment is recsys:<token>, or None."""
    for line in text.splitlines():
        job_id, _, comment = line.partition("|")
        if comment.strip() == f"recsys:{token}":
            return job_id.strip()
    return None


def _retry_settings(retries, backoff):
    if retries is None:
        retries = int(os.environ.get("RECSYS_SBATCH_RETRIES", "5"))
    if backoff is None:
        backoff = float(os.environ.get("RECSYS_SBATCH_BACKOFF", "2"))
    return retries, backoff


def never_delivered(message):
    """The client could not even connect: the request never reached the controller."""
    low = (message or "").lower()
    return any(t in low for t in NOT_DELIVERED)


def sbatch(script, token, args=(), retries=None, backoff=None, log=None):
    """Submit `script`; returns the job id. Transient failures are retried with back-off
    (backoff, 2*backoff, ...). Once an attempt may have reached the controller (a timeout, not a
    refused connection), every later attempt first asks squeue for the token, and so does giving
    up: a job is never submitted twice, and an error says whether it went in."""
    retries, backoff = _retry_settings(retries, backoff)
    last, maybe_in = "", False
    for attempt in range(retries + 1):
        if attempt:
            delay = backoff * (2 ** (attempt - 1))
            if log:
                log(f"sbatch: transient failure ({last}); retry {attempt}/{retries} in {delay:g} s")
            time.sleep(delay)
            if maybe_in:
                try:
                    found = find_by_token(token)
                except SlurmCommandError as exc:
                    last = str(exc)
                    continue        # cannot tell whether it went through: do not submit again yet
                if found:
                    return found
        # inherit: the submit lock stays held while sbatch runs, even when its submitter is killed
        proc = run(["sbatch", "--parsable"] + list(args) + [str(script)], timeout=120, inherit=True)
        if proc.returncode == 0:
            job_id = proc.stdout.strip().splitlines()[-1].split(";")[0].strip()
            if re.match(r"^\d+$", job_id):
                return job_id
            last = f"unexpected sbatch output {proc.stdout.strip()!r}"
            raise SubmitError(f"sbatch {script}: {last}")
        last = first_line(proc.stderr or proc.stdout)
        if not is_transient(proc.stderr + proc.stdout):
            raise SubmitError(f"sbatch {script}: {last}")
        maybe_in = maybe_in or not never_delivered(proc.stderr + proc.stdout)
    failing = f"sbatch {script}: still failing after {retries} retries: {last}"
    if not maybe_in:
        raise SubmitError(f"{failing} (no attempt reached the controller: comment recsys:{token} not submitted)")
    try:        # a timed-out attempt may still have gone in (the reply was lost): look once more
        found = find_by_token(token)
    except SlurmCommandError as exc:
        raise SubmitError(f"{failing}; whether it went in is unknown ({exc}): look for comment "
                          f"recsys:{token} in `squeue --states=all -o %i,%k`", uncertain=True) from None
    if found:
        return found
    raise SubmitError(f"{failing} (not in the queue: comment recsys:{token} not submitted)")


_CONFIG = {}


def show_config():
    """`scontrol show config` as a dict (cached per process once the controller answered); {} while
    it is not reachable, asked again next time (an outage must not stick for the process's life)."""
    if "config" not in _CONFIG:
        try:
            proc = run(["scontrol", "show", "config"], timeout=60)
        except SlurmCommandError:
            return {}
        if proc.returncode != 0:
            return {}
        _CONFIG["config"] = parse_config(proc.stdout)
    return _CONFIG["config"]


def parse_config(text):
    """`scontrol show config` output as {key: value}."""
    config = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
    return config


def reset_cache():
    """Forget the cached `scontrol show config` (another cluster, e.g. in tests)."""
    _CONFIG.clear()


def max_array_size(default):
    """The cluster's MaxArraySize (array indices must stay below it): $RECSYS_MAX_ARRAY_SIZE,
    else `scontrol show config`, else the profile's value."""
    override = os.environ.get("RECSYS_MAX_ARRAY_SIZE", "")
    if override.isdigit() and int(override) > 0:
        return int(override)
    value = show_config().get("MaxArraySize", "")
    return int(value) if value.isdigit() else int(default)


def accounting_enabled():
    """True when slurmdbd accounting is configured (so sacct can answer)."""
    storage = show_config().get("AccountingStorageType", "")
    return bool(storage) and not storage.endswith("/none")


def job_id_from_logs(run_dir, key):
    """The job id in the name of a batch output `logs/<key>-<id>[_<task>].out` (written by Slurm
    when the job starts: jobs.backends.slurm.script.log_paths), or None."""
    logs = os.path.join(run_dir, "logs")
    try:
        names = os.listdir(logs)
    except OSError:
        return None
    pattern = re.compile(rf"^{re.escape(key)}-(\d+)(?:_\d+)?\.out$")
    for name in sorted(names):
        match = pattern.match(name)
        if match:
            return match.group(1)
    return None


def seconds_since(stamp):
    """Seconds from a time.time() stamp to now (None without a stamp)."""
    return None if stamp is None else max(0.0, time.time() - float(stamp))


def min_job_age():
    """The controller's MinJobAge in seconds (how long it keeps an ended job), or None when it
    cannot be asked."""
    value = show_config().get("MinJobAge", "")
    match = re.match(r"^(\d+)", value)
    return int(match.group(1)) if match else None
