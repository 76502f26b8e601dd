"""Hostile input to the submission layer (issue 33): a control character in any profile value
that reaches the sbatch script (a newline in a `#` comment line ran as a command), a profile file
whose name holds a newline, YAML bombs in profiles and study specs, files no reader should take
(/dev/zero, a FIFO, a huge or deep file), a relative `extends:` read from another directory, and
long variant labels that made two study points one. Each is refused in one line naming the file
and the key (exit 2, nothing rendered or created), or now works."""

import copy
import dataclasses
import os
import subprocess
import sys

import pytest
import yaml

from jobs.errors import RequestError
from jobs.planning.request import JobRequest
from jobs.profiles import ProfileError, load_profile
from jobs.study.spec import KEYS as SPEC_KEYS, StudySpec, expand, load_spec, spec_from_flags
from jobs.submit import render_plan
from slurm.common.yamlfile import MAX_BYTES, MAX_DEPTH, MAX_NODES, printable
from tests.hostile_yaml import bomb_text, bomb_value, quick_error
from submit_helpers import ci_raw

pytestmark = [pytest.mark.fast, pytest.mark.timeout(120), pytest.mark.usefixtures("isolated_profile_search_path")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli(*args, cwd=REPO, env=None):
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=dict(os.environ, PYTHONPATH=REPO, **(env or {})), timeout=120)


def one_line_error(proc):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("recsys-submit: error: "), proc.stderr
    return lines[0]


# ------------------------------------------------------------- control characters in profiles

def _with_container(data, **fields):
    data["container"] = dict({"image": "nvcr.io/nvidia/tensorflow:23.12-tf2-py3", "mounts": ["/data:/data:ro"],
                              "provides": ["tensorflow"]}, **fields)


def _set(path, value):
    """A change of the ci profile that puts `value` at the dotted key `path`."""
    def change(data):
        if path.startswith("container."):
            _with_container(data, **{path.split(".", 1)[1]: value})
            return
        node = data
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return change


PAYLOAD = "x\ntouch {marker} #"     # ran as a command after the comment line that showed the name
# (the key the error names, the change): every profile value the template or script.py writes
FIELDS = [
    ("name", lambda d, p: d.update(name="site" + p)),
    ("partition", lambda d, p: d.update(partition="gpu" + p)),
    ("account", lambda d, p: d.update(account="proj42" + p)),
    ("qos", lambda d, p: d.update(qos="normal" + p)),
    ("default_time", lambda d, p: d.update(default_time="00:30:00" + p)),
    ("switches", lambda d, p: d.update(switches="1@00:10:00" + p)),
    ("sbatch_extra[0]", lambda d, p: d.update(sbatch_extra=["--network=sharp" + p])),
    ("setup[0]", lambda d, p: d.update(setup=["module load cuda/12.2" + p])),
    ("env.NCCL_DEBUG", lambda d, p: d.setdefault("env", {}).update(NCCL_DEBUG="INFO" + p)),
    ("env.", lambda d, p: d.setdefault("env", {}).update({"NCCL" + p: "1"})),     # the name itself
    ("python", lambda d, p: d.update(python="python3" + p)),
    ("mpi", lambda d, p: d.update(mpi="pmix" + p)),
    ("scheduler", lambda d, p: d.update(scheduler="slurm" + p)),
    ("extends", lambda d, p: d.update(extends="ci" + p)),
    ("node", lambda d, p: d.update(node="dgx1" + p)),
    ("container.image", lambda d, p: _set("container.image", "nvcr.io/x" + p)(d)),
    ("container.mounts[0]", lambda d, p: _set("container.mounts", ["/data:/data" + p])(d)),
    ("container.provides[0]", lambda d, p: _set("container.provides", ["spark" + p])(d)),
    ("scratch", lambda d, p: d.update(scratch="/raid/scratch" + p)),
    ("defaults.time", lambda d, p: _set("defaults.time", "00:10:00" + p)(d)),
    ("defaults.runs_dir", lambda d, p: _set("defaults.runs_dir", "/scratch/runs" + p)(d)),
    ("defaults.binding", lambda d, p: _set("defaults.binding", "off" + p)(d)),
    ("node.name", lambda d, p: d["node"].update(name="ci" + p)),
    ("node.gpu_model", lambda d, p: d["node"].update(gpu_model="A100" + p)),
    ("node.nics[0]", lambda d, p: d["node"].update(nics=["lo" + p, "lo"])),
    ("node.numa_cpus.0", lambda d, p: d["node"].update(numa_cpus={0: "0-1" + p})),
    ("node.gpu_cores[0]", lambda d, p: d["node"].update(gpu_cores=["0" + p, "1"])),
]


