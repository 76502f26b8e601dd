"""The hardware sampler (slurm/hwsample.py) and its medians in a study report (jobs.runs.hwsamples,
jobs.study.analysis.report): the nvidia-smi query parsed from A100 and H100 outputs in its CSV layout
(tests/jobs/recorded/nvidia-smi/README.md says how they were made), /proc readers on fixed text,
one real sample of this machine, and the report's section and warnings on a run directory of
samples. The sampler beside a real job: tests/jobs/test_hang_slurm.py."""

import json
from pathlib import Path

import pytest

from jobs.runs import hwsamples
from jobs.study.analysis.report_table import _hardware_lines
from slurm import hwsample

pytestmark = pytest.mark.fast

RECORDED = Path(__file__).resolve().parent / "recorded" / "nvidia-smi"


def test_a100_query_parsed_with_units_stripped():
    rows = hwsample.parse_gpu_csv((RECORDED / "dgxa100-80gb-training.csv").read_text())
    assert len(rows) == 8
    assert rows[0] == {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "util_pct": 98, "mem_used_mib": 31245,
                       "mem_total_mib": 81920, "power_w": 312.47, "sm_mhz": 1410, "base_mhz": 1095}
    assert [r["util_pct"] for r in rows][4] == 31 and rows[6]["sm_mhz"] == 1005


def test_h100_query_parsed_and_missing_values_are_none():
    rows = hwsample.parse_gpu_csv((RECORDED / "dgxh100-training.csv").read_text())
    assert [r["index"] for r in rows] == list(range(8)) and rows[3]["power_w"] == 689.93
    assert {r["name"] for r in rows} == {"NVIDIA H100 80GB HBM3"}
    idle = hwsample.parse_gpu_csv((RECORDED / "dgxa100-idle-not-supported.csv").read_text())
    assert idle[1]["util_pct"] is None and idle[1]["power_w"] is None and idle[1]["base_mhz"] is None
    assert idle[0]["sm_mhz"] == 210


def test_the_query_names_every_field_the_parser_reads():
    header = (RECORDED / "dgxh100-training.csv").read_text().splitlines()[0]
    assert len(hwsample.GPU_QUERY) == len(header.split(","))
    assert hwsample.gpu_command() == ["nvidia-smi", "--query-gpu=" + ",".join(hwsample.GPU_QUERY), "--format=csv"]
    for bad in ("No devices were found", "index, name\n0, x, y"):
        with pytest.raises(ValueError):
            hwsample.parse_gpu_csv(bad)


