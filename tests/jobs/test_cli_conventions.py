"""The CLI's conventions (issue 48): a dry run and a render check the engine's arguments with the
one check a submission makes (items 6), `--version`, `--json` on the commands that read state
and shell completion generated from the parser (item 7)."""
import contextlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from jobs.cli import build_parser, main
from jobs.completion import script
from jobs.profiles import load_profile

from submit_helpers import REPO

pytestmark = pytest.mark.fast


def _cli(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


BAD_ENGINE_ARGS = [(["--lr", "abc"], "argument --lr: invalid float value: 'abc'"),
                   (["--profile-steps", "30-20"], "expected 1 <= START <= END, got '30-20'"),
                   (["--batch-size", "-5"], "--batch-size must be >= 1, got -5"),
                   (["--lr", "-1"], "--lr must be > 0, got -1.0")]


@pytest.mark.parametrize("how", ["render", "dry-run"])
@pytest.mark.parametrize("engine, words", BAD_ENGINE_ARGS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_render_and_dry_run_refuse_what_a_submission_refuses(capsys, tmp_path, how, engine, words):
    own = (["render", "train"] if how == "render" else ["train", "--dry-run"])
    code, out, err = _cli(capsys, *own, "--profile", "local", "--model", "dlrm", "--runs-dir", str(tmp_path),
                          "--", "--synthetic", *engine)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and words in err, err
    assert not os.listdir(tmp_path)


def test_a_dry_run_refuses_engine_arguments_that_name_no_data_a_render_does_not(capsys, tmp_path):
    """A submission refuses a job without data; its dry run says so. A render is a template (a
    script may be for another machine, its data added there): it renders."""
    argv = ["--profile", "local", "--model", "dlrm", "--runs-dir", str(tmp_path), "--", "--lr", "0.1"]
    code, out, err = _cli(capsys, "train", "--dry-run", *argv)
    assert code == 2 and "give --data-path DIR, --feature-spec FILE or --synthetic" in err, err
    code, out, err = _cli(capsys, "render", "train", *argv)
    assert code == 0 and "-m recsys.train" in out, err


@pytest.mark.parametrize("engine, words", [(["--lr", "abc"], "invalid float value: 'abc'"),
                                           (["--lr", "-1"], "--lr must be > 0, got -1.0")])
def test_a_study_dry_run_makes_the_same_check(capsys, tmp_path, engine, words):
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"model": "dlrm", "gpus": [1], "engine_args": ["--synthetic", *engine]}))
    code, out, err = _cli(capsys, "study", "run", str(spec), "--profile", "local", "--dry-run")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "point g1-n1x1-r0: the engine rejects its flags: " in err and words in err, err


def test_version(capsys):
    code, out, err = _cli(capsys, "--version")
    assert code == 0 and out.startswith("recsys-submit ") and len(out.splitlines()) == 1, (out, err)


def test_profiles_list_and_show_as_json(capsys, isolated_profile_search_path):
    code, out, _ = _cli(capsys, "profiles", "list", "--json")
    rows = json.loads(out)
    assert code == 0 and {r["name"] for r in rows} >= {"local", "ci", "dgxa100"}
    assert all(set(r) == {"name", "source", "path", "description", "error"} for r in rows)
    assert all(r["error"] is None and r["description"] for r in rows)
    code, out, _ = _cli(capsys, "profiles", "show", "ci", "--json")
    assert code == 0 and json.loads(out) == json.loads(json.dumps(load_profile("ci").as_dict(), default=str))