def _profiles(tmp_path, payload):
    """One profile file per field of FIELDS, each the ci profile with `payload` in that field."""
    files = []
    for i, (key, change) in enumerate(FIELDS):
        data = copy.deepcopy(ci_raw())
        change(data, payload)
        path = tmp_path / f"field{i}.yaml"
        path.write_text(yaml.safe_dump(data))
        files.append((key, path))
    return files


def test_a_newline_in_any_profile_field_is_refused_by_validate_and_render(tmp_path):
    """Every field in turn holds a newline and a command: load, render and `profiles validate`
    refuse it in one line naming the file and the key; no script, no marker."""
    marker = tmp_path / "PWNED"
    files = _profiles(tmp_path, PAYLOAD.format(marker=marker))
    request = JobRequest(kind="benchmark", model="hello", nodes=1)
    for key, path in files:
        with pytest.raises(ProfileError) as info:
            load_profile(str(path))
        message = str(info.value)
        assert "\n" not in message and message.startswith(f"{path}: {key}"), (key, message)
        assert "control character" in message, message
        with pytest.raises(ProfileError):
            render_plan([request], str(path), run_dir=str(tmp_path / "run"))
    proc = cli("profiles", "validate", *[str(p) for _, p in files])
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == len(files), proc.stderr
    for (key, path), line in zip(files, lines):
        assert line.startswith(f"recsys-submit: error: {path}: {key}"), (key, line)
    proc = cli("render", "benchmark", "--profile", str(files[0][1]), "--model", "hello", "--nodes", "1")
    assert f"{files[0][1]}: name: has the control character" in one_line_error(proc)
    assert proc.stdout == "" and not marker.exists()


@pytest.mark.parametrize("char", ["\n", "\r", "\t", "\x1b", "\x7f", "\x00"], ids=repr)
def test_every_control_character_is_refused(tmp_path, char):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(dict(ci_raw(), partition=f"gpu{char}x")))
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert str(info.value) == (f"{path}: partition: has the control character {char!r} (a value that "
                               "reaches the job script must be printable text on one line)")


def test_description_is_free_text_and_may_span_lines(tmp_path):
    """The one value no script shows: a folded YAML block (which ends with a newline) stays allowed."""
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(dict(ci_raw(), description="two\nlines\n")))
    assert load_profile(str(path)).description == "two\nlines\n"


def test_a_profile_file_whose_name_holds_a_newline_is_refused(tmp_path):
    """The file name became the profile's name and path in the script's comment line."""
    directory = tmp_path / "sites"
    directory.mkdir()
    path = directory / "x\ntouch PWNED\n.yaml"
    path.write_text(yaml.safe_dump(ci_raw()))
    expected = (f"{printable(path)}: file: the file's path has a control character (it would reach "
                "the job script); rename the file")
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert str(info.value) == expected
    proc = cli("render", "benchmark", "--profile", str(path), "--model", "hello", "--nodes", "1")
    assert one_line_error(proc) == f"recsys-submit: error: {expected}"
    assert proc.stdout == ""                                # no script to run
    assert one_line_error(cli("profiles", "validate", str(path))) == f"recsys-submit: error: {expected}"


