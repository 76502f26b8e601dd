"""The JSON Schema of a study spec (`recsys-submit study schema`), for an editor's YAML language
server: every key with the description the spec's own key table gives (jobs.study.spec.KEYS) and
its type. tests/jobs/test_editor_schema.py holds its keys equal to the validator's and every docs
and packaged spec valid against it; `study run --dry-run` remains the judge of values."""
from __future__ import annotations

from typing import Any, Dict

from jobs.profiles.editor_schema import DRAFT, nullable
from jobs.vocabulary import MODELS

from ..spec import KEYS, MODES, PLACEMENTS, SPEC_VERSION

POSITIVE, COUNT = {"type": "integer", "minimum": 1}, {"type": "integer", "minimum": 0}
SCALAR = {"type": ["string", "number", "boolean"]}
TYPES: Dict[str, Dict[str, Any]] = {
    "version": {"enum": [SPEC_VERSION]}, "name": {"type": "string"}, "description": {"type": "string"},
    "model": {"enum": list(MODELS)}, "scaling": {"enum": list(MODES)}, "batch_size": POSITIVE,
    "gpus": {"type": "array", "items": POSITIVE, "minItems": 1, "uniqueItems": True},
    "points": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["nodes"], "additionalProperties": False,
        "properties": {"nodes": POSITIVE, "gpus_per_node": POSITIVE}}},
    "variants": {"type": "object", "additionalProperties": {"type": "array", "items": SCALAR, "minItems": 1}},
    "repeats": POSITIVE, "warmup_steps": COUNT, "steps": POSITIVE, "breakdown_steps": COUNT,
    "time": {"type": ["string", "integer"]}, "data_path": {"type": "string"}, "synthetic": {"type": "boolean"},
    "engine_args": {"type": "array", "items": {"type": ["string", "number"]}},
    "profile_steps": {"type": "string", "pattern": "^[0-9]+-[0-9]+$"},
    "placement": {"enum": list(PLACEMENTS)},
}


def study_schema() -> Dict[str, Any]:
    """The study spec format as a JSON Schema (draft 2020-12)."""
    assert set(TYPES) == set(KEYS), f"schema and spec keys differ: {sorted(set(TYPES) ^ set(KEYS))}"
    return {"$schema": DRAFT, "$id": "https://recsys-submit.invalid/schemas/study.json",
            "title": "recsys-submit study spec", "type": "object", "required": ["model"],
            "additionalProperties": False,
            "properties": {key: {**nullable(TYPES[key]), "description": KEYS[key]} for key in KEYS}}
