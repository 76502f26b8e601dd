"""The exchange of ranks that share a host's cores, measured at that sharing, and the fabric's
measured range in the band (issue 46, items 1 and 4): `profiles fabric --core-sharing` on the
recorded fabric files of the `ci` cluster (tests/jobs/recorded/collectives-ci-sharing/: 1 x 2,
2 x 1, 2 x 2 and 4 x 2 ranks, 3 repeats each, bench/bench_collectives_ci.py --core-sharing), the
schema, and the projection's arithmetic with them. No scheduler, no TensorFlow: the fast tier."""

import dataclasses
import glob
import os
import statistics

import pytest
import yaml

from jobs import cli
from jobs.profiles import ProfileError, load_profile
from jobs.profiles.fabric import Fabric, Level, bus_factor, fabric_from_measurements
from jobs.study.analysis import projection as P

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("isolated_profile_search_path")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = sorted(glob.glob(os.path.join(ROOT, "tests", "jobs", "recorded", "collectives-ci-sharing", "*.yaml")))
SHARING = {"source": "measured: test", "cores": 2, "slowdown": {1: 1.0, 2: 1.0, 4: 2.0, 8: 4.0}}
LOOPBACK = Fabric(source="test", intra_node=Level(link="loopback", gb_per_s=1.0, latency_us=1000.0),
                  inter_node=Level(link="loopback", nics=1, nic_gb_per_s=2.0, latency_us=1000.0))


def records():
    out = []
    for path in FILES:
        with open(path) as f:
            out.append(yaml.safe_load(f))
    return out


def figures(ranks, nodes, coll, key):
    """One figure of the recorded files of a layout, every repeat."""
    return sorted(r["measured"][r["level"]][coll][key] for r in records() if (r["ranks"], r["nodes"]) == (ranks, nodes))


def ci_target(fabric):
    return P.Target(profile="ci", gpus_per_node=2, gpu_memory_gb=None, fabric=fabric, host_cores=2)


def test_the_recorded_files_are_the_four_layouts_three_times():
    assert len(FILES) == 12
    assert sorted({(r["ranks"], r["nodes"]) for r in records()}) == [(2, 1), (2, 2), (4, 2), (8, 4)]


def test_repeats_give_the_median_and_the_range_and_the_exchange_by_rank_count():
    section = fabric_from_measurements(records(), 2, core_sharing=dict(SHARING))
    bws = figures(4, 2, "alltoall", "busbw_gb_per_s")
    lats = figures(4, 2, "alltoall", "latency_us")
    got = section["core_sharing"]["exchange"][4]["inter_node"]["alltoall"]
    assert got == {"busbw_gb_per_s": pytest.approx(statistics.median(bws)), "latency_us": pytest.approx(statistics.median(lats)),
                   "range": [bws[0], bws[-1]], "latency_range": [lats[0], lats[-1]]}
    exchange = section["core_sharing"]["exchange"]
    assert sorted(exchange) == [2, 4, 8]
    assert sorted(exchange[2]) == ["inter_node", "intra_node"] and list(exchange[8]) == ["inter_node"]
    # the levels' own figures come from their own layouts only: 1 node; one rank per node
    assert section["measured"]["inter_node"]["allreduce"]["busbw_gb_per_s"] == pytest.approx(
        statistics.median(figures(2, 2, "allreduce", "busbw_gb_per_s")))
    assert {k: v for k, v in section["core_sharing"].items() if not k.startswith("exchange")} == SHARING
    assert section["core_sharing"]["exchange_source"].startswith("measured: python -m recsys.collectives at 2 ranks")


def test_profiles_fabric_core_sharing_prints_a_section_the_profile_loads(tmp_path, capsys):
    assert cli.main(["profiles", "fabric", "--profile", "ci", "--core-sharing", *FILES]) == 0
    section = yaml.safe_load(capsys.readouterr().out)
    path = tmp_path / "ci-measured.yaml"
    path.write_text(yaml.safe_dump({"extends": "ci", **section}))
    fabric = load_profile(str(path)).fabric
    assert fabric.core_sharing["slowdown"] == load_profile("ci").fabric.core_sharing["slowdown"]
    assert fabric.core_sharing["exchange"][8]["inter_node"]["allreduce"]["range"] == [
        figures(8, 4, "allreduce", "busbw_gb_per_s")[0], figures(8, 4, "allreduce", "busbw_gb_per_s")[-1]]


