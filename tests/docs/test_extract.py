"""tests/docs/examples.py: which blocks the docs test runs and how (pure functions, no cluster)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.examples import dry_run_line, extract, markdown_files, script

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]

DOC = """# t

```bash
echo plain
```

<!-- docs-test: skip: needs GPUs -->
```bash
nvidia-smi
```

   <!-- docs-test: dry-run -->
   ```bash
   recsys-submit train --profile mysite --model dlrm --nodes 8 -- --data-path /d --amp   # submit
   recsys-submit status --watch ; recsys-submit logs --follow --rank 0
   python -m preproc criteo generate --out /tmp/r --rows 10 &&
   python -m preproc criteo run --input /tmp/r \\
       --output /tmp/o --threshold 3
   .venv/bin/pytest -q tests/jobs/test_cli.py
   ```

```python
print("not bash")
```

<!-- docs-test: setup-done -->
```bash
python3 -m venv .venv && .venv/bin/pip install '.[train]' && .venv/bin/recsys-submit train --profile local -- --synthetic
```
"""


def test_blocks_and_directives():
    blocks = extract(Path("x.md"), DOC)
    assert [(b.line, b.mode) for b in blocks] == [(3, "run"), (8, "skip"), (13, "dry-run"), (27, "setup-done")]
    assert blocks[1].reason == "needs GPUs"
    assert blocks[2].text.startswith("recsys-submit train")   # indentation of a list item removed


def test_dry_run_script():
    lines = script(extract(Path("x.md"), DOC)[2]).splitlines()
    assert lines[0] == ("recsys-submit train --profile mysite --model dlrm --nodes 8 --dry-run -- "
                        "--data-path /d --amp # submit")
    assert lines[1] == ""                                           # status/logs: nothing submitted
    assert lines[2] == "python -m preproc criteo generate --out /tmp/r --rows 10 &&"   # generate runs as is
    assert " ".join(lines[3].split()) == "python -m preproc criteo run --input /tmp/r --output /tmp/o --threshold 3 --dry-run"
    assert lines[4] == ".venv/bin/pytest -q tests/jobs/test_cli.py --collect-only -q"


def test_setup_done_script_runs_the_main_command_only():
    assert script(extract(Path("x.md"), DOC)[3]) == ".venv/bin/recsys-submit train --profile local -- --synthetic\n"


@pytest.mark.parametrize("line, expected", [
    ("recsys-submit render train --profile x", "recsys-submit render train --profile x"),
    ("recsys-submit preprocess --profile x --dataset criteo", "recsys-submit preprocess --profile x --dataset criteo --dry-run"),
    ("recsys-submit cancel RUN", None),
])
def test_dry_run_line(line, expected):
    assert dry_run_line(line) == expected


def test_skip_needs_a_reason():
    with pytest.raises(ValueError, match="x.md:2: `docs-test: skip` needs a reason"):
        extract(Path("x.md"), "<!-- docs-test: skip -->\n```bash\nls\n```\n")


def test_every_repository_example_parses():
    """Every block of README.md and docs/*.md has a known directive (or none), skips say why."""
    blocks = [b for p in markdown_files(REPO) for b in extract(p)]
    assert len(blocks) > 10
    assert all(b.mode in ("run", "skip", "dry-run", "setup-done") for b in blocks)


def test_a_failing_block_names_file_line_command_and_output_tail(tmp_path):
    from tests.docs.test_examples import _run_block
    from tests.docs.examples import Block
    block = Block(REPO / "docs" / "example.md", 12, "echo fine\nls no-such-file-here\necho never\n")
    message = _run_block(block, tmp_path, {"PATH": "/usr/bin:/bin"})
    assert message.startswith("docs/example.md:12: exit 2 (run)\n")
    assert "docs-test: example.md:14: failed (exit 2): ls no-such-file-here" in message
    assert "No such file or directory" in message and "never" not in message.split("--- stdout tail ---")[1]
