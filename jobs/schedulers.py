"""The scheduler registry: which backend runs a profile's `scheduler`, and what it can do.

The one place the core reaches the implementations (jobs.backends.slurm, jobs.backends.local):
by name, imported only when a backend is really needed (like submitit's core/plugins.py). It sits
below profiles and planning, outside jobs.backends: the profile schema takes its `scheduler`
choices and node limits from CAPABILITIES and request validation its GPU-less rank rule, and
neither imports any backend (profiles are data).
"""

import importlib
from dataclasses import dataclass
from typing import Optional

from jobs.errors import RequestError


@dataclass(frozen=True)
class Capabilities:
    """How a backend differs where code outside it needs to know."""

    module: str                      # where the Backend subclass lives
    cls: str
    foreground: bool = False         # submit runs each job to its end by default (no queue to leave it in)
    gpuless_ranks: bool = False      # on a GPU-less node, --gpus-per-node counts CPU ranks
    max_nodes: Optional[int] = None  # most nodes one job can span (None: as many as the profile has)
    allocations: bool = False        # runs a study's points as steps of one allocation (Backend.allocation)


CAPABILITIES = {
    "slurm": Capabilities("jobs.backends.slurm.backend", "SlurmBackend", allocations=True),
    "local": Capabilities("jobs.backends.local.backend", "LocalBackend", foreground=True, gpuless_ranks=True,
                          max_nodes=1),
}
SCHEDULERS = tuple(CAPABILITIES)


def capabilities(scheduler):
    """The Capabilities of a scheduler name; RequestError naming the choices for another."""
    try:
        return CAPABILITIES[scheduler]
    except KeyError:
        raise RequestError(f"scheduler: unknown scheduler {scheduler!r} "
                           f"(choose from {', '.join(SCHEDULERS)})") from None


def backend_class(scheduler):
    """The Backend subclass of a scheduler name (imported on first use)."""
    entry = capabilities(scheduler)
    return getattr(importlib.import_module(entry.module), entry.cls)


def backend_for(profile):
    """A backend instance for a loaded Profile."""
    return backend_class(profile.scheduler)(profile)