def test_the_script_refuses_a_control_character_in_a_comment_line(tmp_path):
    """The last guard, for a Profile built in a program rather than loaded."""
    profile = dataclasses.replace(load_profile("ci"), name="ci\ntouch PWNED", path="/p\nrm -rf x")
    with pytest.raises(RequestError, match="has a control character"):
        render_plan([JobRequest(kind="benchmark", model="hello", nodes=1)], profile, run_dir=str(tmp_path / "r"))


# ------------------------------------------------------------- YAML bombs and unreadable files

def _spec_with(key, value):
    spec = {"model": "dlrm", "gpus": [1]}
    if key == "points":
        del spec["gpus"]
    spec[key] = value
    return spec


@pytest.mark.parametrize("key", list(SPEC_KEYS))
def test_a_yaml_bomb_in_any_study_spec_key_is_one_quick_line(tmp_path, key):
    """13 of these hung for ever (formatted with !r or str()); gpus gave a 300 MB message."""
    path = tmp_path / "spec.yaml"
    text = yaml.safe_dump(_spec_with(key, "BOMB")).replace("BOMB", bomb_text())
    path.write_text(text)
    message = quick_error(lambda: load_spec(str(path)))
    assert message.startswith(f"{path}: line ") and f"more than {MAX_NODES} nodes" in message
    # the same value built in a program is never formatted whole
    message = quick_error(lambda: StudySpec.from_dict(_spec_with(key, bomb_value()), source="api"))
    assert message.startswith(f"api: {key}"), message


def test_a_bomb_nested_in_a_study_spec_is_one_quick_line():
    for spec, key in (({"model": "dlrm", "points": [{"nodes": bomb_value()}]}, "points[0].nodes"),
                      ({"model": "dlrm", "gpus": [1], "variants": {"amp": [bomb_value()]}}, "variants.amp"),
                      ({"model": "dlrm", "gpus": [1], "variants": {"precision": [bomb_value()]}},
                       "variants.precision"),
                      ({"model": "dlrm", "gpus": [1, bomb_value()]}, "gpus"),
                      ({"model": "dlrm", "points": [bomb_value()]}, "points[0]")):
        assert quick_error(lambda: StudySpec.from_dict(spec, source="api")).startswith(f"api: {key}: ")


def test_a_study_of_too_many_points_is_refused_before_expanding():
    message = quick_error(lambda: StudySpec.from_dict({"model": "dlrm", "gpus": [1], "repeats": 10 ** 12}, "api"))
    assert message == "api: points: more than 10000 points (sizes x variant combinations x repeats)"


