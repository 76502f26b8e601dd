"""A node screen (`recsys-submit study screen`): the same one-node benchmark on every node of one
allocation at once, a per-node table, and the nodes more than a margin below the median flagged
as an `--exclude=` line the user passes on to the study's allocation.

The benchmark is a study point (jobs.study.spec: the engine's benchmark mode, a small fixed
model, one node of the profile's GPUs) rendered as study points are; the allocation runs one copy
of it per node, all at once (slurm/study-allocation.sbatch.tmpl, `concurrent`), each copy in
its own run directory under nodes/ so every node keeps its own engine log. A node whose copy
never started is unknown, never failed or flagged.

Test hook: RECSYS_TEST_SLOW_NODE=<node> at submission wraps every rank in slurm/screen-rank.sh,
which gives that node's rank an eighth of its CPU time from its first step on: a node slowed on
purpose, so a test can check the screen flags it; every rank is held after its first step until
all nodes' ranks reached theirs, so the emulated nodes, which share one host's cores, measure at
the same time (docs/studies.md, "Pod workflow").
"""

import dataclasses
import json
import os
import statistics
import time

from jobs import states
from jobs.errors import RequestError
from jobs.planning.argv import SlurmHelper
from jobs.planning.plan import plan
from jobs.planning.request import slug
from jobs.polling import poll_until
from jobs.runs import enginelog, rundir
from jobs.runs.atomic import write_group, write_text
from jobs.runs.records import SUBMITTED, JobRecord, RequestRecord, RunRecord
from jobs.schedulers import backend_for
from jobs.status import poll_many
from jobs.submit import load

from ..measures import BREAKDOWN, BREAKDOWN_PHASES, fmt_number, read_breakdown
from ..spec import expand, spec_from_flags
from . import allocation
from . import network_screen as netscreen
from .run import point_request

SCREEN_VERSION = 1
KEY = "screen"
MODEL, STEPS, WARMUP_STEPS, BREAKDOWN_STEPS, MARGIN = "ncf", 100, 10, 10, 0.1
# the fixed small model of the default screen (override with engine arguments after `--`)
ENGINE_ARGS = {"ncf": ["--factors", "16", "--layers", "64,32,16"]}
SLOW_NODE_ENV = "RECSYS_TEST_SLOW_NODE"
SLOW_ENV = (SLOW_NODE_ENV, "RECSYS_TEST_SLOW_RUN_MS", "RECSYS_TEST_SLOW_PERIOD_MS")
SYNC_ENV = "RECSYS_TEST_SYNC_COUNT"
OK, FLAGGED, FAILED, UNKNOWN = "ok", "slow", "failed", "unknown"


def _nodes(profile, nodes, nodelist):
    """(node count, nodelist or None), refused in one line naming the flag."""
    if (nodes is None) == (nodelist is None):
        raise RequestError("screen: give --nodes N or --nodelist L (the nodes to screen)")
    if nodelist is not None:
        nodelist, hosts = allocation.check_hostlist("--nodelist", nodelist)
        nodes = len(hosts)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 2:
        raise RequestError(f"--nodes: a screen compares nodes with their median: give 2 or more, got {nodes!r}")
    if nodes > profile.max_nodes:
        raise RequestError(f"--nodes: {nodes} nodes, profile {profile.name} has max_nodes {profile.max_nodes}")
    return nodes, nodelist


def _check_margin(margin):
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin < 1:
        raise RequestError(f"--margin: a fraction between 0 and 1 (0.1: flag nodes more than 10% below the "
                           f"median), got {margin!r}")
    return float(margin)


def benchmark_point(profile, model=MODEL, gpus=None, steps=STEPS, warmup_steps=WARMUP_STEPS,
                    breakdown_steps=BREAKDOWN_STEPS, engine_args=None):
    """(StudySpec, Point) of the one-node benchmark: a weak-scaling study point of `gpus` GPUs
    (default: the node's), checked against the profile and the engine as a study's are."""
    per_node = profile.node.gpus or profile.node.sockets * profile.node.cores_per_socket * profile.node.threads_per_core
    gpus = per_node if gpus is None else gpus
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= per_node:
        raise RequestError(f"--gpus: the GPUs of one node to use, 1 to {per_node} on profile {profile.name}, "
                           f"got {gpus!r}")
    args = list(ENGINE_ARGS.get(model, [])) if engine_args is None else list(engine_args)
    spec = spec_from_flags(model, str(gpus), scaling="weak", warmup_steps=warmup_steps, steps=steps,
                           breakdown_steps=breakdown_steps, name="screen", engine_args=args)
    points = expand(spec, profile)
    return spec, points[0]


