"""Cluster profiles: shipped profiles validate, DGX tables are right, every class of bad
profile gives its exact one-line error, and the search path finds user profiles."""
import copy
import os
import subprocess
import sys

import pytest
import yaml

from jobs.profiles.schema import CONTAINER_KEYS, NODE_KEYS, PROFILE_KEYS
from jobs.profiles import ProfileError, builtin_dir, list_profiles, load_profile
from jobs.profiles.topology import detect_local_node
from slurm.common.cpulist import format_cpulist, parse_cpulist
from submit_helpers import ci_raw

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("isolated_profile_search_path")]

BUILTINS = ["ci", "dgx1", "dgx2", "dgxa100", "dgxa100-pod", "dgxa100-pod-spark", "local"]


def write(tmp_path, data, name="bad.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def error_of(path):
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------ shipped profiles

def test_builtins_are_listed():
    refs = {r.name: r for r in list_profiles()}
    assert sorted(refs) == BUILTINS
    assert all(r.source == "builtin" for r in refs.values())


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_validates(name):
    profile = load_profile(name)
    assert profile.name == name
    assert profile.scheduler in ("slurm", "local")
    assert profile.max_nodes >= 1
    node = profile.node
    assert len(node.gpu_cores) == len(node.gpu_numa) == node.gpus


def test_dgxa100_tables_match_the_facts():
    node = load_profile("dgxa100").node
    assert (node.gpus, node.sockets, node.cores_per_socket, node.threads_per_core) == (8, 2, 64, 2)
    assert node.ht_offset == 128 and node.logical_cpus == 256
    assert [format_cpulist(c) for c in node.gpu_cores] == [
        "48-55", "56-63", "16-23", "24-31", "112-119", "120-127", "80-87", "88-95"]
    assert node.gpu_numa == [3, 3, 1, 1, 7, 7, 5, 5]
    assert node.nics == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
    assert sorted(node.numa_cpus) == list(range(8))
    for n in range(8):
        assert node.numa_cpus[n] == list(range(16 * n, 16 * n + 16)) + list(range(16 * n + 128, 16 * n + 144))


def test_dgx1_and_dgx2_are_linear_with_half_the_gpus_per_socket():
    dgx1 = load_profile("dgx1").node
    assert dgx1.gpu_cores == [list(range(5 * g, 5 * g + 5)) for g in range(8)]
    assert dgx1.gpu_numa == [0] * 4 + [1] * 4 and dgx1.ht_offset == 40
    dgx2 = load_profile("dgx2").node
    assert dgx2.gpus == 16 and dgx2.gpu_model.startswith("V100")
    assert dgx2.gpu_cores == [list(range(3 * g, 3 * g + 3)) for g in range(16)]
    assert dgx2.gpu_numa == [0] * 8 + [1] * 8 and dgx2.ht_offset == 48
    assert dgx2.nics[0] == dgx2.nics[1] == "mlx5_1" and dgx2.nics[15] == "mlx5_10"


def test_pod_reuses_the_dgxa100_node_and_sets_cluster_settings():
    pod = load_profile("dgxa100-pod")
    assert pod.node == load_profile("dgxa100").node
    assert pod.max_nodes == 64 and pod.mpi == "pmix"
    # no guessed interface name, no SHARP without NCCL's CollNet, no switch wait (test_dgx_profile_hygiene.py)
    assert pod.env == {"OMPI_MCA_btl": "^openib"}
    assert not pod.sbatch_extra and pod.switches is None
    assert pod.container is not None and pod.container.image and pod.container.mounts
    assert pod.scratch == "/raid/scratch" and pod.container.provides == ["tensorflow", "horovod"]


def test_ci_profile_describes_the_emulated_cluster():
    ci = load_profile("ci")
    assert (ci.scheduler, ci.max_nodes, ci.partition, ci.mpi) == ("slurm", 4, "debug", "pmix")
    assert ci.max_array_size == 1001 and ci.container is None
    node = ci.node
    assert (node.gpus, node.sockets, node.cores_per_socket, node.threads_per_core) == (2, 1, 2, 1)
    assert node.numa_cpus == {0: [0, 1]} and node.gpu_cores == [[0], [1]] and node.gpu_numa == [0, 0]
    assert node.nics == []
    # its 4 nodes share this host's 2 cores: Open MPI ranks must yield when idle (issue 21)
    assert ci.shared_nodes is True
    assert ci.env == {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo",
                      "OMPI_MCA_oob_tcp_if_include": "lo", "OMPI_MCA_mpi_yield_when_idle": "1",
                      # fake GRES GPUs: the engine's GPU check is off (recsys.runtime.devices)
                      "RECSYS_DEVICE": "cpu"}


def test_local_profile_detects_this_machine():
    local = load_profile("local")
    assert local.scheduler == "local" and local.max_nodes == 1 and local.mpi == "none"
    cpus = sorted(c for cs in local.node.numa_cpus.values() for c in cs)
    assert cpus == sorted(os.sched_getaffinity(0))


def test_detect_local_node_from_a_fake_sysfs(tmp_path):
    def put(rel, text):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    put("sys/devices/system/cpu/online", "0-7")
    for c in range(8):
        put(f"sys/devices/system/cpu/cpu{c}/topology/physical_package_id", str(c // 4))
    put("sys/devices/system/node/node0/cpulist", "0-3")
    put("sys/devices/system/node/node1/cpulist", "4-7")
    (tmp_path / "proc/driver/nvidia/gpus/0000:81:00.0").mkdir(parents=True)
    put("sys/bus/pci/devices/0000:81:00.0/numa_node", "1")
    put("proc/meminfo", "MemTotal:       16777216 kB")
    node = detect_local_node(str(tmp_path))
    assert (node.sockets, node.cores_per_socket, node.memory_gb) == (2, 4, 16.0)
    assert node.numa_cpus == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    assert (node.gpus, node.gpu_numa, node.gpu_cores) == (1, [1], [[4, 5, 6, 7]])


def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"
    assert parse_cpulist([3, 1]) == [1, 3] and parse_cpulist(7) == [7]
    for bad in ("3-1", "a", "1,1", "", True):
        with pytest.raises(ValueError):
            parse_cpulist(bad)


# -------------------------------------------------------------------- bad profiles

def node_patch(**changes):
    data = ci_raw()
    data["node"].update(changes)
    return data


BAD = [
    # (raw profile, expected "<key>: <problem>")
    (dict(ci_raw(), colour="blue"),
     f"colour: unknown key (known: {', '.join(sorted(PROFILE_KEYS))})"),
    (dict(ci_raw(), partiton="gpu"),
     f"partiton: unknown key (did you mean 'partition'? known: {', '.join(sorted(PROFILE_KEYS))})"),
    (node_patch(colour=3),
     f"node.colour: unknown key (known: {', '.join(sorted(NODE_KEYS))})"),
    (dict(ci_raw(), container={"image": "x", "mount": []}),
     f"container.mount: unknown key (did you mean 'mounts'? known: {', '.join(sorted(CONTAINER_KEYS))})"),
    (dict(ci_raw(), max_nodes="four"), "max_nodes: must be an integer, got string"),
    (dict(ci_raw(), max_nodes=True), "max_nodes: must be an integer, got bool"),
    (dict(ci_raw(), max_nodes=0), "max_nodes: must be >= 1, got 0"),
    (dict(ci_raw(), setup="module load x"), "setup: must be a list, got string"),
    (dict(ci_raw(), env={"A": True}), "env.A: must be a string or number, got bool (quote it)"),
    (dict(ci_raw(), mpi="openmpi"), "mpi: must be one of pmix, pmi2, none, got 'openmpi'"),
    (dict(ci_raw(), scheduler="pbs"), "scheduler: must be one of slurm, local, got 'pbs'"),
    (dict(ci_raw(), defaults={"binding": "tight"}),
     "defaults.binding: must be one of exclusive, numa, interleave, off, got 'tight'"),
    (dict(ci_raw(), default_time="1:2:3:4"),
     "default_time: '1:2:3:4' is not a Slurm time limit "
     "(use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)"),
    (dict(ci_raw(), switches="one"), "switches: must be COUNT[@MAX_WAIT] like '1@00:10:00', got 'one'"),
    (dict(ci_raw(), sbatch_extra=["-p x"]),
     "sbatch_extra[0]: must be a long option like '--network=sharp', got '-p x'"),
    (node_patch(gpu_cores=[[0], [0]]), "node.gpu_cores[1]: core 0 is also in the core set of GPU 0"),
    (node_patch(gpu_numa=[0]), "node.gpu_numa: has 1 entries for 2 GPUs"),
    (node_patch(gpu_cores=[[0]]), "node.gpu_cores: has 1 entries for 2 GPUs"),
    (node_patch(nics=["mlx5_0"]),
     "node.nics: has 1 entries for 2 GPUs (one per GPU, repeat a NIC shared by a GPU pair)"),
    (node_patch(gpu_numa=[0, 4]), "node.gpu_numa[1]: NUMA node 4 does not exist (nodes: [0])"),
    (node_patch(numa_cpus={0: "0"}), "node.numa_cpus: core 1 is in no NUMA node"),
    (node_patch(numa_cpus={0: "0-2"}),
     "node.numa_cpus.0: cpu 2 is beyond the 2 logical CPUs (1 sockets x 2 cores x 1 threads)"),
    (node_patch(numa_cpus={0: "0-1", 1: "1"}), "node.numa_cpus.1: cpu 1 is also in NUMA node 0"),
    (node_patch(gpu_cores=[[0], [5]]),
     "node.gpu_cores[1]: core 5 is beyond the 2 physical cores "
     "(list physical cores; HT siblings are added by the binding)"),
    (node_patch(numa_cpus={0: [0], 1: [1]}),
     "node.gpu_cores[1]: core 1 is not on GPU 1's NUMA node 0"),
    (node_patch(gpu_cores=["0", "x-1"]), "node.gpu_cores[1]: not a CPU list: 'x-1'"),
    (node_patch(ht_offset=2), "node.ht_offset: needs threads_per_core: 2, got 1"),
    (node_patch(gpus=-1), "node.gpus: must be >= 0, got -1"),
    ({k: v for k, v in ci_raw().items() if k != "node"},
     "node: required key is missing (a node-type mapping, a profile name whose node to "
     "reuse, or 'detect')"),
    (dict(ci_raw(), node="no-such-node"),
     None),  # checked separately (message lists the known profiles)
]


@pytest.mark.parametrize("raw, expected", [b for b in BAD if b[1]], ids=[b[1].split(":")[0] for b in BAD if b[1]])
def test_bad_profile_gives_exact_one_line_error(tmp_path, raw, expected):
    path = write(tmp_path, copy.deepcopy(raw))
    assert error_of(path) == f"{path}: {expected}"


def test_hyperthread_sibling_must_stay_on_its_numa_node(tmp_path):
    raw = node_patch(threads_per_core=2, ht_offset=2, numa_cpus={0: "0-1,3"})
    raw["node"]["numa_cpus"] = {0: "0-1,3", 1: "2"}
    raw["node"]["gpu_numa"] = [0, 0]
    path = write(tmp_path, raw)
    assert error_of(path) == (f"{path}: node.numa_cpus.1: cpu 2 is neither a physical core (< 2) "
                              "nor the HT sibling of a core of NUMA node 1")


def test_name_must_match_the_file_on_the_search_path(tmp_path, monkeypatch):
    monkeypatch.setenv("RECSYS_PROFILE_PATH", str(tmp_path))
    path = write(tmp_path, dict(ci_raw(), name="other"), "mine.yaml")
    with pytest.raises(ProfileError) as info:
        load_profile("mine")
    assert str(info.value) == (f"{path}: name: 'other' differs from the file name 'mine.yaml' "
                               "(profiles on the search path are named by their file)")
    assert load_profile(str(path)).name == "other"


def test_malformed_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "scheduler: slurm\nnode:\n  gpus: [1, 2\n  sockets: 1\n")
    message = error_of(path)
    assert message.startswith(f"{path}: line 4: malformed YAML: ")


def test_top_level_must_be_a_mapping(tmp_path):
    path = write(tmp_path, "- a\n- b\n")
    assert error_of(path) == f"{path}: top level: must be a mapping, got list"


def test_unknown_profile_and_unknown_node_reference(tmp_path):
    with pytest.raises(ProfileError) as info:
        load_profile("nonexistent")
    assert str(info.value).startswith("--profile: unknown profile 'nonexistent' (known: ci, dgx1")
    path = write(tmp_path, dict(ci_raw(), node="no-such-node"))
    assert error_of(path).startswith(f"{path}: node: unknown profile 'no-such-node' (known: ")
    missing = tmp_path / "missing.yaml"
    assert error_of(missing) == f"{missing}: file: no such profile file"


def test_profile_error_is_a_value_error_and_fails_a_fresh_interpreter(tmp_path):
    assert issubclass(ProfileError, ValueError)
    path = write(tmp_path, dict(ci_raw(), max_nodes="x"))
    proc = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom jobs.profiles import load_profile, ProfileError\n"
         "try:\n    load_profile(sys.argv[1])\nexcept ProfileError as e:\n"
         "    print(e, file=sys.stderr); sys.exit(1)\n", str(path)],
        capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.returncode == 1
    assert proc.stderr == f"{path}: max_nodes: must be an integer, got string\n"


def test_cli_validate_and_show_report_the_profile_error(tmp_path):
    bad = write(tmp_path, dict(ci_raw(), node=dict(ci_raw()["node"], gpu_cores=[[0], [0]])))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, HOME=str(tmp_path / "home"))
    for args, rc in ((["profiles", "validate", str(bad)], 2), (["profiles", "show", str(bad)], 2)):
        proc = subprocess.run([sys.executable, "-m", "jobs.cli", *args], capture_output=True,
                              text=True, cwd=repo, env=env, timeout=60)
        assert proc.returncode == rc
        assert proc.stderr.strip().splitlines() == [
            f"recsys-submit: error: {bad}: node.gpu_cores[1]: core 0 is also in the core set of GPU 0"]
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "profiles", "validate"], capture_output=True,
                          text=True, cwd=repo, env=env, timeout=60)
    assert proc.returncode == 0 and proc.stdout.count("ok ") == len(BUILTINS)


