"""NVIDIA's published results as package data (jobs.study.analysis.published) and `recsys-submit study
reference`: the data loads and holds the published numbers, points match the right rows, and
the generated specs pass `study run --dry-run` on every built-in DGX profile. No scheduler:
the fast tier."""

import copy

import pytest
import yaml

from jobs import cli
from jobs.errors import RequestError
from jobs.profiles import load_profile
from jobs.study.analysis import published

pytestmark = pytest.mark.fast


def test_data_loads_and_holds_known_values():
    data = published.load()
    assert set(data.platforms) == {"dgxa100", "dgxa100-40gb", "dgx1", "dgx2"}
    assert {t["id"] for t in data.tables} == {"dlrm_tf2", "wide_deep_tf2", "wide_deep_tf2_earlier", "wide_deep_tf1",
                                              "ncf_tf1", "dlrm_tf2_2302"}
    assert all(t["source"].startswith("NVIDIA DeepLearningExamples, ") for t in data.tables)
    [dlrm] = [r for r in published.rows("dlrm", "dgxa100") if r.gpus == 1]
    # the 23.02 table is matched; the 2022 one (2.68e6 / 4.47e6) is kept, not matched
    assert (dlrm.batch_per_gpu, dlrm.throughput, dlrm.model_size) == (65536, {"tf32": 2.84e6, "amp": 4.55e6}, "small")
    assert dlrm.table == "dlrm_tf2_2302" and "container TF2 23.02-py3" in dlrm.source
    [old] = [r for r in published.rows("dlrm", "dgxa100", matched_only=False) if r.gpus == 1 and not r.match]
    assert old.table == "dlrm_tf2" and old.throughput["tf32"] == 2.68e6 and "commit 3b05bf18" in old.version
    [wd] = [r for r in published.rows("wide_deep", "dgx1") if r.gpus == 8 and r.xla]
    assert wd.throughput == {"fp32": 1925045.33, "amp": 3536706.63} and wd.table == "wide_deep_tf2"
    ncf = [r for r in published.rows("ncf", "dgx1") if r.gpus == 4][0]
    assert ncf.throughput == {"fp32": 30.31e6, "amp": 39.47e6}          # published in millions
    assert published.rows("dlrm", "dgx2")[-1].amp_speedup() == pytest.approx(10.5 / 6.43)
    # every table names its version (commit, date or container), and its rows' source carries it
    assert all(r.version and r.version in r.source for r in data.rows)
    # every row gives the platform's full precision and amp, as positive numbers
    for row in data.rows:
        assert set(row.throughput) == {data.full_precision(row.platform), "amp"}
        assert all(v > 0 for v in row.throughput.values())
    # the earlier and the TF1 Wide & Deep tables are kept but never matched
    assert len(published.rows("wide_deep", matched_only=False)) == 20 and len(published.rows("wide_deep")) == 8


def test_a_malformed_table_is_refused_naming_the_row(tmp_path):
    raw = yaml.safe_load(open(published.DATA_FILE))
    bad = copy.deepcopy(raw)
    bad["tables"][0]["throughput"][1]["tf32"] = "9.39e6"           # YAML 1.1 reads this as a string
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(published.PublishedDataError, match=r"tables\.dlrm_tf2\.throughput\[1\]\.tf32"):
        published.load(str(path))
    bad = copy.deepcopy(raw)
    bad["tables"][1]["throughput"][0]["fp32"] = 1.0                 # an A100 row has no fp32
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(published.PublishedDataError, match="a dgxa100 row gives"):
        published.load(str(path))


def test_platforms_of_the_builtin_profiles_and_one_that_extends_dgxa100(tmp_path):
    mine = tmp_path / "mysite.yaml"
    mine.write_text("extends: dgxa100\npartition: gpu\nmax_nodes: 4\n")
    assert [published.platform_of(load_profile(p)) for p in ("dgxa100", "dgxa100-pod", "dgx1", "dgx2", str(mine))] \
        == ["dgxa100", "dgxa100", "dgx1", "dgx2", "dgxa100"]
    assert published.platform_of(load_profile("ci")) is None


def test_matching_rule():
    # precision from the flags: tf32 on A100 unless --amp or --no-tf32; fp32 on V100
    assert published.settings_of([], {"amp": True, "xla": True}, "dgxa100") == ("amp", True)
    assert published.settings_of(["--xla"], {"precision": "tf32"}, "dgxa100") == ("tf32", True)
    assert published.settings_of([], {"precision": "fp32"}, "dgxa100") == ("fp32", False)
    assert published.settings_of([], {}, "dgx1") == ("fp32", False)
    row = published.match("wide_deep", "dgxa100", 8, 16384, "amp", True)
    assert row.throughput["amp"] == 5742941.1
    assert published.match("wide_deep", "dgxa100", 8, 16384, "amp", False).throughput["amp"] == 3759027.04
    assert published.match("wide_deep", "dgxa100", 8, 8192, "amp", True) is None        # other batch
    assert published.match("wide_deep", "dgxa100", 8, 16384, "fp32", True) is None      # no fp32 on A100
    # DLRM states no XLA: either matches; two 8-GPU A100 rows fit, the first (large) wins
    assert published.match("dlrm", "dgxa100", 8, 8192, "tf32", True).model_size == "large"
    # NCF's TF1 table: dgx1 matches, dgxa100-40gb rows match no built-in profile's platform
    assert published.match("ncf", "dgx1", 4, 262144, "amp", False).throughput["amp"] == 39.47e6
    assert published.match("ncf", "dgxa100", 1, 1048576, "tf32", False) is None
    assert published.match("dlrm", None, 1, 65536, "tf32", False) is None


