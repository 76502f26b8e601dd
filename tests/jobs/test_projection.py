"""`recsys-submit study project` and the profiles' fabric (issue 36): the model's arithmetic on
recorded breakdowns, the engine's own placement and byte counts, the CLI's refusals, and the
validation table of docs/benchmarks.md against NVIDIA's and distributed-embeddings' published
figures. No scheduler, no TensorFlow: the fast tier (the engine's planning command is pure Python)."""

import dataclasses
import importlib.util
import json
import os

import pytest
import yaml

from jobs import cli
from jobs.errors import RequestError
from jobs.profiles import ProfileError, load_profile
from jobs.profiles.fabric import Fabric, Level, bus_factor, parse_nccl_tests
from jobs.study.analysis import projection as P

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("isolated_profile_search_path")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDED = os.path.join(ROOT, "tests", "jobs", "recorded")
STUDY = os.path.join(ROOT, "docs", "studies", "emulated-dlrm-strong")     # .yaml spec, .json its report


def recorded_report():
    with open(STUDY + ".json") as f:
        return json.load(f)


def target(fabric, gpus_per_node=8, memory=80, host_cores=None, name="t"):
    return P.Target(profile=name, gpus_per_node=gpus_per_node, gpu_memory_gb=memory, fabric=fabric,
                    host_cores=host_cores)


DGXA100 = Fabric(source="test", intra_node=Level(link="nvswitch", gb_per_s=300, latency_us=11.8),
                 inter_node=Level(link="infiniband", nics=8, nic_gb_per_s=25, latency_us=22.4))


# ------------------------------------------------------------------ the fabric in the profiles


@pytest.mark.parametrize("name,intra,nics,rate", [("dgxa100", 300, 8, 25), ("dgxa100-pod", 300, 8, 25),
                                                  ("dgx1", 150, 4, 12.5), ("dgx2", 150, 8, 12.5)])
def test_builtin_dgx_profiles_carry_nvidias_figures_with_their_source(name, intra, nics, rate):
    fabric = load_profile(name).fabric
    assert (fabric.intra_node.gb_per_s, fabric.inter_node.nics, fabric.inter_node.nic_gb_per_s) == (intra, nics, rate)
    # latencies from NCCL's tuning model: base 8.4 us + 3.4 (NVLink hop) / + 14.0 (network hop)
    assert (fabric.intra_node.latency_us, fabric.inter_node.latency_us) == (11.8, 22.4)
    assert "datasheet" in fabric.source and "tuning.cc" in fabric.source
    # a GPU's share of the node's NICs between nodes
    assert fabric.bandwidth("inter_node", "allreduce", 8) == nics * rate / 8


def test_a_profile_with_a_fabric_loads_back_from_its_as_dict(tmp_path):
    profile = load_profile("dgxa100")
    data = profile.as_dict()
    data.pop("path"), data.pop("name")
    data["fabric"]["measured"] = {"source": "nccl-tests", "intra_node": {"alltoall": {"busbw_gb_per_s": 210.0}}}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    again = load_profile(str(path))
    assert again.fabric.intra_node == profile.fabric.intra_node
    assert again.fabric.bandwidth("intra_node", "alltoall", 8) == 210.0        # the measured one overrides
    assert again.fabric.bandwidth("intra_node", "allreduce", 8) == 300.0       # the nominal one elsewhere
    assert again.as_dict()["fabric"] == data["fabric"]


LOOPBACK_BASE = {"source": "x", "intra_node": {"link": "loopback", "gb_per_s": 1, "latency_us": 5}}
CORES = {"source": "m", "cores": 2, "slowdown": {1: 1.0, 4: 2.0}}


@pytest.mark.parametrize("fabric,expected", [
    ({"intra_node": {"link": "nvswitch", "gb_per_s": 300, "latency_us": 5}}, "fabric.source: required key is missing"),
    ({"source": "x", "intra_node": {"link": "nvswitch", "gb_per_s": -1, "latency_us": 5}},
     "fabric.intra_node.gb_per_s: must be positive, got -1"),
    ({"source": "x", "intra_node": {"link": "warp", "gb_per_s": 1, "latency_us": 5}},
     "fabric.intra_node.link: must be one of nvlink, nvswitch, pcie, shared_memory, loopback, got 'warp'"),
    ({"source": "x", "intra_node": {"link": "pcie", "gb_per_s": 1, "latency_us": 5, "gbps": 3}},
     "fabric.intra_node.gbps: unknown key"),
    ({"source": "x", "intra_node": {"link": "pcie", "gb_per_s": 1, "latency_us": 5},
      "inter_node": {"link": "infiniband", "nic_gb_per_s": 25, "latency_us": 2}}, "fabric.inter_node.nics: required key"),
    ({"source": "x", "intra_node": {"link": "pcie", "gb_per_s": 1, "latency_us": 5},
      "measured": {"source": "m", "intra_node": {"allreduce": {"latency_us": 3}}}},
     "fabric.measured.intra_node.allreduce.busbw_gb_per_s: required key is missing"),
    ({"source": "x"}, "fabric.intra_node: required key is missing"),
    ({"source": "x", "intra_node": {"link": "pcie", "gb_per_s": 1, "latency_us": 5},
      "gpu": {"source": "d", "tflops": {"fp64": 9.7}, "memory_gb_per_s": 900}}, "fabric.gpu.tflops.fp64: unknown key"),
    ({"source": "x", "intra_node": {"link": "pcie", "gb_per_s": 1, "latency_us": 5},
      "gpu": {"source": "d", "tflops": {"fp32": 15.7}}}, "fabric.gpu.memory_gb_per_s: required key is missing"),
    ({"source": "x", "intra_node": {"link": "pcie", "gb_per_s": 1, "latency_us": 5},
      "core_sharing": {"source": "m", "cores": 2, "slowdown": {4: 0}}},
     "fabric.core_sharing.slowdown.4: 0 is not a positive factor"),
    # a measured range (repeats' min and max) and the exchange measured at a core sharing (issue 46)
    ({**LOOPBACK_BASE, "measured": {"source": "m", "intra_node": {"allreduce": {"busbw_gb_per_s": 1, "range": [2, 3]}}}},
     "fabric.measured.intra_node.allreduce.range: [2, 3] must be [min, max] and hold the figure 1"),
    ({**LOOPBACK_BASE, "measured": {"source": "m", "intra_node": {"allreduce": {"busbw_gb_per_s": 1, "range": [1]}}}},
     "fabric.measured.intra_node.allreduce.range: must be [min, max] of two positive numbers"),
    ({**LOOPBACK_BASE, "core_sharing": {**CORES, "exchange_source": "m", "exchange": {1: {"intra_node": {}}}}},
     "fabric.core_sharing.exchange: 1 is not a rank count"),
    ({**LOOPBACK_BASE, "core_sharing": {**CORES, "exchange_source": "m",
                                        "exchange": {4: {"inter_node": {"alltoal": {}}}}}},
     "fabric.core_sharing.exchange.4.inter_node.alltoal: unknown key"),
    ({**LOOPBACK_BASE, "core_sharing": {**CORES, "exchange": {4: {"inter_node": {"alltoall": {"busbw_gb_per_s": 1}}}}}},
     "fabric.core_sharing.exchange_source: required key is missing"),
    ({**LOOPBACK_BASE, "core_sharing": {**CORES, "exchange_source": "m", "exchange": {}}},
     "fabric.core_sharing.exchange: give the measured collectives per rank count"),
])
def test_a_bad_fabric_is_one_line_naming_the_key(tmp_path, fabric, expected):
    data = yaml.safe_load(open(os.path.join(ROOT, "cluster_profiles", "dgx1.yaml")))
    data["fabric"] = fabric
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert "\n" not in str(info.value) and expected in str(info.value)