def test_proc_readers_on_fixed_text(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 5 0 5 40 0 0 0 0 0 0\ncpu1 5 0 5 40 0 0 0 0 0 0\n")
    before = hwsample.read_cpu_times(str(stat))
    stat.write_text("cpu  0 0 0 0\ncpu0 55 0 5 90 0 0 0 0 0 0\ncpu1 5 0 5 140 0 0 0 0 0 0\n")
    assert hwsample.cpu_busy(before, hwsample.read_cpu_times(str(stat)), [0, 1]) == {0: 50.0, 1: 0.0}
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       4194304 kB\nMemFree:   1 kB\nMemAvailable:   1048576 kB\n")
    assert hwsample.read_memory(str(meminfo)) == (3.0, 4.0)
    dev = tmp_path / "dev"
    dev.write_text("Inter-| Receive\n face |bytes\n    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n"
                   "  eth0: 1000 1 0 0 0 0 0 0 2000 1 0 0 0 0 0 0\n")
    assert hwsample.read_network(str(tmp_path / "no-ib"), str(dev)) == ("net", {"eth0": (1000, 2000)})
    port = tmp_path / "ib" / "mlx5_0" / "ports" / "1" / "counters"
    port.mkdir(parents=True)
    (port / "port_rcv_data").write_text("250\n")
    (port / "port_xmit_data").write_text("500\n")
    assert hwsample.read_network(str(tmp_path / "ib"), str(dev)) == ("infiniband", {"mlx5_0/1": (1000, 2000)})
    assert hwsample.rank_cpus({"RECSYS_BIND_CPUS": "0-1;2,3"}) == [[0, 1], [2, 3]]


def test_one_real_sample_of_this_machine_written_whole(tmp_path):
    sampler = hwsample.Sampler(str(tmp_path), interval=0.01, host="here", gpus=False)
    sampler.run(once=True)
    doc = json.loads((tmp_path / "here.json").read_text())
    (sample,) = doc["samples"]
    assert doc["version"] == hwsample.VERSION and 0 <= sample["cpu_busy_pct"] <= 100
    assert 0 < sample["mem_used_gib"] < sample["mem_total_gib"]
    assert [p.name for p in tmp_path.iterdir()] == ["here.json"]        # no temporary left


def _run_dir(tmp_path, samples_by_node):
    logs = tmp_path / "logs"
    (logs / "main-5.hw").mkdir(parents=True)
    (logs / "main-5.engine.jsonl").write_text(
        json.dumps({"type": "startup", "phase": "first_step", "time": 100.0}) + "\n"
        + json.dumps({"type": "summary", "time": 110.0}) + "\n")
    for host, samples in samples_by_node.items():
        (logs / "main-5.hw" / f"{host}.json").write_text(json.dumps({"version": 1, "host": host, "samples": samples}))
    return str(tmp_path)


def test_medians_over_the_timed_steps_and_the_gpu_warnings(tmp_path):
    a100 = hwsample.parse_gpu_csv((RECORDED / "dgxa100-80gb-training.csv").read_text())
    outside = {"t": 95.0, "cpu_busy_pct": 1.0, "mem_used_gib": 1.0, "gpus": [dict(g, util_pct=0) for g in a100]}
    inside = [{"t": 100.0 + k, "cpu_busy_pct": 60.0 + k, "rank_cpu_busy_pct": [70.0, 50.0 + k], "mem_used_gib": 20.0,
               "net_source": "infiniband", "net_rx_bytes_per_s": 3e9, "net_tx_bytes_per_s": 2e9, "gpus": a100}
              for k in range(5)]
    run_dir = _run_dir(tmp_path, {"dgx01": [outside] + inside, "dgx02": inside})
    hw = hwsamples.medians(run_dir)
    assert hw["nodes"] == 2 and hw["samples"] == 10                 # the sample before the first step left out
    assert hw["cpu_busy_pct"] == 62.0 and hw["rank_cpu_busy_pct_min"] == 52.0 and hw["net_rx_mb_s"] == 3000.0
    assert len(hw["gpus"]) == 16 and hw["gpus"][4]["util_pct"] == 31
    lines = hwsamples.warnings("g16-n2x8-r0", hw)
    assert "g16-n2x8-r0: GPU 4 on dgx01 was 31 % busy (median of the timed steps; below 50 %)" in lines
    assert any("GPU 6 on dgx02 ran its SM clock at 1005 MHz, below its base 1095 MHz" in line for line in lines)
    assert len(lines) == 4                                           # GPUs 4 and 6 of each node
    assert len(hwsamples.warnings("p", hw, min_utilization=20, base_mhz=1000)) == 0
    text = "\n".join(_hardware_lines({"hardware": {"g16-n2x8-r0": hw}, "hardware_warnings": lines}))
    assert "| `g16-n2x8-r0` | 2 | 10 | 62 | 52 | 20.0 | 3,000.0 / 2,000.0 | 31-98 |" in text
    assert "1,005-1,410 (1,095) |" in text


def test_no_samples_no_medians_and_an_unknown_version_is_skipped(tmp_path):
    run_dir = _run_dir(tmp_path, {})
    assert hwsamples.medians(run_dir) is None
    Path(run_dir, "logs", "main-5.hw", "n1.json").write_text(json.dumps({"version": 99, "samples": [{"t": 101}]}))
    Path(run_dir, "logs", "main-5.hw", "n2.json").write_text('{"version": 1, "samples": [')   # torn
    assert hwsamples.medians(run_dir) is None
    assert _hardware_lines({"hardware": {}}) == []
