"""A profile's ``fabric:`` section from measurements: the fabric benchmark's files (python -m
recsys.collectives; repeats of a layout give a median and a range) and nccl-tests outputs added as
measured figures (`recsys-submit profiles fabric`)."""
from __future__ import annotations

import copy
from typing import Any, Dict, Iterable

import yaml

from ..errors import RequestError
from . import fabric as fabric_mod
from .profile import Profile


def _sharing_of(prof: Profile) -> Dict[str, Any]:
    """The profile's fabric.core_sharing (cores, slowdown, source) the measured exchange joins."""
    sharing = {k: v for k, v in ((prof.fabric.core_sharing if prof.fabric else None) or {}).items() if k not in ("exchange", "exchange_source")}
    if not sharing:
        raise RequestError(f"--core-sharing: profile {prof.name} has no fabric.core_sharing (cores, slowdown: "
                           "python bench/bench_core_sharing.py) for the measured exchange to join")
    return sharing


def fabric_section(prof: Profile, files: Iterable[str] = (), nccl_tests: Iterable[str] = (),
                   core_sharing: bool = False) -> Dict[str, Any]:
    """The ``fabric:`` mapping of `prof` (jobs.api.fabric_section: what it returns; RequestError,
    one line, naming the file or value at fault)."""
    if core_sharing and not files:
        raise RequestError("--core-sharing: give the fabric files of the layouts measured (repeats of each)")
    if not files and prof.fabric is None:
        raise RequestError(f"--profile: {prof.name} has no fabric: section; give the fabric files of "
                           "`recsys-submit benchmark --payload collectives` first")
    try:
        if files:
            records = []
            for path in files:
                with open(path) as f:
                    records.append(yaml.safe_load(f))
            section = fabric_mod.fabric_from_measurements(records, max(1, prof.node.gpus),
                                                          core_sharing=_sharing_of(prof) if core_sharing else None)
        else:
            section = copy.deepcopy(prof.as_dict()["fabric"])
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise RequestError(f"fabric: {str(exc).splitlines()[0]}") from None
    for item in nccl_tests:
        where, _, path = str(item).partition("=")
        level, _, coll = where.partition(":")
        if level not in fabric_mod.LEVELS or coll not in fabric_mod.COLLECTIVES or not path:
            raise RequestError(f"--nccl-tests: {item!r} is not LEVEL:COLLECTIVE=FILE (levels "
                               f"{', '.join(fabric_mod.LEVELS)}; collectives {', '.join(fabric_mod.COLLECTIVES)})")
        try:
            with open(path) as f:
                figures = fabric_mod.parse_nccl_tests(f.read())
        except (OSError, ValueError) as exc:
            raise RequestError(f"--nccl-tests {path}: {str(exc).splitlines()[0]}") from None
        measured = section.setdefault("measured", {"source": "nccl-tests"})
        measured.setdefault(level, {})[coll] = figures
        if "nccl-tests" not in measured["source"]:
            measured["source"] += "; nccl-tests"
    return section
