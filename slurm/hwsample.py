"""The hardware sampler: one process per node of a job, about one sample a second, so that a slow
point can be told apart from a starved one (issue 35, item 5).

Each sample holds the CPU use of the job's CPUs on the node (/proc/stat deltas; per local rank
when the binding tables of slurm/bind.sh are set, RECSYS_BIND_CPUS), the node's memory in use
(/proc/meminfo), the network bytes per second (InfiniBand port counters under
/sys/class/infiniband when present, else the interfaces' counters of /proc/net/dev, loopback
apart), and on GPU nodes one `nvidia-smi --query-gpu` row per GPU (utilisation, memory, power,
SM clock and the default application clock, the base a clock is compared with).

A sick node keeps being sampled (issue 47, item 3): each nvidia-smi call has a bounded wait
(GPU_TIMEOUT_S, then a kill), a call that fails or hangs is recorded in that sample's
`gpu_error` and the next sample asks again, a GPU row whose fields say "[GPU requires reset]"
(fallen off the bus) is kept with its `error` beside the healthy GPUs' rows, and while a killed
call is still alive (hung in the kernel, where a kill waits) no second one is started. Only a node
without nvidia-smi at all is not asked again.

The CPUs measured are the job's on the node (issue 47, item 4): the cpuset of the job's cgroup
(Slurm's task/cgroup confines this sampler's own step to one CPU, so its affinity would show only
that one), else this process's affinity. Busy % is /proc/stat's, which counts every process on
those CPUs: on a node shared with other jobs whose CPUs are not fenced off by a cpuset, their work
counts too.

The batch script (slurm/job.sbatch.tmpl) starts it with one srun task per node beside the step
and ends it (SIGUSR1, which srun forwards) after the step; it writes `<out>/<host>.json` through a temporary file and
a rename every few samples and at the end, so a reader never sees a half-written file. A study
report keeps the samples inside a point's timed steps (the engine log's first step to its
summary) and shows their medians (jobs.study.analysis.report). Standard library only: `slurm/` is a leaf
that the engines and the submission layer may both use (setup.cfg).

Run by hand: `python3 slurm/hwsample.py --out DIR [--interval 1] [--once]`.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

if not __package__:         # run as a script (the batch script: python3 slurm/hwsample.py): the checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from slurm.common import atomicfile  # noqa: E402
from slurm.common.cpulist import parse_cpulist  # noqa: E402

VERSION = 1
# what nvidia-smi is asked, in this order (`--format=csv`: a header naming each field with its unit)
GPU_QUERY = ("index", "name", "utilization.gpu", "memory.used", "memory.total", "power.draw", "clocks.sm",
             "clocks.default_applications.graphics")
# header names nvidia-smi prints (unit stripped) -> the sample's keys; `clocks.sm` prints as clocks.current.sm
GPU_FIELDS = {"index": "index", "name": "name", "utilization.gpu": "util_pct", "memory.used": "mem_used_mib",
              "memory.total": "mem_total_mib", "power.draw": "power_w", "clocks.current.sm": "sm_mhz",
              "clocks.sm": "sm_mhz", "clocks.default_applications.graphics": "base_mhz",
              "clocks.default_applications.gr": "base_mhz"}
FLUSH_EVERY = 5          # samples between rewrites of the node's file
GPU_TIMEOUT_S = 5.0      # the longest one nvidia-smi call may take before it is killed and recorded as hung
# what nvidia-smi prints in a field it could not read; "[N/A]" and "[Not Supported]" are a healthy GPU's
HEALTHY_MARKS = ("[N/A]", "[Not Supported]")


def gpu_command():
    return ["nvidia-smi", "--query-gpu=" + ",".join(GPU_QUERY), "--format=csv"]


def _value(text):
    """'87 %', '40536 MiB', '312.45 W', '1410 MHz', '3' -> a number; '[N/A]', '[Not Supported]' -> None."""
    text = text.strip()
    if not text or text.startswith("["):
        return None
    number = text.split()[0]
    try:
        return int(number) if number.lstrip("-").isdigit() else float(number)
    except ValueError:
        return text         # a name
    

def parse_gpu_csv(text):
    """[{index, name, util_pct, mem_used_mib, mem_total_mib, power_w, sm_mhz, base_mhz}] of
    `nvidia-smi --query-gpu=... --format=csv` output (header line first); fields nvidia-smi could
    not give are None. ValueError when the text is not such output."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = [h.strip().split(" [")[0] for h in lines[0].split(",")]
    if "index" not in header:
        raise ValueError(f"not nvidia-smi --format=csv output (header {lines[0][:80]!r})")
    out = []
    for line in lines[1:]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(header):
            raise ValueError(f"nvidia-smi row has {len(cells)} fields for {len(header)} columns: {line[:80]!r}")
        row = {}
        for name, cell in zip(header, cells):
            key = GPU_FIELDS.get(name)
            if key:
                row[key] = cell if key == "name" else _value(cell)
        out.append(row)
    return out


def _cells(header, cells):
    """One GPU's row of nvidia-smi's cells; with `error` when a field says the GPU is sick."""
    row = {}
    for name, cell in zip(header, cells):
        key = GPU_FIELDS.get(name)
        if key:
            row[key] = cell if key == "name" else _value(cell)
    sick = [c for c in cells if (c.startswith("[") and c not in HEALTHY_MARKS) or c.startswith("ERR!")]
    if sick:
        row["error"] = sick[0]
        if not isinstance(row.get("index"), int):
            row["index"] = None
        if isinstance(row.get("name"), str) and row["name"].startswith("["):
            row["name"] = None
    return row


def parse_gpu_output(text):
    """(rows, problems) of what one nvidia-smi call printed, however broken: the rows that parse
    (a sick GPU's with its `error`), and each line that is not a row (no header: "No devices were
    found"; "Unable to determine the device handle for GPU ...") as a problem."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    at = next((k for k, line in enumerate(lines)
               if "index" in [h.strip().split(" [")[0] for h in line.split(",")]), None)
    if at is None:
        return [], lines[:3] or ["no output"]
    header = [h.strip().split(" [")[0] for h in lines[at].split(",")]
    rows, problems = [], lines[:at]
    for line in lines[at + 1:]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(header):
            rows.append(_cells(header, cells))
        else:
            problems.append(line)
    return rows, problems


class GpuReader:
    """nvidia-smi asked once a sample with a bounded wait, so that a call hung in the kernel costs
    one sample's GPU rows, not the sampler (nor the batch script's end, which waits for it)."""

    def __init__(self, command=None, timeout=GPU_TIMEOUT_S):
        self.command = command or gpu_command()
        self.timeout = float(timeout)
        self.absent = False          # no nvidia-smi on this node: not asked again
        self._hung = None            # (Popen, since) of a killed call that has not exited yet

    def read(self):
        """(rows, error): the GPUs' rows now (None when the node has no nvidia-smi) and a one-line
        error of this call (None when it answered cleanly)."""
        if self._hung is not None:
            proc, since = self._hung
            if proc.poll() is None:
                return [], (f"nvidia-smi (pid {proc.pid}) still hung after {time.monotonic() - since:.0f} s; "
                            "not asked again until it exits")
            self._hung = None
        try:
            proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
        except FileNotFoundError:
            self.absent = True
            return None, None
        except OSError as exc:
            return [], f"nvidia-smi did not start: {exc}"
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            try:
                proc.kill()
            except OSError:
                pass
            for pipe in (proc.stdout, proc.stderr):
                try:
                    pipe.close()
                except OSError:
                    pass
            try:
                proc.wait(timeout=0.5)                # a killable call is gone in a moment
            except subprocess.TimeoutExpired:
                self._hung = (proc, time.monotonic())  # hung in the kernel: reaped by poll() once it exits
            return [], f"nvidia-smi gave no answer in {self.timeout:g} s (killed; a GPU or the driver hung)"
        rows, problems = parse_gpu_output(out)
        if proc.returncode != 0:
            said = (err.strip().splitlines() or problems or [""])[0]
            problems = [f"nvidia-smi exit {proc.returncode}: {said}".rstrip(": ")] + \
                [p for p in problems if p != said]
        problems += [f"GPU {r['index'] if r.get('index') is not None else '?'}: {r['error']}"
                     for r in rows if r.get("error")]
        return rows, ("; ".join(dict.fromkeys(problems))[:500] or None)


def read_cpu_times(path="/proc/stat"):
    """{cpu: (busy, total)} jiffies of every CPU."""
    out = {}
    with open(path) as handle:
        for line in handle:
            if line.startswith("cpu") and line[3:4].isdigit():
                parts = line.split()
                values = [int(v) for v in parts[1:]]
                idle = values[3] + (values[4] if len(values) > 4 else 0)       # idle + iowait
                total = sum(values[:8])                                      # guest is inside user
                out[int(parts[0][3:])] = (total - idle, total)
    return out


def cpu_busy(before, after, cpus):
    """{cpu: busy %} between two read_cpu_times, for `cpus`."""
    out = {}
    for cpu in cpus:
        if cpu in before and cpu in after:
            busy, total = after[cpu][0] - before[cpu][0], after[cpu][1] - before[cpu][1]
            out[cpu] = round(100.0 * busy / total, 1) if total > 0 else 0.0
    return out


def read_memory(path="/proc/meminfo"):
    """(used GiB, total GiB) of the node: MemTotal - MemAvailable."""
    values = {}
    with open(path) as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                values[key] = int(rest.split()[0]) * 1024
    total = values.get("MemTotal", 0)
    return round((total - values.get("MemAvailable", total)) / 2**30, 3), round(total / 2**30, 3)


def read_network(ib_root="/sys/class/infiniband", dev_path="/proc/net/dev"):
    """(source, {port or interface: (rx bytes, tx bytes)}): InfiniBand port counters when the node
    has them (port_rcv_data / port_xmit_data count 4-byte words), else /proc/net/dev without lo."""
    counters = {}
    if os.path.isdir(ib_root):
        for device in sorted(os.listdir(ib_root)):
            ports = os.path.join(ib_root, device, "ports")
            for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
                base = os.path.join(ports, port, "counters")
                try:
                    with open(os.path.join(base, "port_rcv_data")) as rx, \
                            open(os.path.join(base, "port_xmit_data")) as tx:
                        counters[f"{device}/{port}"] = (4 * int(rx.read()), 4 * int(tx.read()))
                except (OSError, ValueError):
                    continue
        if counters:
            return "infiniband", counters
    with open(dev_path) as handle:
        for line in handle.readlines()[2:]:
            name, _, rest = line.partition(":")
            fields = rest.split()
            if name.strip() != "lo" and len(fields) >= 9:
                counters[name.strip()] = (int(fields[0]), int(fields[8]))
    return "net", counters


def rank_cpus(environ=None):
    """[[cpu, ...] per local rank] from slurm/bind.sh's table (RECSYS_BIND_CPUS, one list per GPU),
    or [] when the job is not bound by it."""
    environ = os.environ if environ is None else environ
    table = environ.get("RECSYS_BIND_CPUS", "")
    out = []
    for part in table.split(";") if table else []:
        try:
            out.append(parse_cpulist(part))
        except ValueError:
            return []
    return out


def job_cpus(job_id=None, proc_cgroup="/proc/self/cgroup", root="/sys/fs/cgroup"):
    """(cpus, source): the CPUs of the job on this node from its cgroup's cpuset (cgroup v2
    `cpuset.cpus.effective`, v1 `cpuset.effective_cpus`/`cpuset.cpus` of the `job_<id>` level
    above this step), else this process's affinity (no Slurm job, no cpuset controller)."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    try:
        with open(proc_cgroup) as handle:
            lines = handle.read().splitlines()
    except OSError:
        lines = []
    for line in lines if job_id else []:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        parts = path.strip().split("/")
        if f"job_{job_id}" not in parts:
            continue
        job_dir = "/".join(parts[:parts.index(f"job_{job_id}") + 1]).lstrip("/")
        if controllers == "":
            candidates = [os.path.join(root, job_dir, "cpuset.cpus.effective")]
        elif "cpuset" in controllers.split(","):
            candidates = [os.path.join(root, "cpuset", job_dir, name) for name in ("cpuset.effective_cpus", "cpuset.cpus")]
        else:
            continue
        for candidate in candidates:
            try:
                with open(candidate) as handle:
                    cpus = parse_cpulist(handle.read().strip())
            except (OSError, ValueError):
                continue
            if cpus:
                return cpus, f"job cgroup ({candidate})"
    return sorted(os.sched_getaffinity(0)), "affinity"