def test_nccl_tests_output_is_read_from_recorded_runs():
    gather = parse_nccl_tests(open(os.path.join(RECORDED, "nccl-tests-all_gather_perf.txt")).read())
    assert gather == {"busbw_gb_per_s": 125.56, "latency_us": 108.8}           # the peak; the smallest size's time
    reduce = parse_nccl_tests(open(os.path.join(RECORDED, "nccl-tests-all_reduce_perf.txt")).read())
    assert reduce == {"busbw_gb_per_s": 300.51, "latency_us": 18.66}
    with pytest.raises(ValueError, match="no nccl-tests result rows"):
        parse_nccl_tests("# nThread 1 nGpus 1\n# Out of bounds values : 0 OK\n")


# ------------------------------------------------------------------ the model's arithmetic


def test_collectives_follow_the_nccl_tests_bus_factors():
    t = target(DGXA100)
    assert (bus_factor("allreduce", 8), bus_factor("alltoall", 8), bus_factor("allgather", 1)) == (1.75, 0.875, 0)
    # 1 GB allreduce on one node of 8: 2 log2(8) latencies + size x 2(n-1)/n / 300 GB/s
    assert P.collective_ms(t, "allreduce", 1e9, 8) == pytest.approx(6 * 11.8e-3 + 1e9 * 1.75 / 300e9 * 1e3)
    # on 2 nodes: the same inside, then 1/8 of it between the nodes at a GPU's NIC share (25 GB/s)
    assert P.collective_ms(t, "allreduce", 1e9, 16) == pytest.approx(
        6 * 11.8e-3 + 1e9 * 1.75 / 300e9 * 1e3 + 2 * 22.4e-3 + 1e9 / 8 * 1.0 / 25e9 * 1e3)
    # alltoall: 7/8 of the size leaves the rank over NVSwitch; on 2 nodes 8/16 crosses the NICs
    assert P.collective_ms(t, "alltoall", 1e9, 8) == pytest.approx(11.8e-3 + 1e9 * 7 / 8 / 300e9 * 1e3)
    assert P.collective_ms(t, "alltoall", 1e9, 16) == pytest.approx(22.4e-3 + 1e9 * 8 / 16 / 25e9 * 1e3)
    assert P.collective_ms(t, "allreduce", 1e9, 1) == 0.0


def test_exchange_bytes_are_the_engines_own_counters():
    """The emulated study's recorded breakdown: the bytes the engine counted per step at 2, 4 and 8
    ranks equal the projection's, from the engine's own placement of the same command line."""
    report = recorded_report()
    spec = yaml.safe_load(open(STUDY + ".yaml"))
    argv = ["--model", "dlrm", "--run-mode", "benchmark", "--synthetic", "--batch-size", "512"] + spec["engine_args"]
    layouts = P.layouts_of_argv({n: argv for n in (1, 2, 4, 8)})
    for row in report["rows"]:
        n, b = row["gpus"], row["batch_per_gpu"]
        counted = row["variants"]["default"]["breakdown"]["exchanges"]
        sent = P.alltoall_bytes(layouts[n], n, b)
        assert sum(sent) / n == counted["embedding_exchange"]["bytes"]          # the mean over ranks, exactly
        assert (P.gradient_bytes(layouts[n], b)[0] if n > 1 else 0) == counted["gradient_exchange"]["bytes"]
    assert layouts[8]["model_parallel"] and not layouts[1]["model_parallel"]


def test_calibration_stands_on_the_timed_step():
    calib, measured, variant = P.calibration_of_report(recorded_report())
    cell = recorded_report()["rows"][0]["variants"]["default"]
    k = cell["step_time_ms"] / cell["breakdown"]["mean"]["step_ms"]
    assert variant == "default" and calib.gpus == 1 and calib.batch_per_gpu == 512
    assert calib.step_ms == pytest.approx(cell["step_time_ms"])                 # not the split step
    assert calib.fixed_ms == pytest.approx(cell["breakdown"]["mean"]["phases"]["optimizer"]["ms"] * k)
    assert sorted(measured) == [1, 2, 4, 8]
    with pytest.raises(RequestError, match="--variant: 'amp' is not a variant"):
        P.calibration_of_report(recorded_report(), "amp")


