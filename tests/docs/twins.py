"""Test-only twins of the built-in container profiles, for the docs test (docs/testing.md,
"Executable documentation").

The test cluster has no pyxis, no /lustre and no DGX nodes, yet docs/dgx.md's walk-through must
run as printed on it. A twin of a built-in container profile (``dgxa100-pod``) is a profile file of
the same name, put on ``RECSYS_PROFILE_PATH`` (which the loader searches after the built-ins, so it
wins), holding:

* the built-in's ``container:`` as it is (image name, what the image provides, the container side
  of every mount), except that each mount's host side lies under a test directory, and so does an
  image file (a squashfs path: the submission checks it is there; the stand-in never reads it);
* the test cluster's nodes, partition, scheduler and settings (``extends: ci``);
* a ``setup:`` line that puts ``tests/pyxis_standin`` first on the job's PATH: its ``srun`` runs a
  container step as a plain step in a private mount namespace, the mounts bound at their container
  paths, so ``/data`` and ``/checkpoints`` mean inside the job what they mean on the pod.

Profiles that extend the built-in by name (``dgxa100-pod-spark``, a user's copy) resolve to the
twin. The login node sees host paths: a twin-scoped block has the built-in's host sides
(``/lustre/datasets``) rewritten to the twin's (:func:`rewrite_host_paths`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import yaml

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "pyxis_standin"
BASE = "ci"     # the test cluster's profile


@dataclass
class Twin:
    name: str
    text: str                                               # the twin's YAML
    host_map: Dict[str, str] = field(default_factory=dict)  # built-in host side -> twin host side
    files: List[str] = field(default_factory=list)          # files the twin names (its image file)


def _host_under(root: Path, host: str) -> str:
    return str(root / host.lstrip("/"))


def make_twin(name: str, root: Path, builtin_dir: Path = REPO / "cluster_profiles") -> Twin:
    """The twin of built-in profile `name`, its host sides under `root` (not created here)."""
    path = builtin_dir / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    container = data.get("container") if isinstance(data, dict) else None
    if container and not container.get("mounts") and isinstance(data.get("extends"), str):
        return _derived_twin(name, data, container, root)
    if not container or not container.get("mounts"):
        raise ValueError(f"{path}: a twin needs a profile with container.mounts")
    host_map: Dict[str, str] = {}
    mounts = []
    for entry in container["mounts"]:
        host, rest = entry.split(":", 1)
        host_map[host] = _host_under(root, host)
        mounts.append(f"{host_map[host]}:{rest}")
    files = []
    image = str(container.get("image", ""))
    if image.startswith("/"):
        host_map[image] = _host_under(root, image)
        files.append(host_map[image])
    twin = {
        "description": f"test twin of {name} (tests/docs/twins.py): its container on the {BASE} cluster",
        "extends": BASE,
        "container": {k: v for k, v in container.items() if k not in ("mounts", "image")}
                     | {"image": host_map.get(image, image), "mounts": mounts},
        "setup": [f'export PATH="{STANDIN}:$PATH"   # pyxis stand-in: container steps as plain steps'],
    }
    if data.get("scratch"):
        host_map[data["scratch"]] = twin["scratch"] = _host_under(root, data["scratch"])
    return Twin(name, yaml.safe_dump(twin, sort_keys=False), host_map, files)


def _derived_twin(name: str, data: dict, container: dict, root: Path) -> Twin:
    """The twin of a built-in that extends another by name and names its own image file
    (``dgxa100-pod-spark``): the built-in as it is, its image file under ``root``; its mounts and
    nodes come from what it extends (the twin of that one, when the block twins it too)."""
    image = str(container.get("image", ""))
    if not image.startswith("/"):
        raise ValueError(f"{name}: a derived twin is only needed for an image file")
    moved = _host_under(root, image)
    twin = dict(data, description=f"test twin of {name} (tests/docs/twins.py)",
                container=dict(container, image=moved))
    return Twin(name, yaml.safe_dump(twin, sort_keys=False), {image: moved}, [moved])


def rewrite_host_paths(text: str, host_map: Dict[str, str]) -> str:
    """`text` with each built-in host side (a whole path component run: `/lustre/datasets`,
    `/lustre/datasets/x`, never `/lustre/datasets2`) replaced by the twin's."""
    for host in sorted(host_map, key=len, reverse=True):
        text = re.sub(r"(?<![\w./-])" + re.escape(host.rstrip("/")) + r"(?=/|[^\w.-]|$)",
                      lambda _m, new=host_map[host]: new, text)
    return text
