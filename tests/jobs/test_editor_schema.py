"""Issue 44 item 3: `recsys-submit profiles schema` and `study schema` publish the profile and the
study spec formats as JSON Schemas an editor's YAML language server can use. Their keys are the
validators' own; every built-in profile and every docs and packaged spec validates against them
(checked with jsonschema, `[dev]`); a misspelt key does not."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from jobs import cli
from jobs.profiles.editor_schema import check_keys, profile_schema
from jobs.study.running.editor_schema import study_schema
from jobs.study.spec import KEYS
from slurm.common.yamlfile import load_yaml_file

pytestmark = pytest.mark.fast
REPO = Path(__file__).resolve().parents[2]
PROFILES = sorted((REPO / "cluster_profiles").glob("*.yaml"))
SPECS = sorted({p.resolve() for p in [*(REPO / "docs" / "studies").glob("*.yaml"),
                                      *(REPO / "jobs" / "study" / "examples").glob("*.yaml")]})


def _validator(schema):
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_schemas_name_the_validators_keys():
    check_keys()
    assert set(study_schema()["properties"]) == set(KEYS)
    assert all(study_schema()["properties"][k]["description"] == KEYS[k] for k in KEYS)


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_every_built_in_profile_is_valid(path):
    errors = [e.message for e in _validator(profile_schema()).iter_errors(load_yaml_file(path))]
    assert not errors, errors


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_every_docs_and_packaged_spec_is_valid(path):
    errors = [e.message for e in _validator(study_schema()).iter_errors(load_yaml_file(path))]
    assert not errors, errors


def test_a_misspelt_key_or_a_wrong_type_is_marked():
    spec = {"model": "dlrm", "gpus": [1, 2], "repeat": 3, "scaling": "wide"}
    messages = sorted(e.message for e in _validator(study_schema()).iter_errors(spec))
    assert any("'repeat' was unexpected" in m for m in messages) and any("'wide' is not one of" in m for m in messages)
    profile = load_yaml_file(PROFILES[0])
    profile["node"] = {**profile["node"], "gpu_count": 8} if isinstance(profile.get("node"), dict) else {"gpu_count": 8}
    found = [s.message for e in _validator(profile_schema()).iter_errors(profile) for s in [e, *e.context]]
    assert any("'gpu_count' was unexpected" in m for m in found), found


@pytest.mark.parametrize("argv, want", [(["profiles", "schema"], "recsys-submit cluster profile"),
                                        (["study", "schema"], "recsys-submit study spec")])
def test_the_commands_print_the_schemas(capsys, argv, want):
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["title"] == want