class Sampler:
    """Samples of one node, written to `<out>/<host>.json`."""

    def __init__(self, out, interval=1.0, host=None, gpus=True, gpu_timeout=GPU_TIMEOUT_S):
        self.out, self.interval = out, float(interval)
        # the node as Slurm names it (its node list), else the host name
        self.host = host or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        self.path = os.path.join(out, f"{self.host}.json")
        self.cpus, self.cpus_source = job_cpus()
        self.ranks = rank_cpus()
        self.gpus = GpuReader(timeout=gpu_timeout) if gpus is True else (gpus or None)
        self.samples = []
        self._cpu, self._net, self._t = read_cpu_times(), read_network(), time.time()

    def sample(self):
        """One sample (the rates since the previous one), appended."""
        now, cpu, net = time.time(), read_cpu_times(), read_network()
        busy = cpu_busy(self._cpu, cpu, self.cpus)
        seconds = max(now - self._t, 1e-6)
        source, counters = net
        before = self._net[1] if self._net[0] == source else {}
        rx = sum(max(0, c[0] - before[k][0]) for k, c in counters.items() if k in before) / seconds
        tx = sum(max(0, c[1] - before[k][1]) for k, c in counters.items() if k in before) / seconds
        used, total = read_memory()
        record = {"t": round(now, 3), "cpu_busy_pct": round(sum(busy.values()) / len(busy), 1) if busy else None,
                  "rank_cpu_busy_pct": [round(sum(busy.get(c, 0.0) for c in cpus) / len(cpus), 1)
                                        for cpus in self.ranks if cpus],
                  "mem_used_gib": used, "mem_total_gib": total,
                  "net_source": source, "net_rx_bytes_per_s": round(rx), "net_tx_bytes_per_s": round(tx)}
        if self.gpus is not None and not self.gpus.absent:
            gpus, error = self.gpus.read()
            if gpus is not None:
                record["gpus"] = gpus       # the GPUs that answered (a sick one with its `error`)
            if error:
                record["gpu_error"] = error
        self._cpu, self._net, self._t = cpu, net, now
        self.samples.append(record)
        return record

    def write(self):
        """The node's file, whole: a temporary in the same directory, then a rename."""
        os.makedirs(self.out, exist_ok=True)
        body = {"version": VERSION, "host": self.host, "interval_s": self.interval, "cpus": self.cpus,
                "cpus_source": self.cpus_source, "rank_cpus": self.ranks, "gpu_query": list(GPU_QUERY), "samples": self.samples}
        atomicfile.write(self.path, json.dumps(body))     # the tree's one temporary-file scheme

    def run(self, once=False):
        stop = []
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):     # USR1: what srun passes on
            signal.signal(sig, lambda *_: stop.append(1))
        next_at = time.monotonic() + self.interval
        while not stop:
            time.sleep(max(0.0, next_at - time.monotonic()))
            if stop:
                break
            next_at += self.interval
            self.sample()
            if once or len(self.samples) % FLUSH_EVERY == 0:
                self.write()
            if once:
                return
        self.write()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="slurm/hwsample.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory of the per-node sample files")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--once", action="store_true", help="one sample, written, then exit")
    parser.add_argument("--gpu-timeout", type=float, default=GPU_TIMEOUT_S,
                        help=f"seconds one nvidia-smi call may take before it is killed (default {GPU_TIMEOUT_S:g})")
    args = parser.parse_args(argv)
    if not args.interval > 0:
        parser.error(f"--interval must be > 0, got {args.interval}")
    if not args.gpu_timeout > 0:
        parser.error(f"--gpu-timeout must be > 0, got {args.gpu_timeout}")
    Sampler(args.out, args.interval, gpu_timeout=args.gpu_timeout).run(once=args.once)
    return 0


if __name__ == "__main__":
    sys.exit(main())