@pytest.mark.parametrize("model,profile,sizes", [
    ("wide_deep", "dgxa100", [(1, 131072), (8, 16384)]),
    ("wide_deep", "dgx1", [(1, 131072), (8, 16384)]),
    ("dlrm", "dgxa100", [(1, 65536), (8, 8192)]),
    ("dlrm", "dgx1", [(1, 65536), (8, 8192)]),
    ("dlrm", "dgx2", [(1, 65536), (8, 8192), (16, 4096)]),
    ("ncf", "dgx1", [(1, 1048576), (4, 262144), (8, 131072)]),
])
def test_reference_spec_passes_a_dry_run(tmp_path, capsys, model, profile, sizes):
    out = tmp_path / "ref.yaml"
    assert cli.main(["study", "reference", "--model", model, "--profile", profile, "--out", str(out)]) == 0
    spec = yaml.safe_load(out.read_text())
    assert spec["model"] == model and spec["scaling"] == "strong" and spec["repeats"] == 3
    assert published.is_placeholder(spec["data_path"])
    full = "tf32" if profile == "dgxa100" else "fp32"
    assert spec["variants"]["precision"] == [full, "amp"]
    assert ("xla" in spec["variants"]) == (model == "wide_deep")
    assert spec["steps"] == (1000 if model == "dlrm" else spec["steps"]) and "steps" in spec["description"]
    capsys.readouterr()
    assert cli.main(["study", "run", str(out), "--profile", profile, "--dry-run"]) == 0
    text, err = capsys.readouterr()
    lines = [line for line in text.splitlines() if line.startswith("  g")]
    variants = 2 * (2 if model == "wide_deep" else 1)
    assert len(lines) == len(sizes) * variants * 3
    assert f"{len(lines)} matching an NVIDIA published row" in text            # every point has its row
    for gpus, per_gpu in sizes:
        assert any(line.split()[0].startswith(f"g{gpus}-") and f"batch/GPU {per_gpu} " in line for line in lines)
    assert "placeholder" in err
    # the spec as written is refused by `study run` until its data path is set, with one line
    assert cli.main(["study", "run", str(out), "--profile", profile]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "data_path" in err and "placeholder" in err


def test_reference_to_stdout_and_dry_run_on_a_profile_that_extends_dgxa100(tmp_path, capsys):
    mine = tmp_path / "mysite.yaml"
    mine.write_text("extends: dgxa100\npartition: gpu\n")
    assert cli.main(["study", "reference", "--model", "wide_deep", "--profile", str(mine)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# Generated by `recsys-submit study reference")
    spec = tmp_path / "wd.yaml"
    spec.write_text(text.replace(yaml.safe_load(text)["data_path"], "/data/outbrain"))
    assert cli.main(["study", "run", str(spec), "--profile", str(mine), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "24 matching" in out and "published 5,742,941 (wide_deep_tf2)" in out and err == ""


def test_list(capsys):
    assert cli.main(["study", "reference", "--list"]) == 0
    text = capsys.readouterr().out
    head, *rows = text.split("\n\n")[0].splitlines()
    assert head.split()[:3] == ["model", "platform", "profiles"]
    assert len(rows) == len(published.rows())
    # every built-in profile of that node type (the pod profiles reuse it)
    assert any(r.split()[:3] == ["wide_deep", "dgxa100", "dgxa100,dgxa100-pod,dgxa100-pod-spark"] for r in rows)
    assert "source wide_deep_tf2: NVIDIA DeepLearningExamples" in text
    assert cli.main(["study", "reference", "--list", "--model", "ncf"]) == 0
    rows = capsys.readouterr().out.split("\n\n")[0].splitlines()[1:]
    assert len(rows) == 6 and all(r.startswith("ncf ") for r in rows)
    assert any("dgxa100-40gb  (none)" in r for r in rows)          # no built-in profile
    assert cli.main(["study", "reference", "--list", "--profile", "dgx2"]) == 0
    rows = capsys.readouterr().out.split("\n\n")[0].splitlines()[1:]
    assert [r.split()[4] for r in rows] == ["1", "8", "16"]


@pytest.mark.parametrize("argv,needle", [
    (["--model", "wide_deep", "--profile", "dgx2"], "NVIDIA published no wide_deep throughput for dgx2"),
    (["--model", "ncf", "--profile", "dgxa100"], "ncf is published for dgx1, dgxa100-40gb"),
    (["--model", "dlrm", "--profile", "ci"], "not a platform NVIDIA published for"),
    (["--model", "dlrm", "--profile", "no-such-profile"], "unknown profile"),
    (["--model", "nosuch", "--profile", "dgx1"], "invalid choice"),
    (["--model", "dlrm"], "--model/--profile: give both"),
    (["--list", "--profile", "ci"], "not a platform NVIDIA published for"),
])
def test_refusals_are_one_line_exit_2(capsys, argv, needle):
    try:
        code = cli.main(["study", "reference"] + argv)
    except SystemExit as exc:           # argparse's own refusal (exit 2, one line)
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_api_refuses_nothing_published_with_a_request_error():
    with pytest.raises(RequestError, match="NVIDIA published no wide_deep"):
        published.reference_spec("wide_deep", load_profile("dgx2"))
