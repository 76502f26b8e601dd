"""The hardware sampler: one process per node of a job, about one sample a second, so that a slow
point can be told apart from a starved one (issue 35, item 5).

Each sample holds the CPU use of the job's CPUs on the node (/proc/stat deltas; per local rank
when the binding tables of slurm/bind.sh are set, RECSYS_BIND_CPUS), the node's memory in use
(/proc/meminfo), the network bytes per second (InfiniBand port counters under
/sys/class/infiniband when present, else the interfaces' counters of /proc/net/dev, loopback
apart), and on GPU nodes one `nvidia-smi --query-gpu` row per GPU (utilisation, memory, power,
SM clock and the default application clock, the base a clock is compared with).

The batch script (slurm/job.sbatch.tmpl) starts it with one srun task per node beside the step
and ends it (SIGUSR1, which srun forwards) after the step; it writes `<out>/<host>.json` through a temporary file and
a rename every few samples and at the end, so a reader never sees a half-written file. A study
report keeps the samples inside a point's timed steps (the engine log's first step to its
summary) and shows their medians (jobs.study.report). Standard library only: `slurm/` is a leaf
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
import tempfile
import time

if not __package__:         # run as a script (the batch script: python3 slurm/hwsample.py): the checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from slurm.cpulist import parse_cpulist  # noqa: E402

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


def read_gpus():
    """The GPUs' rows now, or None when this node has no nvidia-smi (or it fails)."""
    try:
        proc = subprocess.run(gpu_command(), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        return parse_gpu_csv(proc.stdout)
    except ValueError:
        return None


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


class Sampler:
    """Samples of one node, written to `<out>/<host>.json`."""

    def __init__(self, out, interval=1.0, host=None, gpus=True):
        self.out, self.interval = out, float(interval)
        # the node as Slurm names it (its node list), else the host name
        self.host = host or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        self.path = os.path.join(out, f"{self.host}.json")
        self.cpus = sorted(os.sched_getaffinity(0))
        self.ranks = rank_cpus()
        self.gpus = gpus
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
        if self.gpus:
            gpus = read_gpus()
            if gpus is None:
                self.gpus = False           # no nvidia-smi here: not asked again
            else:
                record["gpus"] = gpus
        self._cpu, self._net, self._t = cpu, net, now
        self.samples.append(record)
        return record

    def write(self):
        """The node's file, whole: a temporary in the same directory, then a rename."""
        os.makedirs(self.out, exist_ok=True)
        body = {"version": VERSION, "host": self.host, "interval_s": self.interval, "cpus": self.cpus,
                "rank_cpus": self.ranks, "gpu_query": list(GPU_QUERY), "samples": self.samples}
        fd, tmp = tempfile.mkstemp(prefix=f".{self.host}.", suffix=".tmp", dir=self.out)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(body, handle)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

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
    args = parser.parse_args(argv)
    if not args.interval > 0:
        parser.error(f"--interval must be > 0, got {args.interval}")
    Sampler(args.out, args.interval).run(once=args.once)
    return 0


if __name__ == "__main__":
    sys.exit(main())
