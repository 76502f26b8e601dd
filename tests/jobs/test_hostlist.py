"""Slurm host lists expanded (slurm/common/hostlist.py) as `scontrol show hostnames` does, and the study
report's "ran on" naming each node once (issue 35: "node1, node[1-2]" listed node1 twice)."""

import pytest

from jobs.study.analysis.report_facts import hosts as _hosts
from slurm.common.hostlist import expand, natural_key

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("hostlist, hosts", [
    ("node1", ["node1"]),
    ("node[1-2]", ["node1", "node2"]),
    ("node[01-03,7],gpu5", ["node01", "node02", "node03", "node7", "gpu5"]),
    ("dgx[8-10]", ["dgx8", "dgx9", "dgx10"]),
    ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
    ("", []),
])
def test_expand_like_scontrol_show_hostnames(hostlist, hosts):
    assert expand(hostlist) == hosts


@pytest.mark.parametrize("bad", ["node[1-", "node[3-1]", "node[a-b]"])
def test_a_malformed_host_list_is_refused(bad):
    with pytest.raises(ValueError):
        expand(bad)


def test_ran_on_lists_each_node_once_in_natural_order():
    hosts = _hosts({"node1", "node[1-2]", "node[2,10]", "odd[name"})
    assert sorted(hosts, key=natural_key) == ["node1", "node2", "node10", "odd[name"]