def _slot_specs(spec, point, profile, count):
    """The benchmark's JobSpec, one per node (the test hook's wrapper and env when it is set)."""
    resolved, specs = plan([point_request(point, spec, profile)], profile, submitting=True)
    job = dataclasses.replace(specs[0], requeue=False)
    hook = {k: os.environ[k] for k in SLOW_ENV if os.environ.get(k)}
    if hook.get(SLOW_NODE_ENV):
        hook[SYNC_ENV] = str(count)     # the emulated nodes share cores: every rank steps at once
        job = dataclasses.replace(job, command=["bash", SlurmHelper("screen-rank.sh"), "--", *job.command],
                                  env=dict(job.env, **hook))
    return resolved, [dataclasses.replace(job, name=slug(f"screen-{i + 1}")) for i in range(count)], hook


@dataclasses.dataclass
class ScreenPlan:
    """Everything a screen submits, checked before anything exists."""

    profile: object
    count: int
    nodelist: object
    margin: float
    spec: object
    point: object
    resolved: list
    slots: list             # one benchmark JobSpec per node
    alloc: object           # the allocation's JobSpec
    hook: dict              # the test hook's env (empty: none)
    network: object = None  # network_screen.NetworkPlan (`--network`), else None

    def drafts(self, backend, screen_dir, slot_dirs, network_slots=()):
        """(the allocation's draft, [each node's draft, then each network slot's]): every node's
        copy at once; with `--network`, then the node pairs in rounds, then the whole set."""
        points = list(zip(self.slots, slot_dirs))
        if not network_slots:
            return backend.allocation(self.alloc, points, screen_dir, concurrent=True, nodelist=self.nodelist)
        rounds = [[(i, [i]) for i in range(len(points))]] + netscreen.schedule(len(points), network_slots)
        points += [(s["spec"], s["dir"]) for s in network_slots]
        return backend.allocation(self.alloc, points, screen_dir, nodelist=self.nodelist, schedule=rounds)


def plan_screen(profile, nodes=None, nodelist=None, margin=MARGIN, network=False, network_sizes=None,
                network_iters=None, network_time=None, **benchmark):
    """A ScreenPlan; RequestError (one line naming the flag) on bad input. `network`: the node
    pairs and the whole set too (jobs.study.network_screen)."""
    profile = load(profile)
    if profile.scheduler != "slurm":
        raise RequestError(f"--profile: a screen runs in one Slurm allocation; profile {profile.name} "
                           f"schedules with {profile.scheduler}")
    count, nodelist = _nodes(profile, nodes, nodelist)
    margin = _check_margin(margin)
    spec, point = benchmark_point(profile, **benchmark)
    net = None
    if network:
        net = netscreen.check(count, point.gpus_per_node, network_sizes, network_iters, network_time)
    elif any(v is not None for v in (network_sizes, network_iters, network_time)):
        raise RequestError("--network-sizes/--network-iters/--network-time: settings of --network's checks; "
                           "add --network")
    resolved, slots, hook = _slot_specs(spec, point, profile, count)
    alloc = dataclasses.replace(slots[0], key=KEY, name=slug(f"screen-{profile.name}"),
                                subject="node screen" + (" and network" if net else ""), nodes=count,
                                time_seconds=slots[0].time_seconds + allocation.MARGIN_S + (net.seconds if net else 0),
                                command=list(slots[0].command), env={})
    return ScreenPlan(profile=profile, count=count, nodelist=nodelist, margin=margin, spec=spec, point=point,
                      resolved=resolved, slots=slots, alloc=alloc, hook=hook, network=net)