def test_calibration_reads_a_version_2_breakdown():
    """A breakdown of version 2 (compute timed alone, a measured remainder, the run's timed step and
    split / timed recorded), read by the study report as the engine writes it, calibrates as version 1
    did: on the timed step, exchanges out and optimizer fixed; the remainder (here negative) stays in
    the scaled part. Version 1 cells (the recorded study) read None for the new fields."""
    from jobs.study.analysis import report as study_report
    from jobs.study import measures as study_measures

    raw = {"version": 2, "steps": 10, "method": "split step: ...", "phases": list(study_measures.BREAKDOWN_PHASES),
           "mean": {"step_ms": 20.0, "input_wait_ms": 1.0, "compute_ms": 9.0, "embedding_exchange_ms": 4.0,
                    "gradient_exchange_ms": 3.0, "optimizer_ms": 4.0, "remainder_ms": -1.0,
                    "forward_backward_ms": 12.0},
           "slowest_rank": {"rank": 1, "step_ms": 21.0, "input_wait_ms": 1.0, "compute_ms": 9.5,
                            "embedding_exchange_ms": 4.0, "gradient_exchange_ms": 3.5, "optimizer_ms": 4.0,
                            "remainder_ms": -1.0, "forward_backward_ms": 12.5},
           "bytes_per_step": {"embedding_exchange": 1000, "gradient_exchange": 500},
           "timed_step_ms": 16.0, "split_over_timed": 1.25}
    report = recorded_report()
    assert report["rows"][0]["variants"]["default"]["breakdown"].get("split_over_timed") is None
    cell = report["rows"][0]["variants"]["default"]
    cell["step_time_ms"], cell["breakdown"] = 16.0, study_measures.read_breakdown("p-r0", raw)
    assert cell["breakdown"]["timed_step_ms"] == 16.0 and cell["breakdown"]["split_over_timed"] == 1.25
    assert cell["breakdown"]["mean"]["phases"]["remainder"]["ms"] == -1.0
    calib, _, _ = P.calibration_of_report(report)
    k = 16.0 / 20.0                                     # timed / split step
    assert calib.fixed_ms == pytest.approx(4.0 * k)
    assert calib.scaled_ms == pytest.approx(16.0 - (4.0 + 3.0) * k - 4.0 * k)
    assert calib.step_ms == pytest.approx(16.0 - 7.0 * k)   # the timed step less its exchanges, not the split one


def layout(n, dense=1000, tables=(), slices=(), rank_bytes=None, sparse_as_dense=False):
    return {"dense_params": dense, "sparse_as_dense": sparse_as_dense, "tables": [list(t) for t in tables],
            "slices": [list(s) for s in slices], "rank_bytes": rank_bytes or [0] * n}


def test_band_phases_memory_and_the_dominant_phase():
    calib = P.Calibration(gpus=1, batch_per_gpu=1024, scaled_ms=8.0, fixed_ms=2.0)
    # one model-parallel table per rank on 2 ranks, 16 wide, 1 id each
    two = layout(2, tables=[["g", "a", 100, 16, 1, 4, True, 1], ["g", "b", 100, 16, 1, 4, True, 1]],
                 slices=[[0, 0, 0, 16], [1, 1, 0, 16]], rank_bytes=[90e9, 10e9])
    p = P.project_point(two, calib, target(DGXA100), 2, 512)
    # compute: the batch-proportional part halves, the fixed part stays
    assert p.phases_ms["compute"] == pytest.approx(4.0 + 2.0)
    # rank 0 sends 512 ids of table b (4 B), table a's vectors for rank 1's 512 rows and b's gradients
    assert p.embedding_bytes_slowest == 512 * 4 + 512 * 16 * 4 + 512 * 16 * 4
    assert p.step_ms_overlap == max(p.phases_ms["compute"], p.phases_ms["embedding_exchange"]
                                    + p.phases_ms["gradient_exchange"])
    assert p.step_ms_overlap <= p.step_ms_serial and p.throughput_low <= p.throughput_high
    assert p.dominant == "compute"
    assert p.memory_gb_per_rank == 90 and p.fits is False                      # the slowest rank's, not the mean
    one = P.project_point(layout(1, rank_bytes=[1e9]), calib, target(DGXA100), 1, 1024)
    assert one.efficiency_low == one.efficiency_high == pytest.approx(1.0) and one.fits is True


def test_replicated_tables_are_allgathered_unless_sparse_as_dense():
    tables = [["g", "u", 1000, 8, 2, 4, False, 1]]
    assert P.gradient_bytes(layout(4, dense=10, tables=tables), 256) == (10 * 4 + 8, 256 * 2 * (8 * 4 + 4))
    assert P.gradient_bytes(layout(4, dense=10, tables=tables, sparse_as_dense=True), 256) == \
        (10 * 4 + 8 + 1000 * 8 * 4, 0)


