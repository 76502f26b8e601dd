"""Container paths and host paths: one translation through a profile's mounts.

With a container profile, the paths a user gives a job (``--data-path``, ``--checkpoint-dir``,
``--input``, ``--output``, ``--rapids-jar``, ...) are the paths the job sees inside the container.
The login node (submission checks, the lead-time warning) and the batch host (the requeue guard,
which lists the checkpoint directory outside the container) see the host's files, so every place
on the host that looks at such a path asks this module for the host path. Besides the profile's
``container.mounts`` a job mounts the checkout, the run directory and the profile's ``scratch``
at their host paths (jobs.backends.slurm.script); those are the ``identity`` paths here.
A path no mount covers is not visible in the container: the callers refuse it.
Standard library only (login nodes).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, List, Optional


@dataclass(frozen=True)
class Mount:
    """One bind mount: host path, container path, read-only or not."""

    host: str
    container: str
    read_only: bool = False

    @classmethod
    def parse(cls, text: str) -> "Mount":
        """A pyxis ``SRC:DST[:FLAGS]`` entry (FLAGS joined by ``+``; ``ro`` makes it read-only)."""
        parts = text.split(":")
        flags = parts[2].split("+") if len(parts) > 2 else []
        return cls(_norm(parts[0]), _norm(parts[1]), "ro" in flags)

    def covers(self, path: str, side: str = "container") -> bool:
        root = self.container if side == "container" else self.host
        return _under(_norm(path), root)


def _norm(path: str) -> str:
    return os.path.normpath(path) if path else path


def _under(path: str, root: str) -> bool:
    return path == root or root == "/" or path.startswith(root.rstrip("/") + "/")


def checkout_dir() -> str:
    """This checkout (the parent of slurm/), which every container job mounts at its host path."""
    import slurm

    return os.path.dirname(os.path.dirname(os.path.abspath(slurm.__file__)))


def profile_mounts(profile, identity: Iterable[str] = ()) -> List[Mount]:
    """The mounts a job of `profile` has: its container.mounts, then the checkout, the profile's
    scratch and `identity` (the run dir) at their host paths. Empty without a container."""
    if profile.container is None:
        return []
    out = [Mount.parse(m) for m in profile.container.mounts]
    for path in [checkout_dir(), getattr(profile, "scratch", None), *identity]:
        if path:
            out.append(Mount(_norm(path), _norm(path), False))
    return out


def _deepest(mounts: List[Mount], path: str, side: str) -> Optional[Mount]:
    """The mount that decides `path` (on `side`): the one with the longest covering root, as a
    nested mount hides what lies under it in the outer one."""
    found = [m for m in mounts if m.covers(path, side)]
    if not found:
        return None
    return max(found, key=lambda m: len(m.container if side == "container" else m.host))


def mount_of(profile, path: str, identity: Iterable[str] = ()) -> Optional[Mount]:
    """The mount a container path lies under, or None (no container: None as well)."""
    return _deepest(profile_mounts(profile, identity), os.path.abspath(path), "container")


def to_host(profile, path: str, identity: Iterable[str] = ()) -> Optional[str]:
    """The host path of a path a job of `profile` is given: unchanged without a container; the
    mounted host path with one; None when no mount covers it (the container does not see it)."""
    if profile.container is None:
        return path
    path = os.path.abspath(path)
    mount = mount_of(profile, path, identity)
    if mount is None:
        return None
    rest = os.path.relpath(path, mount.container)
    return mount.host if rest == "." else os.path.join(mount.host, rest)


def to_container(profile, host_path: str, identity: Iterable[str] = ()) -> Optional[str]:
    """The container path of a host path (the inverse of to_host), or None when not mounted."""
    if profile.container is None:
        return host_path
    host_path = os.path.abspath(host_path)
    mount = _deepest(profile_mounts(profile, identity), host_path, "host")
    if mount is None:
        return None
    rest = os.path.relpath(host_path, mount.host)
    return mount.container if rest == "." else os.path.join(mount.container, rest)


def describe(profile) -> str:
    """The profile's mounts for an error line: `/host -> /container (ro), ...`."""
    mounts = [Mount.parse(m) for m in (profile.container.mounts if profile.container else [])]
    return ", ".join(f"{m.host} -> {m.container}{' (ro)' if m.read_only else ''}" for m in mounts) or "none"