def submit(profile, nodes=None, nodelist=None, margin=MARGIN, runs_dir=None, log=None, **benchmark):
    """Submit the screen: one allocation of the nodes, the benchmark on each at once (with
    `network=True`, then every node pair and the whole set). Returns the screen's directory
    (<runs dir>/screen-<profile>-<time>: the allocation's run dir, with nodes/<slot>/ per node,
    network/pair-<i>-<j>/ and network/all/ with --network, and screen.json once `collect` wrote it)."""
    sp = plan_screen(profile, nodes, nodelist, margin, **benchmark)
    profile, count, spec, point, resolved, slots, hook = \
        sp.profile, sp.count, sp.spec, sp.point, sp.resolved, sp.slots, sp.hook
    nodelist, margin = sp.nodelist, sp.margin
    backend = backend_for(profile)
    runs_dir = runs_dir or rundir.default_runs_dir(profile)
    rundir.check_free_space(rundir.check_runs_dir(runs_dir))
    group = (profile.defaults or {}).get("runs_group")
    screen_dir = rundir.new_run_dir(runs_dir, f"screen-{slug(profile.name)}", group=group)
    slot_dirs = []
    for i in range(count):
        path = os.path.join(screen_dir, "nodes", f"slot{i + 1}")
        rundir.make_private_dir(path, group, parents=True)
        os.mkdir(os.path.join(path, "logs"))
        slot_dirs.append(path)
    net_slots = netscreen.slots(profile, sp.network, screen_dir) if sp.network else []
    for slot in net_slots:
        rundir.make_private_dir(os.path.join(slot["dir"], "logs"), group, parents=True)
    alloc_draft, drafts = sp.drafts(backend, screen_dir, slot_dirs, net_slots)
    accounting = backend.accounting()

    def record(run_dir, key):
        return RunRecord(run_dir=run_dir, profile=profile.name, profile_path=profile.path,
                         scheduler=backend.scheduler, accounting=accounting, planned=[key])

    own = [[r.request.to_dict() for r in resolved]] * count + [s["requests"] for s in net_slots]
    for draft, requests in zip(drafts, own):
        RequestRecord(requests=requests, profile=profile.as_dict()).save(draft.run_dir)
        write_text(draft.script, draft.text)
    write_text(os.path.join(screen_dir, "screen-request.json"), json.dumps(
        {"version": SCREEN_VERSION, "profile": profile.name, "nodes": count, "nodelist": nodelist,
         "margin": margin, "model": spec.model, "gpus_per_node": point.gpus_per_node,
         "engine_args": spec.engine_args, "steps": spec.steps, "warmup_steps": spec.warmup_steps,
         "slots": slot_dirs, "test_hook": hook or None,
         "network": netscreen.request_record(sp.network, net_slots) if sp.network else None}, indent=2) + "\n")
    alloc_record = record(screen_dir, KEY)
    alloc_record.save()

    jobs = allocation.submit_recorded(backend, alloc_draft, alloc_record, "the screen's allocation",
                                      f" (screen dir {screen_dir})", log=log)
    for slot, draft in zip(slots + [s["spec"] for s in net_slots], drafts):
        run = record(draft.run_dir, slot.key)
        run.jobs = [JobRecord(key=slot.key, name=slot.name, job_id=jobs[0].job_id,
                              ntasks=slot.nodes * slot.ntasks_per_node,
                              script=draft.script, token=alloc_draft.token, submitted_at=jobs[0].submitted_at)]
        run.state = SUBMITTED
        run.save()
    if log:
        log(f"screen allocation job {jobs[0].job_id}: {count} node(s), the benchmark on each at once"
            + (f", then {len(sp.network.rounds)} round(s) of node pairs and the whole set" if sp.network else "")
            + f" (screen dir {screen_dir})")
    return screen_dir


def check_dir(screen_dir):
    """A screen directory (one that holds screen-request.json and jobs.json), else one line."""
    if not all(os.path.isfile(os.path.join(screen_dir, f)) for f in ("screen-request.json", "jobs.json")):
        raise RequestError(f"screen: {screen_dir!r} is not a screen directory (no screen-request.json and "
                           "jobs.json)")
    return os.path.abspath(screen_dir)


def wait(screen_dir, timeout=None, first=None, ceiling=None):
    """Poll the screen's allocation until Slurm reports it ended; its JobStatus."""
    def once():
        result = poll_many([screen_dir])[0]
        return result.jobs[0] if result.jobs else None

    return poll_until(once, lambda job: job is not None and job.state in states.TERMINAL,
                      first=first, ceiling=ceiling, timeout=timeout)


def _slot(run_dir, key, job):
    """One node's row from its run dir: the node, its state and the benchmark's figures."""
    seen = allocation.progress(run_dir, key, job.job_id)
    row = {"run_dir": run_dir, "node": seen.get("nodelist") or None, "state": UNKNOWN, "reason": None,
           "throughput": None, "step_time_ms": None, "breakdown": None, "vs_median": None}
    code = seen.get("exit_code", "").strip()
    if code == "0":
        summary = enginelog.summary(enginelog.job_logs(run_dir, key, [job.job_id]))
        value = enginelog.number(summary, enginelog.THROUGHPUT) if summary else None
        if value is None or value <= 0:
            row.update(state=FAILED, reason="exited 0 but its engine log has no throughput")
        else:
            row.update(state=OK, throughput=value, step_time_ms=enginelog.number(summary, "mean_step_time_ms"))
            split = read_breakdown(row["node"], summary.get(BREAKDOWN)) if isinstance(summary, dict) else None
            if split:
                row["breakdown"] = {p: v["ms"] for p, v in split["mean"]["phases"].items()}
    elif code:
        row.update(state=FAILED, reason=enginelog.failure_reason(run_dir, key, f"{states.FAILED} (exit {code})"))
    else:
        row["reason"] = (f"its benchmark did not finish in allocation job {job.job_id} ({job.state}); "
                         "whether the node is slow cannot be told")
    return row