def test_validate_prints_every_problem_of_a_file_one_line_each(tmp_path):
    """Issue 15 item 10: all problems of a file, each `<file>: <key>: <problem>`, exit 2; a good
    file beside it still says ok; load_profile raises the first, carrying them all."""
    node = dict(ci_raw()["node"], colour="blue", gpu_numa=[0, 7])
    bad = write(tmp_path, dict(ci_raw(), bogus_key=1, max_nodes="x", default_time="forever", node=node,
                               env={"bad name": 1}, defaults={"binding": "sideways"},
                               sbatch_extra=["--ok", "nodash"]))
    want = [f"{bad}: bogus_key: unknown key",
            f"{bad}: node.colour: unknown key",
            f"{bad}: node.gpu_numa[1]: NUMA node 7 does not exist",
            f"{bad}: max_nodes: must be an integer, got string",
            f"{bad}: default_time: 'forever' is not a Slurm time limit",
            f"{bad}: env.bad name: not a valid environment variable name",
            f"{bad}: sbatch_extra[1]: must be a long option",
            f"{bad}: defaults.binding: must be one of exclusive, numa, interleave, off, got 'sideways'"]
    with pytest.raises(ProfileError) as info:
        load_profile(str(bad))
    assert [str(p) for p in info.value.problems][0] == str(info.value)
    assert sorted(str(p).split(": ")[1] for p in info.value.problems) == sorted(w.split(": ")[1] for w in want)
    good = builtin_dir() / "ci.yaml"
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "profiles", "validate", str(bad), str(good)],
                          capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 2
    assert proc.stdout == f"ok      {good}\n"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == len(want), lines
    for line in lines:
        assert line.startswith(f"recsys-submit: error: {bad}: ") and "\n" not in line
    for needle in want:
        assert sum(needle in line for line in lines) == 1, (needle, lines)