def test_a_study_spec_bomb_through_the_cli_creates_nothing(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("model: dlrm\ngpus: [1]\ndescription: " + bomb_text() + "\n")
    runs = tmp_path / "runs"
    line = one_line_error(cli("study", "run", str(path), "--profile", "ci", env={"RECSYS_RUNS_DIR": str(runs)}))
    assert f"{path}: line 3: more than {MAX_NODES} nodes" in line
    assert not runs.exists()


def test_a_yaml_bomb_in_a_profile_is_one_quick_line(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text(f"extends: ci\ndescription: {bomb_text()}\n")
    assert quick_error(lambda: load_profile(str(path))).startswith(f"{path}: line 2: more than {MAX_NODES} nodes")


HOSTILE_FILES = {
    "recursive alias": ("partition: &a [*a]\n", "line 2: alias *a inside its own anchor"),
    "deep nesting": ("partition: " + "[" * 100 + "]" * 100 + "\n", f"line 2: nested more than {MAX_DEPTH} levels"),
    "very deep nesting": ("partition: " + "[" * 200000 + "\n", "line 2: "),     # libyaml's own limit, or ours
    "invalid date": ("default_time: 2024-13-45\n", "yaml: a value cannot be read: month must be in 1..12"),
    "5000-digit integer": ("max_nodes: " + "9" * 5000 + "\n", "yaml: a value cannot be read: Exceeds the limit"),
}


@pytest.mark.parametrize("name", list(HOSTILE_FILES))
def test_hostile_yaml_in_a_profile_is_one_quick_line(tmp_path, name):
    text, expected = HOSTILE_FILES[name]
    path = tmp_path / "site.yaml"
    path.write_text("extends: ci\n" + text)
    message = quick_error(lambda: load_profile(str(path)))
    assert message.startswith(f"{path}: ") and expected in message, message


def _extends(tmp_path, target):
    path = tmp_path / "site.yaml"
    path.write_text(f"extends: {target}\npartition: gpu\n")
    return path


def test_extends_dev_zero_a_fifo_a_directory_or_a_huge_file_is_one_quick_line(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as handle:
        handle.truncate(MAX_BYTES + 1)      # sparse: no disk used
    cases = [("/dev/zero", "not a regular file (a character device)"),
             (str(fifo), "not a regular file (a FIFO)"),
             (str(tmp_path), "not a regular file (a directory)"),
             (str(huge), f"{MAX_BYTES + 1} bytes, more than the {MAX_BYTES} a YAML file may have")]
    for target, problem in cases:
        path = _extends(tmp_path, target)
        assert quick_error(lambda: load_profile(str(path))) == f"{target}: file: {problem}"
    proc = cli("profiles", "validate", str(_extends(tmp_path, "/dev/zero")))
    assert one_line_error(proc) == "recsys-submit: error: /dev/zero: file: not a regular file (a character device)"
    assert quick_error(lambda: load_profile("/dev/zero")) == "/dev/zero: file: not a regular file (a character device)"


def test_relative_extends_and_node_paths_are_read_from_the_profile_directory(tmp_path, monkeypatch):
    sites = tmp_path / "sites"
    (sites / "nodes").mkdir(parents=True)
    (sites / "base.yaml").write_text("extends: ci\npartition: gpu\n")
    (sites / "nodes" / "box.yaml").write_text(yaml.safe_dump(ci_raw()))
    (sites / "child.yaml").write_text("extends: ./base.yaml\naccount: proj42\nnode: nodes/box.yaml\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    profile = load_profile("../sites/child.yaml")
    assert (profile.partition, profile.account) == ("gpu", "proj42")
    assert profile.node == load_profile("ci").node
    proc = cli("profiles", "validate", str(sites / "child.yaml"), cwd=str(elsewhere))
    assert proc.returncode == 0 and proc.stdout.startswith("ok "), proc.stderr
    (sites / "loop.yaml").write_text("extends: ../sites/loop.yaml\nnode: dgx1\n")
    assert quick_error(lambda: load_profile(str(sites / "loop.yaml"))) == \
        f"{sites}/../sites/loop.yaml: extends: cycle: loop -> loop"


# ------------------------------------------------------------- study point ids

def test_long_variant_labels_that_differ_only_at_the_end_are_two_stable_points():
    """Ids were cut at 64 characters: two such variants were refused as 'appears twice'."""
    stem = "/scratch/checkpoints/" + "a-very-long-directory-name-" * 3
    values = [stem + "run-1", stem + "run-2"]

    def ids():
        spec = spec_from_flags("dlrm", "1,2", batch_size=512, variants=[f"checkpoint_dir={','.join(values)}"])
        return [p.id for p in expand(spec, load_profile("ci"))]

    first = ids()
    assert len(first) == len(set(first)) == 4
    assert first == ids()                                   # stable: the same spec, the same ids
    for pid in first:
        assert pid.startswith(("g1-n1x1-checkpoint_dir-_scratch_checkpoints_a-very-long",
                               "g2-n1x2-checkpoint_dir-_scratch_checkpoints_a-very-long")), pid
        assert len(pid.split("-", 2)[2].rsplit("-r", 1)[0]) <= 64, pid
    short = spec_from_flags("ncf", "2", batch_size=512, variants=["amp=true", "xla=true"])
    assert [p.id for p in expand(short, load_profile("ci"))] == ["g2-n1x2-amp-true_xla-true-r0"]   # unchanged
