"""Where profiles come from: the search path, `extends`, node references, reading the YAML.

Profiles are looked up by
name on a search path (built-ins in ``cluster_profiles/``, then
``~/.config/recsys-submit/profiles/``, then every directory of ``RECSYS_PROFILE_PATH``;
later ones override earlier ones) or loaded from a file; ``extends`` merges a parent
profile and ``node: <name>`` reuses another profile's node (a relative path in either is read
from the profile file's directory).  Each file is read by the toolkit's one YAML reader
(slurm.common.yamlfile: size, alias, depth and node limits) and refused if a value holds a control
character; the merged mapping is checked by jobs.profiles.schema; every problem, reading the
file included, is a one-line :class:`ProfileError` ``<file>: <key.path>: <problem>``.  Only
pyyaml and the standard library are used (login nodes).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List

from slurm.common.yamlfile import YamlFileError, load_yaml_file

from .profile import Container, Profile, ProfileRef
from .schema import Checker, ProfileError, check_profile, control_problems, has_control, typename
from .topology import NodeType, detect_local_node

__all__ = ["list_profiles", "load_profile", "search_path", "builtin_dir"]

USER_PROFILE_DIR = Path("~/.config/recsys-submit/profiles")
PATH_ENV = "RECSYS_PROFILE_PATH"


# ------------------------------------------------------------------ search path


def builtin_dir() -> Path:
    """The ``cluster_profiles/`` directory shipped with the package."""
    import cluster_profiles
    return Path(cluster_profiles.__file__).resolve().parent


def search_path() -> List[tuple]:
    """``[(dir, source), ...]`` in increasing priority."""
    dirs = [(builtin_dir(), "builtin"), (USER_PROFILE_DIR.expanduser(), "user")]
    for entry in os.environ.get(PATH_ENV, "").split(os.pathsep):
        if entry.strip():
            dirs.append((Path(entry).expanduser(), "env"))
    return dirs


def list_profiles() -> List[ProfileRef]:
    """Every profile on the search path, by name (later directories override)."""
    found: Dict[str, ProfileRef] = {}
    for directory, source in search_path():
        if not directory.is_dir():
            continue
        for f in sorted(directory.iterdir()):
            if f.suffix in (".yaml", ".yml") and f.is_file():
                found[f.stem] = ProfileRef(f.stem, str(f), source)
    return sorted(found.values(), key=lambda r: r.name)


def _is_path(name_or_path: str) -> bool:
    return "/" in name_or_path or name_or_path.endswith((".yaml", ".yml"))


def _ref_path(ref: str, referrer: Path) -> Path:
    """A profile path named inside a profile file (``extends``, ``node``): relative to that file's
    directory, as a reader of the file expects, never to the working directory."""
    path = Path(ref).expanduser()
    return path if path.is_absolute() else referrer.parent / path


MAX_EXTENDS = 32    # profiles in one chain of extends / node references


def _find(name: str, referrer: str = "--profile", key: str = "") -> Path:
    for ref in list_profiles():
        if ref.name == name:
            return Path(ref.path)
    known = ", ".join(r.name for r in list_profiles()) or "none"
    raise ProfileError(referrer, key, f"unknown profile {name!r} (known: {known}; "
                                      f"add directories with {PATH_ENV})")


def _read_yaml(path: Path) -> Dict[str, Any]:
    """One profile file's mapping, read within the toolkit's YAML limits (slurm.common.yamlfile) and
    refused if a value that reaches a job script holds a control character."""
    try:
        data = load_yaml_file(path)
    except YamlFileError as exc:
        raise ProfileError(path, exc.where, exc.problem) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError(path, "top level", f"must be a mapping, got {typename(data)}")
    problems = control_problems(path, data)
    if problems:
        problems[0].problems = [str(p) for p in problems]
        raise problems[0]
    return data


# mappings an extending profile replaces whole: one measurement each, whose parts (a figure and
# its measured range; a table of rank counts and its exchange_source) come from one run
WHOLE_KEYS = ("exchange",)
WHOLE_IF_HOLDING = "busbw_gb_per_s"         # a fabric's measured entry (jobs.profiles.fabric)


def _merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    """Mappings merge key by key, but for one measurement (WHOLE_KEYS, a measured fabric entry),
    which ``over`` replaces whole like anything else."""
    out = dict(base)
    for k, v in over.items():
        whole = k in WHOLE_KEYS or (isinstance(v, dict) and WHOLE_IF_HOLDING in v)
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) and not whole else v
    return out


def _resolve_raw(path: Path, stack: tuple) -> Dict[str, Any]:
    """Read a profile file and apply ``extends`` (a profile name or path); ``stack`` holds the
    resolved paths of the files that led here."""
    if has_control(str(path)):
        raise ProfileError(path, "file", "the file's path has a control character (it would reach the "
                                         "job script); rename the file")
    if _key(path) in stack:
        chain = [Path(p).stem for p in stack + (_key(path),)]
        raise ProfileError(path, "extends", "cycle: " + " -> ".join(chain))
    if len(stack) >= MAX_EXTENDS:
        raise ProfileError(path, "extends", f"more than {MAX_EXTENDS} profiles in one chain")
    data = _read_yaml(path)
    parent = data.get("extends")
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ProfileError(path, "extends", f"must be a profile name, got {typename(parent)}")
    parent_path = _ref_path(parent, path) if _is_path(parent) else _find(parent, str(path), "extends")
    base = _resolve_raw(parent_path, stack + (_key(path),))
    base = {k: v for k, v in base.items() if k not in ("name", "extends")}
    child = {k: v for k, v in data.items() if k != "extends"}
    if isinstance(child.get("node"), (dict, str)):  # a new node replaces the inherited one
        base.pop("node", None)
    return _merge(base, child)


def _key(path: Path) -> str:
    """A file's identity in a chain, however it was named (relative, absolute, through a link)."""
    return os.path.realpath(path)


def _load_path(path: Path, stack: tuple = (), by_name: bool = False) -> Profile:
    data = _resolve_raw(path, stack)
    ck = Checker(str(path))
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name:
        ck.fail("name", "must be a non-empty string")
    if by_name and name != path.stem:
        ck.fail("name", f"{name!r} differs from the file name {path.name!r} "
                        "(profiles on the search path are named by their file)")

    def resolve_node(ref: str) -> NodeType:
        if ref == "detect":
            return detect_local_node()
        ref_path = _ref_path(ref, path) if _is_path(ref) else _find(ref, str(path), "node")
        if _key(ref_path) in stack or _key(ref_path) == _key(path):
            ck.fail("node", f"node reference {ref!r} refers back to this profile")
        return _load_path(ref_path, stack + (_key(path),), by_name=not _is_path(ref)).node

    fields = check_profile(ck, data, name, resolve_node)
    container = fields.pop("container")
    return Profile(name=name, path=str(path), container=Container(**container) if container else None,
                   **fields)


def load_profile(name_or_path: str) -> Profile:
    """Load and validate a profile by name (search path) or by file path."""
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ProfileError("profile", "name", "empty profile name")
    if _is_path(name_or_path):
        path = Path(name_or_path).expanduser()
        if not path.exists():
            raise ProfileError(path, "file", "no such profile file")
        return _load_path(path)
    return _load_path(_find(name_or_path), by_name=True)
