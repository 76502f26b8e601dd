"""Typed records of a run: request.json, jobs.json and the result of a status poll.

One schema for every backend (Slurm and local write the same fields), each file carrying a
`version`, so that a record written by another release is refused with one line instead of
being misread. Records read like mappings too (`record["jobs"][0]["job_id"]`), which keeps
the Python API's documented dict access working.
"""

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from jobs.errors import RequestError

from .atomic import read_json, write_json

RECORD_VERSION = 1

# states of a submission (RunRecord.state)
SUBMITTING, SUBMITTED, PARTIAL = "submitting", "submitted", "partial"
CANCELLED_PARTIAL, CANCEL_FAILED = "cancelled-partial", "cancel-failed"
# what became of one job (JobRecord.outcome) when its chain broke at submission
OUTCOMES = ("submitted", "cancelled", "cancel-failed", "kept")


class Record:
    """Read access by key, and plain data for JSON."""

    def __getitem__(self, key):
        if key not in self._keys():
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key):
        return key in self._keys()

    def get(self, key, default=None):
        return getattr(self, key) if key in self._keys() else default

    @classmethod
    def _names(cls):
        """The field names, in order (worked out once per class)."""
        names = cls.__dict__.get("_field_names")
        if names is None:
            names = tuple(f.name for f in dataclasses.fields(cls))
            setattr(cls, "_field_names", names)
        return names

    @classmethod
    def _keys(cls):
        return frozenset(cls._names())

    def to_dict(self):
        """Plain data, as dataclasses.asdict gives it, without its deep copy of every value:
        records hold plain JSON values and other records, and are written many times a study."""
        return {name: _plain(getattr(self, name)) for name in self._names()}