# ------------------------------------------------------------------ the search path

def test_user_dir_and_env_path_add_and_override(tmp_path, monkeypatch):
    user = tmp_path / "home/.config/recsys-submit/profiles"
    user.mkdir(parents=True)
    mine = dict(ci_raw(), description="my cluster", partition="gpu")
    write(user, mine, "mycluster.yaml")
    write(user, dict(ci_raw(), description="user ci", partition="long"), "ci.yaml")
    refs = {r.name: r for r in list_profiles()}
    assert refs["mycluster"].source == "user" and refs["ci"].source == "user"
    assert load_profile("ci").partition == "long"

    env_a, env_b = tmp_path / "a", tmp_path / "b"
    env_a.mkdir(), env_b.mkdir()
    write(env_a, dict(ci_raw(), partition="from-a"), "ci.yaml")
    write(env_b, dict(ci_raw(), partition="from-b"), "ci.yaml")
    monkeypatch.setenv("RECSYS_PROFILE_PATH", os.pathsep.join([str(env_a), str(env_b)]))
    refs = {r.name: r for r in list_profiles()}
    assert refs["ci"].source == "env" and refs["ci"].path == str(env_b / "ci.yaml")
    assert load_profile("ci").partition == "from-b"
    assert load_profile("mycluster").partition == "gpu"
    assert load_profile(str(env_a / "ci.yaml")).partition == "from-a"