def test_ranks_sharing_cores_slow_each_other():
    """The emulated cluster: every rank on one host's 2 cores; 4 ranks run 2x slower each than 1 or 2."""
    calib = P.Calibration(gpus=1, batch_per_gpu=512, scaled_ms=4.0)
    shared = target(DGXA100, gpus_per_node=2, host_cores=2)
    at = {n: P.project_point(layout(n), calib, shared, n, 512 // n).phases_ms["compute"] for n in (1, 2, 4, 8)}
    assert at == pytest.approx({1: 4.0, 2: 2.0, 4: 2.0, 8: 2.0})
    alone = P.project_point(layout(8), calib, target(DGXA100), 8, 64).phases_ms["compute"]
    assert alone == pytest.approx(0.5)


def test_measured_core_sharing_applies_only_above_the_cores():
    """ci's fabric.core_sharing: the measured slowdown of k ranks on the host's cores, 1 up to
    the cores, linear between the measured k, in proportion to k beyond the largest."""
    import dataclasses
    sharing = {"source": "measured: test", "cores": 2, "slowdown": {1: 1.0, 2: 1.3, 4: 6.0, 8: 14.0}}
    fab = dataclasses.replace(DGXA100, core_sharing=sharing)
    assert [fab.sharing_slowdown(k, 2) for k in (1, 2, 3, 4, 6, 8, 16)] == pytest.approx(
        [1.0, 1.0, 3.65, 6.0, 10.0, 14.0, 28.0])
    calib = P.Calibration(gpus=1, batch_per_gpu=512, scaled_ms=4.0)
    shared = target(fab, gpus_per_node=2, host_cores=2)
    at = {n: P.project_point(layout(n), calib, shared, n, 512 // n).phases_ms["compute"] for n in (1, 2, 4, 8)}
    assert at == pytest.approx({1: 4.0, 2: 2.0, 4: 6.0, 8: 7.0})
    record = P.project({4: layout(4)}, calib, shared, "strong", 512, "dlrm")
    assert record["fabric"]["core_sharing"] == "measured: test" and "measured: test" in P.markdown(record)
    ci = load_profile("ci").fabric.core_sharing          # the emulated cluster's, measured
    assert ci["cores"] == 2 and ci["source"].startswith("measured: bench/bench_core_sharing.py")


def test_a_measured_compute_curve_replaces_the_proportional_scaling(tmp_path):
    """Compute vs batch per GPU from one GPU measured at several batches: log-log between them,
    their affine fit outside, the calibration's level (the curve's shape)."""
    pts = [(64, 2.0), (256, 4.0), (512, 6.0)]
    assert P.curve_ms(pts, 128) == pytest.approx(2.0 * 2 ** 0.5)          # halfway in log-log
    assert P.curve_ms(pts, 256) == pytest.approx(4.0)
    fixed, per = P.affine_fit(pts)
    assert P.curve_ms(pts, 1024) == pytest.approx(fixed + per * 1024) and fixed > 0
    assert P.affine_fit([(1, 5.0), (2, 3.0)]) == (4.0, 0.0)             # falling: flat at the mean
    assert P.affine_fit([(10, 1.0), (20, 3.0)]) == pytest.approx((0.0, 70 / 500))    # through the origin
    calib = P.Calibration(gpus=1, batch_per_gpu=512, scaled_ms=9.0, curve=tuple(pts))
    assert calib.compute_ms(256) == pytest.approx(9.0 * 4.0 / 6.0)       # not 4.5: the curve's shape
    assert P.Calibration(gpus=1, batch_per_gpu=512, scaled_ms=9.0).compute_ms(256) == pytest.approx(4.5)
    # a curve file (what bench/bench_compute_curve.py prints), on a spec without another calibration
    path = tmp_path / "curve.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "source": "t", "points": [
        {"batch_per_gpu": b, "step_ms": t} for b, t in pts]}))
    record = P.run(STUDY + ".yaml", load_profile("dgxa100"), [2], compute_curve=str(path))
    by = {p["gpus"]: p["phases_ms"]["compute"] for p in record["points"]}
    # the dense part follows the curve's shape, the embedding part (the arithmetic split's share)
    # the slowest rank's embedding work at 2 ranks over 1
    c = record["calibration"]
    emb, ratio = c["embedding_share"] * c["scaled_ms"], record["points"][1]["embedding_work_ratio"]
    assert 0 < c["embedding_share"] < 1 and ratio > 0.5
    assert by == pytest.approx({1: 6.0, 2: (6.0 - emb) * 4.0 / 6.0 + emb * ratio})
    assert "Compute vs batch per GPU: measured compute curve" in P.markdown(record)


@pytest.mark.parametrize("text,expected", [
    ("version: 1\npoints: [{batch_per_gpu: 64, step_ms: 2}]\n", "two batch sizes or more (got 1)"),
    ("version: 1\npoints: [{batch_per_gpu: 64, step_ms: -2}]\n", "points[0]: give batch_per_gpu"),
    ("points: []\n", "not a compute curve (version: 1"),
])
def test_a_bad_compute_curve_is_one_line_naming_the_file(tmp_path, text, expected):
    path = tmp_path / "curve.yaml"
    path.write_text(text)
    with pytest.raises(RequestError) as info:
        P.compute_curve([str(path)])
    assert "\n" not in str(info.value) and expected in str(info.value) and "--compute-curve" in str(info.value)


# ------------------------------------------------------------------ the command