def _plain(value):
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        items = [_plain(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _check_version(data, path, version=RECORD_VERSION, kind="run"):
    if not isinstance(data, dict):
        raise RequestError(f"{path}: not a {kind} record (expected a JSON object)")
    found = data.get("version", version)    # records before versioning read as the first version
    if found != version:
        what = "record" if kind == "run" else f"{kind} record"
        raise RequestError(f"{path}: {what} version {found!r} is not known to this recsys-submit "
                           f"(it reads version {version})")


def read_record(path, version=RECORD_VERSION, kind="run"):
    """The JSON object of a versioned record file (a run's, or `kind`'s: a study's), checked: one
    line naming the file for bad JSON, a file too large or nested too deep (jobs.runs.atomic's
    limits), another type or a version this release does not read."""
    try:
        data = read_json(path)      # bad JSON, too large, too deep: one line naming the file
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    _check_version(data, path, version, kind)
    return data


def relative_path(path, base):
    """`path` relative to `base` when it lies under it (what a record keeps of a path inside
    its own directory, so the directory may move), else as it is."""
    if isinstance(path, str) and os.path.isabs(path):
        rel = os.path.relpath(path, base)
        if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
            return rel
    return path


def resolved_path(path, base, recorded_base=None):
    """The absolute path of a recorded `path` in a record of the directory `base`: a relative
    one under `base`; an absolute one under `recorded_base` (where the directory was when an
    older release wrote it) moved under `base`; any other as it is."""
    if not isinstance(path, str):
        return path
    if not os.path.isabs(path):
        return os.path.normpath(os.path.join(base, path))
    if recorded_base and os.path.isabs(recorded_base):
        rel = relative_path(path, recorded_base)
        if not os.path.isabs(rel):
            return os.path.normpath(os.path.join(base, rel))
    return path


def known_fields(cls, data):
    keys = cls._keys()
    return {k: v for k, v in data.items() if k in keys}


def _type_ok(value, hint):
    """Whether a JSON value fits a field's annotation (str, int, float, bool, Any, Optional[...],
    List[...], Dict[str, ...], a Record class)."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        return any(_type_ok(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin in (list, List):
        return isinstance(value, list) and all(_type_ok(v, args[0]) for v in value) if args else isinstance(value, list)
    if origin in (dict, Dict):
        return isinstance(value, dict) and (not args or all(isinstance(k, str) and _type_ok(v, args[1])
                                                            for k, v in value.items()))
    if isinstance(hint, type) and issubclass(hint, Record):
        return isinstance(value, dict)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _json_type(value):
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def typed_fields(cls, data, path, where=""):
    """known_fields(cls, data), checked against the class's fields: a required field missing or a
    value of another JSON type is one RequestError line naming the file and the field (a record
    that is valid JSON with wrong fields must not end in a traceback)."""
    if not isinstance(data, dict):
        raise RequestError(f"{path}: {where or cls.__name__}: expected a JSON object, not {_json_type(data)}")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        name = f"{where}.{f.name}" if where else f.name
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RequestError(f"{path}: field {name!r} is missing")
            continue
        value, hint = data[f.name], hints[f.name]
        if _type_ok(value, hint):
            continue
        item = typing.get_args(hint)[0] if typing.get_origin(hint) in (list, List) and typing.get_args(hint) else None
        if isinstance(value, list) and item is not None:
            index = next(i for i, v in enumerate(value) if not _type_ok(v, item))
            raise RequestError(f"{path}: field {name!r}: item {index} is {_json_type(value[index])}, not of "
                               "the type this recsys-submit writes")
        raise RequestError(f"{path}: field {name!r} is {_json_type(value)}, not of the type this "
                           "recsys-submit writes")
    return known_fields(cls, data)


@dataclass
class JobRecord(Record):
    """One submitted job (a Slurm job or array, or one local process tree)."""

    key: str                                 # plan key: main, train, transform.0, ...
    name: str
    job_id: Optional[str]                    # Slurm job id, or the local controller's pid (None: an intent)
    array_size: int = 0                      # Slurm array tasks (0: not an array)
    task_offset: int = 0                     # first RECSYS_TASK_INDEX of this array chunk
    task_index: Optional[int] = None         # local array task this process runs
    ntasks: int = 1                          # local processes whose results settle the job
    script: Optional[str] = None             # the rendered sbatch script (Slurm)
    token: Optional[str] = None              # --comment=recsys:<token> (Slurm retries)
    after_ok: List[str] = field(default_factory=list)
    after_any: List[str] = field(default_factory=list)
    outcome: str = "submitted"               # one of OUTCOMES
    submitted_at: Optional[float] = None     # time.time() just before its submission was attempted

    @classmethod
    def from_dict(cls, data, path="jobs.json", where="jobs[]"):
        return cls(**typed_fields(cls, data, path, where))


@dataclass
class RunRecord(Record):
    """jobs.json: what a submission did, rewritten atomically before and after every job it
    submits. `intent` is the job whose submission is under way: written (with its token) before
    `sbatch` runs and cleared in the same write that records the job id, so a submitter killed in
    between leaves a record saying what may have gone in; every later look at the run settles it
    by the token (jobs.recovery) before deciding anything. `planned`: every job key of the chain."""

    run_dir: str
    profile: str
    profile_path: Optional[str]
    scheduler: str
    accounting: bool = False                 # Slurm with slurmdbd: status asks sacct
    state: str = SUBMITTING                  # SUBMITTING, SUBMITTED, PARTIAL, CANCELLED_PARTIAL, CANCEL_FAILED
    jobs: List[JobRecord] = field(default_factory=list)
    error: Optional[str] = None
    foreground: bool = False                 # the jobs ran to their end before submit returned
    uncertain: bool = False                  # a failed sbatch may or may not have gone in (`error` says which job)
    intent: Optional[JobRecord] = None       # the job being submitted (no job_id yet), see above
    planned: List[str] = field(default_factory=list)
    version: int = RECORD_VERSION

    def save(self, durable=False):
        """`durable`: flushed to disk before it replaces the old one (the write of an intent)."""
        write_json(os.path.join(self.run_dir, "jobs.json"), self.to_dict(), durable=durable)

    @classmethod
    def from_dict(cls, data, path="jobs.json"):
        _check_version(data, path)
        values = typed_fields(cls, data, path)
        values["jobs"] = [JobRecord.from_dict(j, path) for j in data.get("jobs", [])]
        if values.get("intent") is not None:
            values["intent"] = JobRecord.from_dict(values["intent"], path, "intent")
        values["version"] = RECORD_VERSION
        return cls(**values)

    @classmethod
    def load(cls, run_dir):
        path = os.path.join(run_dir, "jobs.json")
        try:
            record = cls.from_dict(read_record(path), path)
        except OSError as exc:
            raise RequestError(f"run: {run_dir!r} is not a run directory ({path}: {exc.strerror})") from None
        record.run_dir = os.path.abspath(run_dir)     # the directory may have moved (a moved study)
        return record


@dataclass
class RequestRecord(Record):
    """request.json: the requests and the profile as loaded, so a run can be reproduced."""

    requests: List[Dict[str, Any]]
    profile: Dict[str, Any]
    version: int = RECORD_VERSION

    def save(self, run_dir):
        write_json(os.path.join(run_dir, "request.json"), self.to_dict())

    @classmethod
    def load(cls, run_dir):
        path = os.path.join(run_dir, "request.json")
        return cls(**typed_fields(cls, read_record(path), path))


@dataclass
class JobStatus(Record):
    """One job's state in a poll; `tasks` has one entry per array task."""

    key: str
    job_id: str
    name: Optional[str]
    state: str
    tasks: Dict[str, str]
    summary: Optional[Dict[str, Any]] = None  # the engine log's last `summary` record (finished, not an array)
    reason: Optional[str] = None              # why it failed, from its logs (jobs.runs.enginelog)


@dataclass
class StatusResult(Record):
    """One status poll of a run."""

    run_dir: str
    jobs: List[JobStatus]
    done: bool
    calls: int                               # Slurm commands this poll issued
    source: str                              # sacct | squeue | cache | local
    submission: Optional[str] = None         # RunRecord.state