def test_extends_and_node_reference_share_definitions(tmp_path, monkeypatch):
    monkeypatch.setenv("RECSYS_PROFILE_PATH", str(tmp_path))
    write(tmp_path, {"extends": "dgxa100-pod", "account": "proj42", "max_nodes": 8,
                     "env": {"NCCL_DEBUG": "INFO"}}, "site.yaml")
    site = load_profile("site")
    pod = load_profile("dgxa100-pod")
    assert site.name == "site" and site.account == "proj42" and site.max_nodes == 8
    assert site.node == pod.node and site.container == pod.container
    assert site.env == dict(pod.env, NCCL_DEBUG="INFO")
    write(tmp_path, {"extends": "loop-b", "node": "dgx1"}, "loop-a.yaml")
    write(tmp_path, {"extends": "loop-a", "node": "dgx1"}, "loop-b.yaml")
    with pytest.raises(ProfileError) as info:
        load_profile("loop-a")
    assert str(info.value) == f"{tmp_path / 'loop-a.yaml'}: extends: cycle: loop-a -> loop-b -> loop-a"


@pytest.mark.parametrize("name", BUILTINS)
def test_as_dict_loads_back_as_the_same_profile(tmp_path, name):
    profile = load_profile(name)
    if name == "local" and sorted(os.sched_getaffinity(0)) != list(range(len(os.sched_getaffinity(0)))):
        pytest.skip("this process may not use CPUs 0..n-1: the detected node is not a full topology")
    data = profile.as_dict()
    assert data.pop("path") == profile.path
    path = write(tmp_path, data, f"{name}.yaml")
    again = load_profile(str(path))
    assert again.node == profile.node and again.env == profile.env
    assert {k: v for k, v in vars(again).items() if k != "path"} == \
        {k: v for k, v in vars(profile).items() if k != "path"}


