"""Where profiles come from: the search path, `extends`, node references, reading the YAML.

Profiles are looked up by
name on a search path (built-ins in ``cluster_profiles/``, then
``~/.config/recsys-submit/profiles/``, then every directory of ``RECSYS_PROFILE_PATH``;
later ones override earlier ones) or loaded from a file; ``extends`` merges a parent
profile and ``node: <name>`` reuses another profile's node.  The merged mapping is checked
by jobs.profiles.schema; every problem, reading the file included, is a one-line
:class:`ProfileError` ``<file>: <key.path>: <problem>``.  Only pyyaml and the standard
library are used (login nodes).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List

import yaml

from .profile import Container, Profile, ProfileRef
from .schema import Checker, ProfileError, check_profile, typename
from .topology import NodeType, detect_local_node

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it

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


def _find(name: str, referrer: str = "--profile", key: str = "") -> Path:
    for ref in list_profiles():
        if ref.name == name:
            return Path(ref.path)
    known = ", ".join(r.name for r in list_profiles()) or "none"
    raise ProfileError(referrer, key, f"unknown profile {name!r} (known: {known}; "
                                      f"add directories with {PATH_ENV})")


def _read_yaml(path: Path) -> Dict[str, Any]:
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ProfileError(path, "file", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        raise ProfileError(path, f"line {line}",
                           f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    try:
        data = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ProfileError(path, where, f"malformed YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError(path, "top level", f"must be a mapping, got {typename(data)}")
    return data


def _merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    """Mappings merge key by key; anything else in ``over`` replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _resolve_raw(path: Path, stack: tuple) -> Dict[str, Any]:
    """Read a profile file and apply ``extends`` (a profile name or path)."""
    if str(path) in stack:
        chain = [Path(p).stem for p in stack + (str(path),)]
        raise ProfileError(path, "extends", "cycle: " + " -> ".join(chain))
    data = _read_yaml(path)
    parent = data.get("extends")
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ProfileError(path, "extends", f"must be a profile name, got {typename(parent)}")
    parent_path = Path(parent).expanduser() if _is_path(parent) else _find(parent, str(path), "extends")
    base = _resolve_raw(parent_path, stack + (str(path),))
    base = {k: v for k, v in base.items() if k not in ("name", "extends")}
    child = {k: v for k, v in data.items() if k != "extends"}
    if isinstance(child.get("node"), (dict, str)):  # a new node replaces the inherited one
        base.pop("node", None)
    return _merge(base, child)


def _load_path(path: Path, stack: tuple = (), by_name: bool = False) -> Profile:
    data = _resolve_raw(path, stack)
    ck = Checker(str(path))
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise ck.fail("name", "must be a non-empty string")
    if by_name and name != path.stem:
        raise ck.fail("name", f"{name!r} differs from the file name {path.name!r} "
                              "(profiles on the search path are named by their file)")

    def resolve_node(ref: str) -> NodeType:
        if ref == "detect":
            return detect_local_node()
        ref_path = Path(ref).expanduser() if _is_path(ref) else _find(ref, str(path), "node")
        if str(ref_path) in stack or ref_path == path:
            raise ck.fail("node", f"node reference {ref!r} refers back to this profile")
        return _load_path(ref_path, stack + (str(path),), by_name=not _is_path(ref)).node

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
        if not path.is_file():
            raise ProfileError(path, "file", "no such profile file")
        return _load_path(path)
    return _load_path(_find(name_or_path), by_name=True)
