"""The JSON Schema of a profile file (`recsys-submit profiles schema`), for an editor's YAML
language server: completion of every key, its type, and unknown keys marked as the validator
would refuse them. Built from the validator's own key sets (jobs.profiles.schema, .fabric), so a
key the validator learns is in the schema too (tests/jobs/test_editor_schema.py holds the two
equal and every built-in profile valid). The schema checks shapes; the validator
(`recsys-submit profiles check`) remains the judge of values (CPU lists, NUMA maps, ranges)."""
from __future__ import annotations

from typing import Any, Dict

from .fabric import CORE_SHARING_KEYS, FABRIC_KEYS, GPU_KEYS, LEVEL_KEYS, LEVELS, MEASURED_KEYS
from .schema import CONTAINER_KEYS, DEFAULT_KEYS, NODE_KEYS, PROFILE_KEYS

DRAFT = "https://json-schema.org/draft/2020-12/schema"
STRING, INTEGER, NUMBER, BOOLEAN = ({"type": "string"}, {"type": "integer"}, {"type": "number"},
                                    {"type": "boolean"})
STRINGS = {"type": "array", "items": STRING}
CPU_LIST = {"type": ["string", "integer", "array"], "items": {"type": "integer"},
            "description": "a CPU list such as 0-15,128-143 (or a list of CPU numbers)"}


def nullable(schema: Dict[str, Any]) -> Dict[str, Any]:
    """A key written with no value (``partition:``) is the key left out, for the validator too."""
    out = dict(schema)
    if "oneOf" in out:
        out["oneOf"] = [*out["oneOf"], {"type": "null"}]
    elif "enum" in out:
        out["enum"] = [*out["enum"], None]
    elif "type" in out:
        out["type"] = [*(out["type"] if isinstance(out["type"], list) else [out["type"]]), "null"]
    return out


def _object(properties: Dict[str, Any], description: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {"type": "object", "properties": {k: nullable(v) for k, v in properties.items()},
                           "additionalProperties": False}
    if description:
        out["description"] = description
    return out


NODE = _object({
    "name": {**STRING, "description": "the node type's name (published results match on it)"},
    "gpus": {**INTEGER, "minimum": 0}, "gpu_model": STRING, "gpu_memory_gb": NUMBER,
    "sockets": {**INTEGER, "minimum": 1}, "cores_per_socket": {**INTEGER, "minimum": 1},
    "threads_per_core": {**INTEGER, "minimum": 1}, "memory_gb": NUMBER,
    "numa_cpus": {"type": "object", "additionalProperties": CPU_LIST,
                  "description": "NUMA node id -> its CPU list"},
    "gpu_numa": {"type": "array", "items": INTEGER, "description": "each GPU's NUMA node"},
    "gpu_cores": {"type": "array", "items": CPU_LIST, "description": "each GPU's exclusive physical cores"},
    "ht_offset": {**INTEGER, "description": "the HT sibling of core c is c + ht_offset"},
    "nics": {**STRINGS, "description": "each GPU's NIC (repeat one shared by a GPU pair)"},
}, "the node type: GPUs, cores, NUMA and GPU-to-CPU/NIC maps")
CONTAINER = _object({"image": {**STRING, "description": "a registry image or a squashfs path (pyxis)"},
                     "mounts": {**STRINGS, "description": "SRC:DST[:FLAGS] each"},
                     "workdir": STRING, "provides": STRINGS},
                    "the container the job's steps run in (pyxis/enroot)")
_PY_TYPES = {str: STRING, bool: BOOLEAN, int: INTEGER, float: NUMBER}
DEFAULTS = _object({key: ({**_PY_TYPES[typ], "enum": list(choices)} if isinstance(choices, (list, tuple))
                          else dict(_PY_TYPES[typ]))
                    for key, (typ, choices) in DEFAULT_KEYS.items()}, "defaults for requests and jobs")
_LEVEL_TYPES = {"link": STRING, "gb_per_s": NUMBER, "latency_us": NUMBER, "nics": INTEGER, "nic_gb_per_s": NUMBER}
_MEASURED = {"type": "object", "additionalProperties": _object({k: NUMBER if k == "latency_us" else {}
                                                                for k in sorted(MEASURED_KEYS)})}
FABRIC = _object({
    "source": STRING,
    **{level: _object({k: _LEVEL_TYPES.get(k, {}) for k in sorted(LEVEL_KEYS[level])}) for level in LEVELS},
    "measured": {"type": "object", "properties": {"source": STRING, **{level: _MEASURED for level in LEVELS}},
                 "additionalProperties": False},
    "core_sharing": _object({k: {} for k in sorted(CORE_SHARING_KEYS)}),
    "gpu": _object({"source": STRING, "tflops": {"type": "object", "additionalProperties": NUMBER},
                    "memory_gb_per_s": NUMBER}),
}, "the GPUs' fabric: bandwidths and latencies inside and between nodes (study project)")
PROFILE = {
    "name": STRING, "description": STRING,
    "extends": {**STRING, "description": "a profile (name or path) whose keys this one overrides"},
    "scheduler": {**STRING, "enum": ["slurm", "local"]},
    "node": {"oneOf": [NODE, {**STRING, "description": "a profile whose node to reuse, or 'detect'"}]},
    "max_nodes": {**INTEGER, "minimum": 1}, "partition": STRING, "account": STRING, "qos": STRING,
    "default_time": {"type": ["string", "integer"], "description": "a Slurm time limit, e.g. \"02:00:00\""},
    "max_array_size": {**INTEGER, "minimum": 1}, "mpi": STRING,
    "container": CONTAINER, "setup": {**STRINGS, "description": "shell lines run before the job's steps"},
    "env": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]},
            "description": "environment of the job's steps"},
    "sbatch_extra": {**STRINGS, "description": "further sbatch options, one per entry"},
    "switches": {"type": ["string", "integer"], "description": "COUNT[@MAX_WAIT]"},
    "python": {**STRING, "description": "the interpreter the job runs the engines with"},
    "defaults": DEFAULTS, "shared_nodes": BOOLEAN, "fabric": FABRIC,
    "scratch": {**STRING, "description": "node-local scratch (absolute path)"},
}


def profile_schema() -> Dict[str, Any]:
    """The profile file format as a JSON Schema (draft 2020-12)."""
    return {"$schema": DRAFT, "$id": "https://recsys-submit.invalid/schemas/profile.json",
            "title": "recsys-submit cluster profile", **_object(PROFILE)}


def check_keys() -> None:
    """The schema names exactly the validator's keys (an AssertionError names the difference)."""
    for where, schema, keys in (("profile", PROFILE, PROFILE_KEYS), ("node", NODE["properties"], NODE_KEYS),
                                ("container", CONTAINER["properties"], CONTAINER_KEYS),
                                ("defaults", DEFAULTS["properties"], set(DEFAULT_KEYS)),
                                ("fabric", FABRIC["properties"], FABRIC_KEYS),
                                ("fabric.gpu", FABRIC["properties"]["gpu"]["properties"], GPU_KEYS)):
        assert set(schema) == set(keys), f"{where}: schema {sorted(set(schema) ^ set(keys))} differ from the validator"