@pytest.mark.parametrize("argv,expected", [
    (FILES, "inter_node: files of different layouts (2 ranks on 2 node(s), 4 ranks on 2 node(s), 8 ranks on 4 "
            "node(s)); give one layout per level, or --core-sharing"),
    (["--core-sharing"], "--core-sharing: give the fabric files"),
])
def test_mixed_layouts_without_core_sharing_are_one_line(capsys, argv, expected):
    assert cli.main(["profiles", "fabric", "--profile", "ci", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and expected in err


def test_core_sharing_needs_the_profiles_slowdown(capsys):
    assert cli.main(["profiles", "fabric", "--profile", "dgxa100", "--core-sharing", *FILES]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--core-sharing: profile dgxa100 has no fabric.core_sharing" in err


def test_ci_carries_the_exchange_measured_at_its_core_sharing():
    fabric = load_profile("ci").fabric
    section = fabric_from_measurements(records(), 2, core_sharing={})
    exchange = fabric.core_sharing["exchange"]
    assert fabric.core_sharing["exchange_source"].startswith("measured: python -m recsys.collectives at 2 ranks on "
                                                             "1 node x 3")
    for k in (2, 4, 8):
        assert exchange[k] == section["core_sharing"]["exchange"][k]
    assert fabric.measured["intra_node"] == section["measured"]["intra_node"]
    assert fabric.measured["inter_node"] == section["measured"]["inter_node"]


def test_an_exchange_at_k_shared_ranks_uses_the_figures_measured_there():
    """Nearest measured k at or above the ranks; beyond the largest, its figures in proportion;
    the whole n-rank collective as one latency + size x bus factor(n) / the bandwidth."""
    exchange = {4: {"inter_node": {"alltoall": {"busbw_gb_per_s": 0.2, "latency_us": 4000.0}}},
                8: {"inter_node": {"alltoall": {"busbw_gb_per_s": 0.1, "latency_us": 8000.0}}}}
    fab = dataclasses.replace(LOOPBACK, core_sharing={**SHARING, "exchange_source": "m", "exchange": exchange})
    t = ci_target(fab)
    size = 1e6
    assert P.collective_ms(t, "alltoall", size, 4) == pytest.approx(4.0 + size * bus_factor("alltoall", 4) / 0.2e6)
    assert P.collective_ms(t, "alltoall", size, 3) == pytest.approx(4.0 + size * bus_factor("alltoall", 3) / 0.2e6)
    assert P.collective_ms(t, "alltoall", size, 8) == pytest.approx(8.0 + size * bus_factor("alltoall", 8) / 0.1e6)
    assert P.collective_ms(t, "alltoall", size, 16) == pytest.approx(16.0 + size * bus_factor("alltoall", 16) / 0.05e6)
    # 2 ranks: below every measured k, the smallest (4) is taken, an exchange of fewer ranks no faster
    assert P.collective_ms(t, "alltoall", size, 2) == pytest.approx(4.0 + size * bus_factor("alltoall", 2) / 0.2e6)
    # a collective not measured at any k, and a profile whose ranks do not share cores: the levels
    assert P.collective_ms(t, "allreduce", size, 4) == pytest.approx(P.collective_ms(ci_target(LOOPBACK), "allreduce",
                                                                                       size, 4))
    alone = dataclasses.replace(t, host_cores=None)
    assert P.collective_ms(alone, "alltoall", size, 4) == P.collective_ms(ci_target(LOOPBACK), "alltoall", size, 4) \
        != P.collective_ms(t, "alltoall", size, 4)


def test_the_fabrics_measured_range_widens_the_band():
    """The slowest figures (bandwidth's min, latency's max) on the no-overlap edge, the fastest on
    the full-overlap edge; the phases keep the median; no range, no widening."""
    entry = {"busbw_gb_per_s": 0.2, "latency_us": 4000.0, "range": [0.1, 0.4], "latency_range": [2000.0, 9000.0]}
    ranged = dataclasses.replace(LOOPBACK, core_sharing={**SHARING, "exchange_source": "m", "exchange": {4: {
        "inter_node": {"allreduce": dict(entry), "allgather": dict(entry), "alltoall": dict(entry)}}}})
    plain = dataclasses.replace(LOOPBACK, core_sharing={**SHARING, "exchange_source": "m", "exchange": {4: {
        "inter_node": {c: {"busbw_gb_per_s": 0.2, "latency_us": 4000.0} for c in ("allreduce", "allgather", "alltoall")}}}})
    calib = P.Calibration(gpus=1, batch_per_gpu=512, scaled_ms=4.0)
    lay = {"dense_params": 100000, "sparse_as_dense": False, "tables": [], "slices": [], "rank_bytes": [0] * 4}
    wide = P.project_point(lay, calib, ci_target(ranged), 4, 128)
    narrow = P.project_point(lay, calib, ci_target(plain), 4, 128)
    grad = 4 * 100000 + P.GRADIENT_EXTRAS_BYTES
    f = bus_factor("allreduce", 4)
    assert narrow.exchange_ms_range == pytest.approx((4.0 + grad * f / 0.2e6,) * 2)
    assert wide.exchange_ms_range == pytest.approx((2.0 + grad * f / 0.4e6, 9.0 + grad * f / 0.1e6))
    assert wide.phases_ms == narrow.phases_ms
    compute = narrow.phases_ms["compute"]
    assert wide.step_ms_serial == pytest.approx(compute + wide.exchange_ms_range[1])
    assert wide.step_ms_overlap == pytest.approx(max(compute, wide.exchange_ms_range[0]))
    assert wide.throughput_low < narrow.throughput_low and wide.throughput_high >= narrow.throughput_high
    # the measured: section's ranges widen a band the same way (a profile without shared cores)
    levels = dataclasses.replace(LOOPBACK, measured={"source": "m", "intra_node": {"allreduce": dict(entry)}})
    dgx = P.Target(profile="t", gpus_per_node=2, gpu_memory_gb=None, fabric=levels)
    two = dict(lay, rank_bytes=[0, 0])
    p = P.project_point(two, calib, dgx, 2, 256)
    assert p.exchange_ms_range == pytest.approx((2 * 2.0 + grad / 0.4e6, 2 * 9.0 + grad / 0.1e6))
    record = P.project({4: lay}, calib, ci_target(ranged), "strong", 512, "dlrm")
    assert record["fabric"]["exchange_sharing"] == "m" and "measured at that sharing" in P.markdown(record)


def test_a_profile_extending_ci_replaces_a_measured_figure_whole(tmp_path):
    """A measured entry is one measurement: an extending profile's figure replaces its parent's
    with its range (none here), and its exchange table replaces the parent's whole."""
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"extends": "ci", "fabric": {
        "measured": {"intra_node": {"allreduce": {"busbw_gb_per_s": 0.05, "latency_us": 900.0}}},
        "core_sharing": {"exchange_source": "mine", "exchange": {4: {"inter_node": {"alltoall": {"busbw_gb_per_s": 0.01}}}}}}}))
    fabric = load_profile(str(path)).fabric
    assert fabric.measured["intra_node"]["allreduce"] == {"busbw_gb_per_s": 0.05, "latency_us": 900.0}
    assert fabric.measured["intra_node"]["alltoall"] == load_profile("ci").fabric.measured["intra_node"]["alltoall"]
    assert list(fabric.core_sharing["exchange"]) == [4] and fabric.core_sharing["exchange_source"] == "mine"
    assert fabric.core_sharing["slowdown"] == load_profile("ci").fabric.core_sharing["slowdown"]