def test_content_sha256_is_stable_and_follows_the_content(tmp_path):
    """The hash a job exports as RECSYS_JOB_PROFILE_SHA256: equal for the same content, loaded again, in
    another process or from another file; different when a value changes."""
    digest = load_profile("ci").content_sha256()
    assert len(digest) == 64 and load_profile("ci").content_sha256() == digest
    (tmp_path / "copy").mkdir()
    assert load_profile(str(write(tmp_path / "copy", ci_raw(), "ci.yaml"))).content_sha256() == digest
    proc = subprocess.run(
        [sys.executable, "-c", "from jobs.profiles import load_profile\nprint(load_profile('ci').content_sha256())"],
        capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.stdout.strip() == digest, proc.stderr
    changed = dict(ci_raw(), default_time="00:20:00")
    assert load_profile(str(write(tmp_path, changed, "ci.yaml"))).content_sha256() != digest
    env = dict(ci_raw(), env=dict(ci_raw()["env"], OMPI_MCA_btl="self,vader"))
    assert load_profile(str(write(tmp_path, env, "ci.yaml"))).content_sha256() != digest


def test_profile_that_is_not_utf8_is_one_line_exit_2_for_every_use(tmp_path):
    """Defect 4: invalid UTF-8 gave a traceback everywhere but `profiles validate`."""
    text = yaml.safe_dump(dict(ci_raw(), description="CAFE")).encode()
    offset = text.index(b"CAFE") + 3
    bad = tmp_path / "sites" / "latin1.yaml"
    bad.parent.mkdir()
    bad.write_bytes(text[:offset] + b"\xc9" + text[offset + 1:])    # 'CAFÉ' in Latin-1
    line = text[:offset].count(b"\n") + 1
    expected = (f"recsys-submit: error: {bad}: line {line}: not UTF-8 text "
                f"(byte 0xc9 at offset {offset})")
    child = write(tmp_path, {"extends": str(bad), "partition": "x"}, "child.yaml")
    runs = tmp_path / "runs"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, HOME=str(tmp_path / "home"), RECSYS_PROFILE_PATH=str(bad.parent),
               RECSYS_RUNS_DIR=str(runs))
    uses = [
        (["train", "--profile", str(bad), "--model", "dlrm", "--runs-dir", str(runs)], {}),
        (["train", "--profile", "latin1", "--model", "dlrm"], {}),                 # by name
        (["train", "--model", "dlrm", "--dry-run"], {"RECSYS_PROFILE": str(bad)}),  # by env default
        (["render", "train", "--profile", str(child), "--model", "dlrm"], {}),     # through extends
        (["preprocess", "--profile", str(bad), "--dataset", "criteo", "--input", str(tmp_path),
          "--output", str(tmp_path / "out")], {}),
        (["profiles", "show", str(bad)], {}),
    ]
    for args, extra in uses:
        proc = subprocess.run([sys.executable, "-m", "jobs.cli", *args], capture_output=True, text=True,
                              cwd=repo, env=dict(env, **extra), timeout=60)
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [expected]), (args, proc.stderr)
        assert not runs.exists(), args
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "profiles", "validate", str(bad)],
                          capture_output=True, text=True, cwd=repo, env=env, timeout=60)
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [expected])
    listed = subprocess.run([sys.executable, "-m", "jobs.cli", "profiles", "list"], capture_output=True,
                            text=True, cwd=repo, env=env, timeout=60)
    assert listed.returncode == 0
    assert f"latin1         env      INVALID: {expected.split('error: ', 1)[1]}" in listed.stdout.splitlines()
