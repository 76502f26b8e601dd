"""The typed training configuration: one field per flag, checked once, errors as EngineError (no SystemExit)."""
import dataclasses

import pytest

from recsys.configuration.train_config import TrainConfig
from recsys.errors import EngineError
from recsys.train import build_parser

pytestmark = pytest.mark.fast


def test_every_flag_has_a_typed_field():
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    dests = {a.dest for a in build_parser()._actions if a.dest != "help"}
    assert dests <= fields, f"add fields to recsys/configuration/train_config.py:TrainConfig for {sorted(dests - fields)}"


def test_from_args_fills_model_defaults_and_keeps_flag_names():
    cfg = TrainConfig.from_args(build_parser().parse_args(["--model", "ncf", "--synthetic", "--lr", "0.1"]))
    assert isinstance(cfg, TrainConfig)
    assert cfg.lr == 0.1 and cfg.topk == 10 and cfg.valid_negative == 100 and cfg.world_size == 1
    assert cfg.as_dict()["model"] == "ncf"


@pytest.mark.parametrize("argv,flag", [(["--model", "dlrm", "--synthetic", "--epochs", "0"], "--epochs"),
                                       (["--model", "ncf", "--synthetic", "--dropout", "1.5"], "--dropout")])
def test_bad_values_raise_engine_error_naming_the_flag(argv, flag):
    with pytest.raises(EngineError, match=flag) as info:
        TrainConfig.from_args(build_parser().parse_args(argv))
    assert info.value.exit_code == 2


def test_unknown_namespace_field_is_refused():
    ns = build_parser().parse_args(["--model", "dlrm", "--synthetic"])
    ns.not_a_flag = 1
    with pytest.raises(TypeError, match="not_a_flag"):
        TrainConfig.from_args(ns)
