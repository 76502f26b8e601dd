"""Fixtures of the submission-layer tests: the CLI and the API against the local Slurm cluster."""

import os

import pytest

from submit_helpers import Cli


@pytest.fixture
def isolated_profile_search_path(tmp_path, monkeypatch):
    """No user profiles of the machine running the tests leak in (the profile tests)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RECSYS_PROFILE_PATH", raising=False)


@pytest.fixture
def cli(slurm_cluster, tmp_path):
    return Cli(slurm_cluster.env, tmp_path / "runs")


@pytest.fixture
def slurm_env(slurm_cluster, monkeypatch):
    """In-process API calls talk to the test cluster."""
    from jobs.backends.slurm import commands as slurmcli

    for key, value in slurm_cluster.env.items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    slurmcli.reset_cache()
    yield slurm_cluster
    slurmcli.reset_cache()