def _complete(text, *words):
    """COMPREPLY of the bash completion for the command line `words` (the last one being typed)."""
    code = (f"{text}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
            "_recsys_submit_complete; printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    res = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return [w for w in res.stdout.split("\n") if w]


@pytest.mark.skipif(not shutil.which("bash"), reason="needs bash")
def test_bash_completion_from_the_parser(capsys):
    code, text, _ = _cli(capsys, "completion", "bash")
    assert code == 0 and "complete -o default -F _recsys_submit_complete recsys-submit" in text
    assert _complete(text, "recsys-submit", "tr") == ["train"]
    assert _complete(text, "recsys-submit", "study", "st") == ["status"]
    assert _complete(text, "recsys-submit", "profiles", "show", "ci", "--j") == ["--json"]
    assert _complete(text, "recsys-submit", "render", "train", "--then") == ["--then-evaluate"]
    assert _complete(text, "recsys-submit", "study", "reference", "--model", "") == ["dlrm", "wide_deep", "ncf"]
    assert _complete(text, "recsys-submit", "train", "--", "--sy") == []      # the engine's: not ours
    assert "--version" in _complete(text, "recsys-submit", "--v")


def test_zsh_completion_is_the_bash_function_through_bashcompinit(capsys):
    code, text, _ = _cli(capsys, "completion", "zsh")
    assert code == 0 and text.startswith("#compdef recsys-submit\n") and "bashcompinit" in text
    assert script(build_parser(), "recsys-submit", "bash") in text
    if shutil.which("zsh"):
        res = subprocess.run(["zsh", "-fc", text + "\nprint ok"], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_help_does_not_load_the_api():
    """`recsys-submit --help` stays a login-node instant: neither jobs.api nor YAML is imported."""
    code = ("import sys\nfrom jobs.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m in ('jobs.api', 'yaml', 'jobs.completion')), file=sys.stderr)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.stderr.strip() == "[]", res.stderr


def _missing_study(root):
    """A study of 2 points none of which was submitted (what `study run` records first)."""
    import time

    from jobs.study.running.record import PointRecord, StudyRecord

    study_dir = os.path.join(str(root), "study-missing")
    os.makedirs(os.path.join(study_dir, "points"))
    points = [PointRecord(id=f"g1-n1x1-r{r}", nodes=1, gpus_per_node=1, gpus=1, batch_per_gpu=512,
                          global_batch=512, variant={}, variant_label="default", repeat=r) for r in range(2)]
    StudyRecord(name="missing", study_dir=study_dir, profile="ci", profile_path=None, scheduler="slurm",
                spec={"name": "missing", "model": "ncf", "scaling": "strong"}, created=time.time(),
                points=points).save()
    return study_dir


class _Terminal:
    """stdout as a terminal: what `study status --watch` prints there."""

    def __init__(self):
        self.text = ""

    def write(self, text):
        self.text += text

    def flush(self):
        pass

    def isatty(self):
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_the_watch_progress_line_clears_to_the_end_on_a_terminal_and_is_plain_lines_elsewhere(
        tmp_path, monkeypatch, capsys, tty):
    """Item 8: a shorter line rewritten over a longer one left its tail ("...0:02:51sed 0:02:00")."""
    study = _missing_study(tmp_path)
    for name, value in (("RECSYS_STUDY_START_GRACE_S", "0.4"), ("RECSYS_POLL_FIRST", "0.05"),
                        ("RECSYS_POLL_MAX", "0.1")):
        monkeypatch.setenv(name, value)
    terminal = _Terminal()
    # redirect_stdout, not monkeypatch: capsys ends before monkeypatch, which would then put
    # capsys's closed stream back as sys.stdout for the rest of the session
    with contextlib.redirect_stdout(terminal) if tty else contextlib.nullcontext():
        code = main(["study", "status", study, "--watch"])
    out = terminal.text if tty else capsys.readouterr().out
    assert code == 1
    if tty:
        live, _, table = out.partition("\n")          # the live line, ended once the watch ends
        updates = live.split("\r")
        assert updates[0] == "" and len(updates) >= 3, repr(out)
        assert all(u.endswith("\x1b[K") and "elapsed" in u for u in updates[1:]), repr(out)
        assert "g1-n1x1-r0" in table and "\r" not in table
    else:
        lines = out.splitlines()
        assert len(lines) >= 2 and "\r" not in out and "\x1b" not in out, repr(out)


def _cli_process(*argv):
    """recsys-submit in its own process: a local job's backend redirects and forks this process's
    stdout and stderr, which must not happen inside pytest's captured streams."""
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", *map(str, argv)], cwd=REPO, text=True,
                          capture_output=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_the_json_of_a_run_has_the_documented_keys(tmp_path):
    """One local smoke job (~5 s); `status --json` and the log index `logs --json` keep the keys
    docs/submitting.md ("Conventions") documents."""
    runs = str(tmp_path / "runs")
    code, out, err = _cli_process("benchmark", "--profile", "local", "--model", "hello", "--runs-dir", runs)
    assert code == 0, err
    code, out, _ = _cli_process("status", "--json", "--runs-dir", runs)
    status = json.loads(out)
    assert code == 0 and set(status) == {"run_dir", "jobs", "done", "calls", "source", "submission"}
    assert set(status["jobs"][0]) == {"key", "job_id", "name", "state", "tasks", "summary", "reason"}
    code, out, _ = _cli_process("logs", "--json", "--runs-dir", runs)
    index = json.loads(out)
    assert code == 0 and index["run_dir"] == status["run_dir"] and index["files"]
    assert all(os.path.getsize(f["path"]) == f["bytes"] and f["path"].endswith(".log") for f in index["files"])


def test_study_report_json_is_the_written_scaling_json(tmp_path, capsys):
    study = _missing_study(tmp_path)
    code, out, err = _cli(capsys, "study", "report", study, "--json", "--no-plot")
    report = json.loads(out)
    with open(os.path.join(study, "report", "scaling.json")) as handle:
        assert report == json.load(handle)
    assert code == 1 and "rows" in report and "wrote json " in err     # missing points: not a finished table