def run_cli(capsys, *argv):
    code = cli.main(["study", "project", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_study_project_from_a_spec_prints_and_writes_the_band(capsys, tmp_path):
    code, out, _ = run_cli(capsys, STUDY + ".yaml", "--profile", "dgxa100-pod", "--gpus", "16,64,512",
                           "--step-ms", "6", "--out", str(tmp_path), "--no-plot")
    assert code == 0
    assert "| 512 | 64 | 1 |" in out and "gradient_exchange" in out     # 64 nodes: the exchange dominates
    record = json.load(open(tmp_path / "projection.json"))
    assert [p["gpus"] for p in record["points"]] == [1, 16, 64, 512]
    assert open(tmp_path / "projection.csv").readline().startswith("gpus,nodes,")
    # the compute split is stated, from the model's arithmetic on the profile's GPU rates
    assert "Compute split (dense with the batch per GPU" in out and "312 TFLOPS (amp)" not in out
    assert "156 TFLOPS (tf32)" in out and record["calibration"]["embedding_work"] > 0
    code, out, _ = run_cli(capsys, STUDY + ".yaml", "--profile", "dgxa100", "--gpus", "8", "--step-ms", "6", "--json")
    assert code == 0 and json.loads(out)["profile"] == "dgxa100"


def test_study_project_takes_a_compute_curve_from_the_command_line(capsys):
    """--compute-curve: the bench's measured curve (the emulated study's 1-rank step at 64-512) shapes
    compute with the batch; a bad path is one line naming the flag."""
    curve = os.path.join(ROOT, "bench", "emulated-dlrm-compute-curve.yaml")
    code, out, _ = run_cli(capsys, STUDY + ".yaml", "--profile", "dgxa100", "--gpus", "4", "--step-ms", "6",
                           "--compute-curve", curve, "--json")
    assert code == 0
    by = {p["gpus"]: p["phases_ms"]["compute"] for p in json.loads(out)["points"]}
    plain = {p["gpus"]: p["phases_ms"]["compute"] for p in
             P.run(STUDY + ".yaml", load_profile("dgxa100"), [4], step_ms=6)["points"]}
    assert by[1] == pytest.approx(plain[1]) and by[4] > plain[4]       # the curve shrinks slower than the batch
    code, out, err = run_cli(capsys, STUDY + ".yaml", "--profile", "dgxa100", "--gpus", "4", "--step-ms", "6",
                             "--compute-curve", "/nonexistent/curve.yaml")
    assert code == 2 and out == "" and "--compute-curve" in err and len(err.strip().splitlines()) == 1


def test_a_recorded_study_is_projected_with_its_measured_points_overlaid():
    record = P.run(STUDY + ".yaml", load_profile("dgxa100"), [16], report=STUDY + ".json")
    by = {p["gpus"]: p for p in record["points"]}
    assert sorted(by) == [1, 2, 4, 8, 16]
    assert by[8]["measured_throughput"] == pytest.approx(5220.326263978691)
    assert by[8]["measured_vs_band"]["inside"] is False                   # a DGX is not the emulated cluster
    assert by[16]["measured_throughput"] is None


@pytest.mark.parametrize("argv,expected", [
    (["--profile", "local", "--gpus", "2", "--step-ms", "6"], "profile 'local' has no fabric: section"),
    (["--profile", "dgxa100", "--gpus", "2,x", "--step-ms", "6"], "--gpus: 'x' is not a GPU count"),
    (["--profile", "dgxa100", "--gpus", "3", "--step-ms", "6"], "does not divide over 3 GPUs"),
    (["--profile", "dgxa100", "--gpus", "8"], "nothing measured to calibrate on; give --step-ms"),
    (["--profile", "dgxa100", "--gpus", "8", "--step-ms", "0"], "--step-ms: 0 is not a positive time"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, expected):
    code, out, err = run_cli(capsys, STUDY + ".yaml", *argv)
    assert code == 2 and out == "" and expected in err and len(err.strip().splitlines()) == 1


def test_a_missing_source_is_refused(capsys):
    code, _, err = run_cli(capsys, "/nonexistent/study", "--profile", "dgxa100", "--gpus", "8", "--step-ms", "1")
    assert code == 2 and "neither a study spec file nor a study directory" in err


# ------------------------------------------------------------------ the validation table


def _bench():
    spec = importlib.util.spec_from_file_location("bench_projection", os.path.join(ROOT, "bench",
                                                                                   "bench_projection.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_validation_table_in_the_docs_is_what_the_bench_computes_now():
    """docs/benchmarks.md's validation table is the output of bench/bench_projection.py: every row
    projected from a 1-GPU figure of the same table, model and size, no constant fitted."""
    bench = _bench()
    rows = bench.validation_rows()
    cases = {(r["case"], r["gpus"], r["precision"], r["xla"]) for r in rows}
    assert ("DE synthetic small", 32, "tf32", None) in cases and ("NCF dgx1", 8, "amp", None) in cases
    assert not any(r["case"].startswith("DLRM") for r in rows)     # no 1-GPU row of the large model
    for r in rows:
        assert r["low"] <= r["high"]
        assert r["ok"] == (r["inside"] or abs(r["error"]) <= 0.2)
    # the compute split is stated per row: distributed-embeddings' small model at 16 GPUs scales its
    # embedding part by the slowest rank's work (1/4.1 of 1 GPU's), its dense part by 1/16
    de16 = next(r for r in rows if (r["case"], r["gpus"]) == ("DE synthetic small", 16))
    assert de16["embedding_work_ratio"] == pytest.approx(1 / 4.1077, abs=1e-3) and 0 < de16["embedding_share"] < 1
    assert "embedding share" in de16["split"]
    table = bench.markdown(rows)
    assert "geometric-mean error of the band's middle" in table
    docs = open(os.path.join(ROOT, "docs", "benchmarks.md")).read()
    assert table.strip() in docs


# ------------------------------------------------------------------ the report's section


def _measured_study(tmp_path, profile_text):
    """A study record of a tiny synthetic DLRM at 1 and 2 GPUs (strong, global batch 512), every
    point done at the given throughput, on a profile file of `profile_text`."""
    from jobs.study.running.record import PointRecord, PointStatus, StudyRecord, StudyStatus

    tmp_path.mkdir(parents=True)
    profile = tmp_path / "mysite.yaml"
    profile.write_text(profile_text)
    spec = yaml.safe_load(open(STUDY + ".yaml"))
    spec.update(gpus=[1, 2], repeats=1)
    points, statuses = [], []
    for gpus, throughput in ((1, 80_000.0), (2, 120_000.0)):
        pid = f"g{gpus}-n1x{gpus}-r0"
        run_dir = tmp_path / "points" / pid
        run_dir.mkdir(parents=True)
        points.append(PointRecord(id=pid, nodes=1, gpus_per_node=gpus, gpus=gpus, batch_per_gpu=512 // gpus,
                                  global_batch=512, variant={}, variant_label="default", repeat=0, runs=[str(run_dir)]))
        statuses.append(PointStatus(id=pid, state="done", job_state="COMPLETED", run_dir=str(run_dir), job_id="9",
                                    attempts=1, summary={"type": "summary", "throughput_samples_per_s": throughput,
                                                         "world_size": gpus}))
    record = StudyRecord(name="tiny", study_dir=str(tmp_path), profile="mysite", profile_path=str(profile),
                         scheduler="slurm", spec=spec, created=0.0, points=points)
    return record, StudyStatus(study_dir=str(tmp_path), points=statuses, counts={}, done=True, calls=0, elapsed_s=0.0)


def test_a_report_on_a_profile_with_a_fabric_projects_the_next_sizes_up(tmp_path):
    from jobs.study.analysis import report as study_report, report_table

    record, status = _measured_study(tmp_path / "a", "extends: dgxa100\n")
    report = study_report.build(record, status)
    report["projection"] = P.for_report(record, report)
    proj = report["projection"]
    assert proj["next_sizes"] == [4, 8, 16]                                 # 2x, 4x, 8x the largest measured
    assert [p["gpus"] for p in proj["points"]] == [1, 2, 4, 8, 16]
    two = next(p for p in proj["points"] if p["gpus"] == 2)
    assert two["measured_throughput"] == 120_000.0 and "measured_vs_band" in two
    text = report_table.markdown(report)
    assert "## Projection on mysite" in text and "Next sizes up: 4, 8, 16 GPUs" in text
    # no fabric, no section
    record, status = _measured_study(tmp_path / "b", "extends: local\n")
    report = study_report.build(record, status)
    assert P.for_report(record, report) is None
    assert "## Projection" not in report_table.markdown(dict(report, projection=None))


def test_study_project_on_a_study_directory_calibrates_on_its_measured_point(tmp_path, capsys):
    from jobs.study.analysis import report as study_report

    record, status = _measured_study(tmp_path / "s", "extends: dgxa100\n")
    record.save()
    os.makedirs(tmp_path / "s" / "report")
    (tmp_path / "s" / "report" / "scaling.json").write_text(json.dumps(study_report.build(record, status)))
    code, out, _ = run_cli(capsys, str(tmp_path / "s"), "--profile", "dgx2", "--gpus", "16", "--json")
    assert code == 0
    proj = json.loads(out)
    assert proj["calibration"]["gpus"] == 1 and "study tiny, 1 GPU(s)" in proj["calibration"]["source"]
    assert {p["gpus"]: p["measured_throughput"] for p in proj["points"]} == {1: 80_000.0, 2: 120_000.0, 16: None}


def test_published_calibration_marks_the_published_rows(tmp_path, capsys):
    """Wide & Deep on the reference Outbrain feature spec, calibrated on NVIDIA's 1-GPU row (DGX
    A100, tf32, XLA): the published 8-GPU row is marked beside its band (docs/benchmarks.md's row)."""
    path = _wide_deep_spec(tmp_path)
    code, out, _ = run_cli(capsys, path, "--profile", "dgxa100", "--gpus", "8", "--published", "--json")
    assert code == 0
    proj = json.loads(out)
    assert "wide_deep_tf2 (commit 7b673991, 2022-09-05)" in proj["calibration"]["source"]
    assert proj["calibration"]["scaled_ms"] == pytest.approx(131072 / 1640579.8 * 1000)
    eight = next(p for p in proj["points"] if p["gpus"] == 8)
    [row] = eight["published"]
    assert row["throughput"] == 5369859.03 and row["vs_band"]["error"] == pytest.approx(-0.476, abs=1e-3)
    code, _, err = run_cli(capsys, path, "--profile", "dgx2", "--gpus", "8", "--published")
    assert code == 2 and "NVIDIA published no 1-GPU wide_deep row on dgx2" in err


# ------------------------------------------------------------------ issue 46: refusals, sizes, calibration at N


def _write_profile(tmp_path, text, name="mysite"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("profile_text,gpus,expected", [
    # a fabric without a between-nodes level: 16 GPUs span 2 DGX A100 nodes (a 39-line traceback before)
    ("extends: dgxa100\nfabric:\n  source: test\n  intra_node: {link: nvswitch, gb_per_s: 300, latency_us: 11.8}\n"
     "  inter_node: null\n", "8,16", "16 GPUs span 2 nodes and profile mysite's fabric has no inter_node level"),
    # past the profile's node limit (projected silently before): dgxa100 has max_nodes 16, 128 GPUs
    ("extends: dgxa100\n", "8,256", "256 GPUs need 32 nodes of 8; profile mysite has at most 16 node(s), 128 GPUs"),
    ("extends: dgxa100\nmax_nodes: 2\n", "24", "24 GPUs need 3 nodes of 8; profile mysite has at most 2 node(s)"),
])
def test_counts_the_profile_cannot_hold_are_one_line(capsys, tmp_path, profile_text, gpus, expected):
    profile = _write_profile(tmp_path, profile_text)
    code, out, err = run_cli(capsys, STUDY + ".yaml", "--profile", profile, "--gpus", gpus, "--step-ms", "6")
    assert code == 2 and out == "" and expected in err and "--gpus" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "-2"])
def test_a_step_time_that_is_not_finite_and_positive_is_one_line(capsys, value):
    code, out, err = run_cli(capsys, STUDY + ".yaml", "--profile", "dgxa100", "--gpus", "8", f"--step-ms={value}")
    assert code == 2 and out == "" and "--step-ms" in err and "not a positive time" in err
    assert len(err.strip().splitlines()) == 1


def test_a_report_projects_next_sizes_only_within_the_profiles_nodes(tmp_path):
    """Two GPUs measured on the emulated cluster (4 nodes of 2): of the next sizes 4, 8 and 16,
    16 needs 8 nodes and is not projected (it was, silently, before); on one node none is."""
    from jobs.study.analysis import report as study_report

    record, status = _measured_study(tmp_path / "a", "extends: ci\n")
    proj = P.for_report(record, study_report.build(record, status))
    assert proj["next_sizes"] == [4, 8] and [p["gpus"] for p in proj["points"]] == [1, 2, 4, 8]
    record, status = _measured_study(tmp_path / "b", "extends: ci\nmax_nodes: 1\n")
    proj = P.for_report(record, study_report.build(record, status))
    assert proj["next_sizes"] == [] and [p["gpus"] for p in proj["points"]] == [1, 2]


def test_the_text_table_shows_a_published_rows_error_against_the_band(tmp_path, capsys):
    wd = _wide_deep_spec(tmp_path)
    code, out, _ = run_cli(capsys, wd, "--profile", "dgxa100", "--gpus", "8", "--published")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("| 8 |"))
    assert "published 5,369,859 (wide_deep_tf2, -47.6 % vs band)" in row


def _wide_deep_spec(tmp_path):
    from preproc.outbrain import features as F

    data = tmp_path / "outbrain"
    data.mkdir()
    spec = F.feature_spec_dict(F.feature_layout("reference", *F.default_sizes("reference")),
                               ["train.parquet"], ["test.parquet"], {})
    (data / "feature_spec.yaml").write_text(yaml.safe_dump(spec))
    path = tmp_path / "wd.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "name": "wd", "model": "wide_deep", "scaling": "strong",
                                    "batch_size": 131072, "gpus": [1, 8], "data_path": str(data),
                                    "engine_args": ["--xla"]}))
    return str(path)


def _dlrm_spec(tmp_path, **extra):
    """The DGX-2 reference study's shape (NVIDIA's 1-GPU small row and 8- and 16-GPU large rows
    share the global batch 65536), on small synthetic tables so the planner is quick."""
    data = {"version": 1, "name": "dlrm", "model": "dlrm", "scaling": "strong", "batch_size": 65536,
            "gpus": [1, 8, 16], "synthetic": True,
            "engine_args": ["--embedding-dim", "4", "--bottom-mlp", "8,4", "--top-mlp", "8,1",
                            "--synthetic-rows", "4096", "--embedding-placement", "model_parallel"], **extra}
    path = tmp_path / "dlrm.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_published_never_mixes_model_sizes(tmp_path):
    """dlrm_tf2_2302 on DGX-2: the 1-GPU row is the small model, the 8- and 16-GPU rows the large
    one (other tables). Calibrated on the small row, the projection is of the small model and
    shows no large row beside its bands; calibrated otherwise (size unknown) it shows none."""
    spec = _dlrm_spec(tmp_path)
    record = P.run(spec, load_profile("dgx2"), [8, 16], use_published=True)
    assert record["model_size"] == "small" and "1 GPU small model fp32" in record["calibration"]["source"]
    shown = {p["gpus"]: [(q["model_size"], q["throughput"]) for q in p["published"]] for p in record["points"]}
    assert shown == {1: [("small", 698000.0)], 8: [], 16: []}
    assert "Model size: small" in P.markdown(record)
    record = P.run(spec, load_profile("dgx2"), [8, 16], step_ms=90)
    assert record["model_size"] is None and all(p["published"] == [] for p in record["points"])


def test_a_step_time_at_n_gpus_has_its_own_exchanges_taken_out(capsys):
    """--step-ms at --calibration-gpus 4: the no-overlap edge at 4 GPUs is the given step, compute
    there is the step less its exchanges projected at 4, and compute halves at 8 (twice the GPUs,
    half the batch per GPU, strong scaling)."""
    code, out, _ = run_cli(capsys, STUDY + ".yaml", "--profile", "dgxa100", "--gpus", "8", "--step-ms", "2",
                           "--calibration-gpus", "4", "--json")
    assert code == 0
    rec = json.loads(out)
    by = {p["gpus"]: p for p in rec["points"]}
    assert sorted(by) == [4, 8] and rec["calibration"]["gpus"] == 4 and rec["calibration"]["batch_per_gpu"] == 128
    four = by[4]["phases_ms"]
    assert by[4]["step_ms_serial"] == pytest.approx(2.0)
    assert four["compute"] == pytest.approx(2.0 - four["embedding_exchange"] - four["gradient_exchange"])
    # the dense part halves (half the batch per GPU); the embedding part follows the slowest rank's work
    c = rec["calibration"]
    emb, ratio = c["embedding_share"] * c["scaled_ms"], by[8]["embedding_work_ratio"]
    assert four["embedding_exchange"] > 0 and by[8]["phases_ms"]["compute"] == pytest.approx(
        (four["compute"] - emb) / 2 + emb * ratio)
    assert "own exchanges at 4 GPUs" in rec["calibration"]["source"]


@pytest.mark.parametrize("argv,expected", [
    (["--calibration-gpus", "4"], "--calibration-gpus: give it with --step-ms"),
    (["--step-ms", "6", "--calibration-gpus", "3"], "--calibration-gpus: the spec's global batch 512 does not divide"),
    (["--step-ms", "6", "--calibration-gpus", "0"], "--calibration-gpus: 0 is not a positive GPU count"),
    (["--step-ms", "0.05", "--calibration-gpus", "8"], "is not longer than its own exchanges"),
])
def test_a_bad_calibration_at_n_gpus_is_one_line(capsys, argv, expected):
    code, out, err = run_cli(capsys, STUDY + ".yaml", "--profile", "dgxa100", "--gpus", "8", *argv)
    assert code == 2 and out == "" and expected in err and len(err.strip().splitlines()) == 1


def test_a_model_that_does_not_fit_one_gpu_is_calibrated_where_it_fits(tmp_path, capsys):
    """26 tables of 2M rows x 256 floats (53 GB) on a 32 GB DGX-1 GPU: a 1-GPU step time is
    refused, naming --calibration-gpus; at 2 GPUs (it fits) the calibration stands."""
    from recsys.data.synthetic import default_spec

    data = tmp_path / "criteo"
    data.mkdir()
    (data / "feature_spec.yaml").write_text(yaml.safe_dump(default_spec("dlrm", cardinalities=[2_000_000] * 26).to_dict()))
    spec = _dlrm_spec(tmp_path, synthetic=False, data_path=str(data),
                      engine_args=["--embedding-dim", "256", "--bottom-mlp", "8,256", "--top-mlp", "8,1",
                                   "--embedding-placement", "model_parallel"])
    profile = "dgx1"
    code, out, err = run_cli(capsys, spec, "--profile", profile, "--gpus", "8", "--step-ms", "90")
    assert code == 2 and out == "" and "--step-ms: at 1 GPU(s)" in err and "--calibration-gpus N" in err
    assert "of --embedding-memory-gb 32" in err and len(err.strip().splitlines()) == 1   # the target GPU's memory
    code, out, _ = run_cli(capsys, spec, "--profile", profile, "--gpus", "8", "--step-ms", "90",
                           "--calibration-gpus", "2", "--json")
    assert code == 0 and json.loads(out)["calibration"]["gpus"] == 2


def test_a_study_whose_smallest_point_has_n_gpus_takes_its_exchanges_out(tmp_path):
    """A study measured at 2 and 4 GPUs without a step breakdown: its 2-GPU step still holds its
    exchanges; they are taken out (projected at 2) so the no-overlap edge at 2 is the measured step."""
    from jobs.study.analysis import report as study_report

    record, status = _measured_study(tmp_path / "s", "extends: dgxa100\n")
    report = study_report.build(record, status)
    report["rows"] = [r for r in report["rows"] if r["gpus"] == 2]
    calib, _, _ = P.calibration_of_report(report)
    assert calib.gpus == 2 and calib.exchanges_in
    rec = P.run(STUDY + ".yaml", load_profile("dgxa100"), [4], report=report)
    two = next(p for p in rec["points"] if p["gpus"] == 2)
    assert two["step_ms_serial"] == pytest.approx(calib.step_ms)
    assert two["phases_ms"]["compute"] < calib.step_ms and "taken out" in rec["calibration"]["source"]


def test_the_band_carries_the_calibrations_repeats_and_flags_a_noisy_one():
    """The recorded study's 1-rank point ran 3 repeats at 76,957 - 91,821 samples/s: at 1 GPU (no
    exchanges) the band is exactly the slowest to the fastest repeat, not one figure; a point the
    study report flags as noisy is flagged in the projection's table and JSON."""
    report = recorded_report()
    cell = report["rows"][0]["variants"]["default"]
    record = P.run(STUDY + ".yaml", load_profile("ci"), [2], report=report)
    one = next(p for p in record["points"] if p["gpus"] == 1)
    assert one["throughput_low"] == pytest.approx(cell["throughput_min"])
    assert one["throughput_high"] == pytest.approx(cell["throughput_max"])
    assert record["calibration"]["noisy"] is None and "WARNING" not in P.markdown(record)
    cell["spread_warning"] = "g1 default: repeats 50,000 - 91,821 samples/s (noisy)"
    calib, _, _ = P.calibration_of_report(report)
    assert calib.noisy == cell["spread_warning"]
    record["calibration"] = dataclasses.asdict(calib)
    assert f"WARNING: a noisy calibration, every band below carries it: {cell['spread_warning']}" in P.markdown(record)


def test_the_slowest_ranks_embedding_work_follows_the_engines_placement():
    """The lookup work of a model-parallel rank is the global batch x hotness x width of the slices
    it holds, not the per-GPU batch: distributed-embeddings' small model (107 tables) at 16 GPUs
    keeps the slowest rank at a quarter of the 1-GPU work (1/4.1), where the per-GPU batch is 1/16."""
    bench = _bench()
    work = bench.de_workload("small")
    layouts = P.layouts_of_workload(work, [1, 16])
    one = P.embedding_work(layouts[1], 1, 65536)
    assert one == [65536 * sum(t[3] * t[4] for t in layouts[1]["tables"])]     # 1 rank: every table, whole batch
    sixteen = P.embedding_work(layouts[16], 16, 4096)
    assert sum(sixteen) == one[0]                       # the work is spread, not shrunk
    assert max(sixteen) * 16 > one[0] and one[0] / max(sixteen) == pytest.approx(4.1077, abs=1e-3)
    rec = P.project({16: layouts[16]}, P.Calibration(gpus=1, batch_per_gpu=65536, scaled_ms=67.355),
                    P.Target.of(load_profile("dgxa100-pod")), "strong", 65536, work.model)
    assert rec["points"][0]["embedding_work_slowest"] == max(sixteen)


def _split_layout():
    """A recorded planner answer, by hand: 4 tables of width 16 and hotness 10 on 2 ranks, three
    on rank 0 and one on rank 1 (model parallel), 1,000,000 dense parameters."""
    tables = [["g", f"t{i}", 1000, 16, 10, 4, True, 1] for i in range(4)]
    return {"tables": tables, "slices": [[0, 0, 0, 16], [1, 0, 0, 16], [2, 0, 0, 16], [3, 1, 0, 16]],
            "dense_params": 1_000_000, "sparse_as_dense": False, "rank_bytes": [1, 1]}


def test_the_arithmetic_split_is_dense_flops_against_embedding_bytes():
    """The model's own arithmetic per sample: 6 FLOPs per dense parameter at the peak FLOP rate
    against 2 x 4 bytes per looked-up element at the memory bandwidth; the range has either part
    at half its peak; no peak rates: not known, the range all-dense to all-embedding."""
    from jobs.study.analysis import projection_split as S
    layout = _split_layout()
    assert S.lookup_elements(layout) == 4 * 10 * 16
    dense, emb = 6e6 / 156e12, 2 * 4 * 640 / 2039e9
    share, rng, source = S.arithmetic_split(layout, "wide_deep", "tf32", (156e12, 2039e9))
    assert share == pytest.approx(emb / (dense + emb))
    assert rng == pytest.approx((emb / (emb + 2 * dense), 2 * emb / (2 * emb + dense)))
    assert rng[0] < share < rng[1] and "156 TFLOPS (tf32)" in source and "2039 GB/s" in source
    # DLRM's dot interaction: 5 vectors (4 tables + the bottom MLP), 10 pairs of width 16, x2 FLOPs x3
    assert S.interaction_flops(layout, "dlrm") == 3 * 5 * 4 * 16 and S.interaction_flops(layout, "ncf") == 0
    assert S.arithmetic_split(layout, "dlrm", "fp32", None)[:2] == (None, (0.0, 1.0))
    assert load_profile("dgx1").fabric.gpu_rates("tf32") is None        # no TF32 on V100
    assert load_profile("dgxa100-pod").fabric.gpu_rates("amp") == (312e12, 2039e9)


def test_embedding_compute_follows_the_slowest_ranks_work_and_the_split_widens_the_band():
    """Compute = dense part x the batch per GPU ratio + embedding part x the slowest rank's work
    ratio (rank 0: 3 of 4 tables for the global batch, 0.75 of the 1-GPU work where the batch per
    GPU halves); the split's range moves the band's edges, not its middle term."""
    from jobs.study.analysis import projection_split as S
    layout, one = _split_layout(), dict(_split_layout(), slices=[])
    for t in one["tables"]:
        t[6] = False
    assert P.embedding_work(layout, 2, 256) == [2 * 256 * 10 * 16 * 3, 2 * 256 * 10 * 16]
    base = P.Calibration(gpus=1, batch_per_gpu=512, scaled_ms=10.0, fixed_ms=2.0)
    calib = S.with_split(base, one, "wide_deep", "tf32", (156e12, 2039e9))
    assert calib.embedding_work == 512 * 640 and "embedding share" in calib.split_source
    target = P.Target.of(load_profile("dgxa100"))
    p = P.project_point(layout, calib, target, 2, 256)
    emb = calib.embedding_share * 10.0
    assert p.embedding_work_ratio == pytest.approx(0.75)
    assert p.phases_ms["compute"] == pytest.approx((10.0 - emb) / 2 + 2.0 + emb * 0.75)
    lo, hi = (pytest.approx((10.0 - s * 10) / 2 + 2.0 + s * 10 * 0.75) for s in calib.embedding_share_range)
    assert p.compute_ms_range == (lo, hi)
    exchanges = p.phases_ms["embedding_exchange"] + p.phases_ms["gradient_exchange"]
    assert p.step_ms_serial == pytest.approx(p.compute_ms_range[1] + exchanges)
    assert p.step_ms_overlap == pytest.approx(max(p.compute_ms_range[0], exchanges))
    # one term (no split): the old rule, batch-proportional
    assert P.project_point(layout, base, target, 2, 256).phases_ms["compute"] == pytest.approx(7.0)


def test_a_breakdown_without_a_lookup_term_says_so_and_one_with_it_is_measured():
    """The recorded study's breakdown has no lookup phase: the split is the arithmetic, and the
    calibration says why; a breakdown that times the lookup gives the share itself."""
    from jobs.study.analysis import projection_split as S
    calib, _, _ = P.calibration_of_report(recorded_report())
    assert calib.embedding_share is None and "no separate lookup term" in calib.split_source
    record = P.run(STUDY + ".yaml", load_profile("ci"), [2], report=recorded_report())
    assert "no separate lookup term" in record["calibration"]["split_source"]
    assert "not known" in P.markdown(record) and tuple(record["calibration"]["embedding_share_range"]) == (0.0, 1.0)
    assert S.breakdown_share({"compute": 3.0, "embedding_lookup": 1.0}, 4.0, 2.0) == pytest.approx(0.5)
    assert S.breakdown_share({"compute": 3.0}, 4.0, 2.0) is None