def build(screen_dir, job, margin):
    """The screen as plain data (screen.json): one row per node, the median, the flagged nodes."""
    with open(os.path.join(screen_dir, "screen-request.json")) as handle:
        request = json.load(handle)
    rows = [_slot(d, "main", job) for d in request["slots"]]
    measured = [r["throughput"] for r in rows if r["state"] == OK]
    median = statistics.median(measured) if measured else None
    for row in rows:
        if row["throughput"] is not None and median:
            row["vs_median"] = row["throughput"] / median
            if row["throughput"] < (1.0 - margin) * median:
                row["state"] = FLAGGED
                row["reason"] = f"{(1.0 - row['vs_median']) * 100:.0f}% below the median"
    excluded = [r["node"] for r in rows if r["state"] in (FLAGGED, FAILED) and r["node"]]
    net = netscreen.build(request["network"], job, margin) if request.get("network") else None
    excluded += [n for n in (net["flagged"] if net else []) if n not in excluded]
    return {"version": SCREEN_VERSION, "screen_dir": screen_dir, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "profile": request["profile"], "job_id": job.job_id, "job_state": job.state, "margin": margin,
            "model": request["model"], "gpus_per_node": request["gpus_per_node"],
            "engine_args": request["engine_args"], "steps": request["steps"],
            "warmup_steps": request["warmup_steps"], "test_hook": request.get("test_hook"),
            "median_throughput": median, "nodes": rows, "network": net, "flagged": excluded,
            "exclude": f"--exclude={','.join(excluded)}" if excluded else None}


def markdown(screen):
    s = screen
    phases = [p for p in BREAKDOWN_PHASES if any((r["breakdown"] or {}).get(p) is not None for r in s["nodes"])]
    lines = [f"# Node screen on {s['profile']}: {len(s['nodes'])} node(s), job {s['job_id']}", "",
             f"- benchmark: {s['model']} {' '.join(s['engine_args'])}, {s['gpus_per_node']} GPU(s) per node, "
             f"{s['warmup_steps']} warm-up + {s['steps']} timed steps, every node at once; date: {s['date']}",
             f"- flagged: throughput more than {s['margin'] * 100:g}% below the median of the nodes "
             f"({fmt_number(s['median_throughput'])} samples/s)"]
    if s["test_hook"]:
        lines.append(f"- test hook: {s['test_hook'].get(SLOW_NODE_ENV)} slowed on purpose (slurm/screen-rank.sh)")
    lines += ["", "| node | state | throughput (samples/s) | step time (ms) | vs median | "
              + "".join(f"{p.replace('_', ' ')} (ms) | " for p in phases) + "note |",
              "|---|---|---:|---:|---:|" + "---:|" * len(phases) + "---|"]
    for row in s["nodes"]:
        cells = [row["node"] or "?", row["state"], fmt_number(row["throughput"]), fmt_number(row["step_time_ms"], 2),
                 fmt_number(row["vs_median"], 2)]
        cells += [fmt_number((row["breakdown"] or {}).get(p), 2) for p in phases]
        lines.append("| " + " | ".join(cells + [row["reason"] or ""]) + " |")
    if s.get("network"):
        lines += netscreen.markdown(s["network"], s["margin"])
    lines += ["", (f"Exclude them: `{s['exclude']}` (`recsys-submit study run SPEC --allocation {s['exclude']}`, "
                   "or any sbatch)") if s["exclude"] else "No node flagged."]
    return "\n".join(lines) + "\n"


def collect(screen_dir, job=None, margin=None):
    """Write screen.md and screen.json (one group) from the finished allocation; the screen dict."""
    if margin is None:
        with open(os.path.join(screen_dir, "screen-request.json")) as handle:
            margin = json.load(handle)["margin"]
    job = job or wait(screen_dir, timeout=0)
    if job is None:
        raise RequestError(f"screen: {screen_dir} holds no submitted allocation (jobs.json)")
    screen = build(screen_dir, job, margin)
    write_group({os.path.join(screen_dir, "screen.md"): markdown(screen),
                 os.path.join(screen_dir, "screen.json"): json.dumps(screen, indent=2) + "\n"})
    return screen
