"""Every shell example of README.md and docs/*.md runs as printed (docs/testing.md,
"Executable documentation").

One test per markdown file: its ```bash blocks run in order, as bash scripts with
``set -eo pipefail``, in one fresh working directory shared by the file's blocks (a
walk-through such as generate -> run -> train builds on the block before). That
directory holds links to the repository's top-level entries (``slurm/``, ``docs/``,
``.venv`` ...), so the paths the docs use resolve, while everything an example writes
stays in it. ``.venv/bin`` is first on PATH; the environment is the session test
cluster's (SLURM_CONF, the MPI settings), and ``RECSYS_PROFILE_PATH`` holds
``mysite.yaml``, the site profile docs/profiles.md shows, so ``--profile mysite``
resolves. From a ``<!-- docs-test: twin NAME -->`` line on, the file's blocks run with the
built-in container profile NAME resolved to its test twin (tests/docs/twins.py: same container
paths, host sides under tmp, the test cluster's nodes, tests/pyxis_standin as pyxis), the
built-in's host paths in the block rewritten to the twin's, and HOME in tmp (what an
example writes under ~ stays in the test). A failure names the file, the block's line
and the failing command, with the tail of its output.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.docs.examples import Block, extract, markdown_files, script
from tests.docs.twins import make_twin, rewrite_host_paths

REPO = Path(__file__).resolve().parents[2]
BLOCK_TIMEOUT_S = 600     # a hang guard: the slowest block (Criteo via Spark) takes a minute or two on an idle 2-core box
TAIL_CHARS = 3000
FILES = [p for p in markdown_files(REPO) if any(b.mode != "skip" for b in extract(p))]


def _site_profile() -> str:
    """The `mysite` example of docs/profiles.md (the YAML block that names mysite.yaml)."""
    text = (REPO / "docs" / "profiles.md").read_text()
    m = re.search(r"```yaml\n(# [^\n]*mysite\.yaml[^\n]*\n.*?)```", text, re.S)
    assert m, "docs/profiles.md lost its mysite.yaml example (the docs test's --profile mysite)"
    return m.group(1)


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in (".git", "recsys-runs") and not entry.name.startswith(".pytest"):
            (work / entry.name).symlink_to(entry)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "mysite.yaml").write_text(_site_profile())
    (work / "mysite.yaml").write_text(_site_profile())   # `profiles validate mysite.yaml`
    return work


def _env(cluster_env: dict, tmp_path: Path) -> dict:
    env = dict(cluster_env)
    env["PATH"] = os.pathsep.join([str(REPO / ".venv" / "bin"), env.get("PATH", "")])
    env["RECSYS_PROFILE_PATH"] = str(tmp_path / "profiles")
    env["PYTHONPATH"] = str(REPO)
    env["RECSYS_POLL_MAX"] = "2"    # `status --watch` of a walk-through polls at most every 2 s (default 60)
    env.pop("RECSYS_RUN_ROOT", None)
    return env


def _twinned(block: Block, env: dict, tmp_path: Path):
    """(env, host map) for a block: the twins of its `twin` line(s) last on the profile path (they win)."""
    if not block.twins:
        return env, {}
    if os.geteuid() != 0:
        pytest.skip(f"{block.where}: the pyxis stand-in binds mounts in a mount namespace (root only)")
    twins_dir, root, home = tmp_path / "twins", tmp_path / "pod", tmp_path / "home"
    host_map = {}
    for name in block.twins:
        twin = make_twin(name, root)
        twins_dir.mkdir(exist_ok=True)
        (twins_dir / f"{name}.yaml").write_text(twin.text)
        for host in twin.host_map.values():
            if host not in twin.files:
                Path(host).mkdir(parents=True, exist_ok=True)
        for file in twin.files:
            Path(file).parent.mkdir(parents=True, exist_ok=True)
            Path(file).touch()
        host_map.update(twin.host_map)
    home.mkdir(exist_ok=True)
    env = dict(env, HOME=str(home),
               RECSYS_PROFILE_PATH=os.pathsep.join([env["RECSYS_PROFILE_PATH"], str(twins_dir)]))
    return env, host_map


def _readable(text: str) -> str:
    """Output tail without Spark's console progress bars."""
    text = re.sub(r"\[Stage \d+:[^\]]*\]", "", text.replace("\r", "\n"))
    return "\n".join(line for line in text.splitlines() if line.strip())


def _run_block(block: Block, work: Path, env: dict, host_map: dict | None = None) -> str | None:
    """Run one block; None when it passed, else the failure message."""
    body = rewrite_host_paths(script(block), host_map or {})
    where = f"{block.path.relative_to(REPO)}:{block.line}"
    # ERR trap: which command failed, as a line of the markdown file
    prologue = (f"set -eo pipefail\ntrap 'echo \"docs-test: {block.path.name}:$(({block.line} + LINENO - 2)):"
                f" failed (exit $?): $BASH_COMMAND\" >&2' ERR\n")
    try:
        res = subprocess.run(["bash", "-c", prologue + body], cwd=work, env=env, text=True,
                             capture_output=True, timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return (f"{where}: timed out after {BLOCK_TIMEOUT_S} s\n{body}\n--- output tail ---\n"
                f"{_readable(out + err)[-TAIL_CHARS:]}")
    if res.returncode != 0:
        return (f"{where}: exit {res.returncode} ({block.mode})\n{body}\n--- stdout tail ---\n"
                f"{_readable(res.stdout)[-TAIL_CHARS // 2:]}\n--- stderr tail ---\n{_readable(res.stderr)[-TAIL_CHARS:]}")
    return None


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("md", FILES, ids=[str(p.relative_to(REPO)) for p in FILES])
def test_examples_run_as_printed(md, slurm_cluster, tmp_path):
    work = _workdir(tmp_path)
    env = _env(slurm_cluster.env, tmp_path)
    timings = []
    for block in extract(md):
        if block.mode == "skip":
            continue
        start = time.monotonic()
        block_env, host_map = _twinned(block, env, tmp_path)
        failure = _run_block(block, work, block_env, host_map)
        timings.append(f"{block.path.relative_to(REPO)}:{block.line} {block.mode} {time.monotonic() - start:.1f}s")
        print(timings[-1])
        assert failure is None, failure
