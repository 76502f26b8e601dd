"""A JobSpec as a readable sbatch script (template: slurm/job.sbatch.tmpl).

Every value that comes from the user or a profile is shell-quoted where the shell reads it;
values in `#SBATCH` lines (read by sbatch, never by the shell) are limited to characters
sbatch passes through unchanged, or double-quoted, and refused otherwise.
"""

import os
import re
import shlex
import string

from jobs.errors import RequestError
from jobs.planning.argv import RunPath, SlurmHelper, slurm_dir
from jobs.planning.plan import rank_command
from jobs.planning.requeue import MAX_IDLE_REQUEUES
from jobs.profiles.binding import bind_env
from jobs.profiles.schema import defaults_env
from jobs.profiles.schema import has_control
from jobs.slurmtime import format_time

_SAFE_DIRECTIVE = re.compile(r"[A-Za-z0-9_./:%@,=+\-\[\]]+")    # fullmatch: `$` passes a final newline


class _Template(string.Template):
    delimiter = "@@"


def _template():
    path = os.path.join(slurm_dir(), "job.sbatch.tmpl")
    with open(path) as handle:
        return _Template(handle.read())


def directive_value(value, flag):
    """A value for an #SBATCH line: bare when inert, double-quoted when it has spaces or shell
    characters (sbatch strips the quotes, no shell ever sees it), refused if it cannot be quoted."""
    text = str(value)
    if _SAFE_DIRECTIVE.fullmatch(text):
        return text
    if any(c in text for c in '"\\\n\r'):
        raise RequestError(f"{flag}: {text!r} contains a quote, backslash or newline that sbatch cannot take")
    return f'"{text}"'


def dependency_string(spec, ids):
    """`afterok:1:2,afterany:3` from the spec's dependencies; `ids` maps plan keys to job ids
    (placeholders such as <dictionary> when rendering without submitting)."""
    ok = [ids.get(k, f"<{k}>") for k in spec.after_ok] + list(spec.external_after)
    anyof = [ids.get(k, f"<{k}>") for k in spec.after_any]
    parts = []
    if ok:
        parts.append("afterok:" + ":".join(str(i) for i in ok))
    if anyof:
        parts.append("afterany:" + ":".join(str(i) for i in anyof))
    return ",".join(parts)


def log_paths(spec, run_dir):
    """(batch output, per-rank output) file patterns of a spec, in the run's logs/ dir."""
    logs = os.path.join(run_dir, "logs")
    tag = "%A_%a" if spec.array else "%j"
    return (os.path.join(logs, f"{spec.key}-{tag}.out"),
            os.path.join(logs, f"{spec.key}-{tag}.rank%t.log"))


def check_run_dir(run_dir):
    """A run dir sbatch can take in --output/--error; refused naming --runs-dir (where it comes
    from), before any directory is created."""
    if any(c in str(run_dir) for c in '"\\\n\r'):
        raise RequestError(f"--runs-dir: {str(run_dir)!r} contains a quote, backslash or newline that "
                           "sbatch cannot take in the job log paths")


def directives(spec, run_dir, ids=None, token=None):
    """The `#SBATCH` lines of a spec, in a stable, readable order."""
    profile = spec.profile
    check_run_dir(run_dir)
    batch_out, _ = log_paths(spec, run_dir)
    lines = [
        ("--job-name", spec.singleton or spec.name),
        ("--nodes", spec.nodes),
        ("--ntasks-per-node", spec.ntasks_per_node),
    ]
    if spec.gpus_per_node:
        lines.append(("--gres", f"gpu:{spec.gpus_per_node}"))
    if (profile.defaults or {}).get("exclusive", True):
        # --exclusive gives the job every core but only the partition's default memory: --mem=0 gives
        # it the node's memory too (Slurm's "all the memory on each node")
        lines += [("--exclusive", None), ("--mem", "0")]
    lines.append(("--time", format_time(spec.time_seconds)))
    for flag, value in (("--partition", profile.partition), ("--account", profile.account),
                        ("--qos", profile.qos)):
        if value:
            lines.append((flag, value))
    lines += [("--output", batch_out), ("--error", batch_out), ("--open-mode", "append"),
              ("--signal", f"B:USR2@{spec.signal_seconds}")]
    if spec.requeue:
        lines.append(("--requeue", None))
    if spec.array:
        first, last, cap = spec.array
        lines.append(("--array", f"{first}-{last}" + (f"%{cap}" if cap else "")))
    dep = dependency_string(spec, ids or {})
    if spec.singleton:      # one job of this name (and user) at a time, whoever submitted it
        dep = ",".join(d for d in (dep, "singleton") if d)
    if dep:
        lines.append(("--dependency", dep))
    if token:
        lines.append(("--comment", f"recsys:{token}"))
    if profile.switches:
        lines.append(("--switches", profile.switches))
    from_profile = {"--partition": "partition", "--account": "account", "--qos": "qos",
                    "--switches": "switches"}
    out = []
    for flag, value in lines:
        what = f"profile {profile.name}: {from_profile[flag]}" if flag in from_profile else flag
        out.append(f"#SBATCH {flag}" if value is None else f"#SBATCH {flag}={directive_value(value, what)}")
    for extra in profile.sbatch_extra or []:
        if "\n" in extra:
            raise RequestError(f"profile {profile.name}: sbatch_extra: {extra!r} spans lines")
        out.append(f"#SBATCH {extra}")
    return out


def _exports(mapping):
    return "\n".join(f"export {k}={shlex.quote(str(v))}" for k, v in mapping.items()) or "# (none)"


def quote(arg):
    """Shell-quote one argument; only our own SlurmHelper paths keep $RECSYS_SLURM_DIR
    expandable, and RunPaths (the EngineLog, a chain's checkpoint dir) their $RECSYS_* variables
    (fixed in code, never user input)."""
    if isinstance(arg, RunPath):
        return f'"{arg}"'
    if isinstance(arg, SlurmHelper):
        return f'"$RECSYS_SLURM_DIR/{shlex.quote(arg.name)}"'
    return shlex.quote(str(arg))


def _quote_command(argv):
    return [quote(arg) for arg in argv]


# One container name per job, expanded when the job runs: every step of the job (its ranks, the
# preprocessing driver and daemons) and every requeue of it (Slurm keeps the job id; an array task
# has its own) finds the same named container instead of unpacking the image again. pyxis keeps
# named containers after the job (unless its plugstack sets container_scope=job): docs/submitting.md.
CONTAINER_NAME = "recsys-${SLURM_JOB_ID:-local}"


def job_env(spec):
    """The variables the script exports: the profile's hang and stall defaults, its `env:`, then the
    job's own (each later one wins). A study's frozen code is not among them: env_lines puts it in
    front of PYTHONPATH, as a plain job's checkout goes (issue 47, item 11)."""
    return {**defaults_env(spec.profile.defaults), **(spec.profile.env or {}), **spec.env}


def env_lines(spec):
    """The script's exports; a study's frozen copy (its engines) in front of whatever PYTHONPATH the
    job already has, never replacing it. In a container, slurm/container-entry.sh of that copy puts
    it in front of the image's PYTHONPATH, which is why it is not named in --container-env."""
    lines = _exports(job_env(spec))
    if spec.code_dir:
        lines += f'\nexport PYTHONPATH={shlex.quote(spec.code_dir)}"${{PYTHONPATH:+:$PYTHONPATH}}"'
    return lines


def _checkout():
    """This checkout (the parent of slurm/): mounted into a container and put on PYTHONPATH."""
    return os.path.dirname(slurm_dir())


def container_flags(spec, run_dir):
    """The pyxis srun flags of a container profile, each one shell word (already quoted).

    The steps run this checkout's code (bind.sh, the engines, preproc) and write into the run dir:
    both are mounted at their host paths, as is the profile's node-local `scratch`, and every step
    starts in the run dir (where its relative paths point). slurm/container-entry.sh puts the
    checkout in front of the image's PYTHONPATH inside the container. Every variable the
    profile's `env:` and the job set is named in --container-env, so that its value wins over the
    image's own (pyxis keeps an image's values over the host's for all other names)."""
    profile = spec.profile
    container = profile.container
    code = spec.code_dir or _checkout()
    run = os.path.abspath(run_dir)
    for what, path in (("--runs-dir", run), ("the checkout", code)):
        if "," in path or ":" in path:
            raise RequestError(f"{what}: {path!r} contains ',' or ':', which pyxis --container-mounts cannot take")
    mounts = list(container.mounts) + [f"{code}:{code}:ro", f"{run}:{run}"]
    if profile.scratch:
        mounts.append(f"{profile.scratch}:{profile.scratch}")
    for key, value in (("image", container.image), ("mounts", ",".join(mounts))):
        if any(c in value for c in "\n\r"):
            raise RequestError(f"profile {profile.name}: container.{key}: {value!r} spans lines")
    names = list(job_env(spec))
    flags = [shlex.quote(f"--container-image={container.image}"), f'"--container-name={CONTAINER_NAME}"',
             shlex.quote("--container-mounts=" + ",".join(mounts)),
             shlex.quote(f"--container-workdir={run}")]
    if names:
        flags.append(shlex.quote("--container-env=" + ",".join(names)))
    return flags


# What a step runs first inside the container (slurm/container-entry.sh): the checkout on PYTHONPATH
# in front of the image's own value, and no user site-packages.
CONTAINER_ENTRY = 'bash "$RECSYS_SLURM_DIR/container-entry.sh"'


def container_block(spec, run_dir):
    """The script's container section (empty without a container, so such scripts do not change):
    the pyxis flags as the array every srun of the script uses, and exported one a line as
    RECSYS_CONTAINER_SRUN_FLAGS for the slurm/ helpers (spark-standalone.sh, dask-cluster.sh),
    which run their daemons and the driver with them (allocation-cluster.sh)."""
    if spec.profile.container is None:
        return ""
    return ("\n\n# --- container (pyxis): every step of this job runs in it, under one name per job "
            "(its steps and requeues reuse it) ---\n"
            "recsys_container=(\n    " + "\n    ".join(container_flags(spec, run_dir)) + "\n)\n"
            "RECSYS_CONTAINER_SRUN_FLAGS=$(printf '%s\\n' \"${recsys_container[@]}\")\n"
            "export RECSYS_CONTAINER_SRUN_FLAGS")


def step_lines(spec, run_dir, in_allocation=False):
    """The step as a list of already-quoted argv pieces (one per line in the script).

    With a container profile every piece of Python runs in the container: srun rank steps get the
    script's "${recsys_container[@]}" flags; a batch step whose command is a slurm/ cluster helper
    passes them on through RECSYS_CONTAINER_SRUN_FLAGS (the helper starts its daemons and the
    driver in the container); any other batch command becomes a one-task srun step in it. In the
    container each step starts with CONTAINER_ENTRY."""
    profile = spec.profile
    container = profile.container
    if spec.launcher == "batch":
        argv = _quote_command(spec.command)
        if container is None:
            return [" ".join(argv)]
        if len(spec.command) > 1 and isinstance(spec.command[1], SlurmHelper):
            return [" ".join(argv)]
        srun = ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--overlap", "--kill-on-bad-exit=1"]
        return [" ".join(srun) + ' "${recsys_container[@]}"', CONTAINER_ENTRY + " " + " ".join(argv)]
    _, rank_out = log_paths(spec, run_dir)
    mpi = profile.mpi or "pmix"
    srun = ["srun", f"--mpi={mpi}", "-N", str(spec.nodes),
            f"--ntasks-per-node={spec.ntasks_per_node}",
            f"--ntasks={spec.nodes * spec.ntasks_per_node}", "--kill-on-bad-exit=1"]
    pieces = [" ".join(shlex.quote(a) for a in srun),
              " ".join(shlex.quote(a) for a in (f"--output={rank_out}", f"--error={rank_out}"))]
    if in_allocation:   # a study point inside one allocation: its fixed node set and its own time limit
        pieces[0] += f" --time={step_minutes(spec)}"    # (render_allocation): a stuck point never costs the next
        pieces[1] += ' ${RECSYS_STEP_NODES:+"--nodelist=$RECSYS_STEP_NODES"}'
    if container is not None:
        pieces.append('"${recsys_container[@]}" ' + CONTAINER_ENTRY)
    argv = _quote_command(rank_command(spec))
    if argv[:2] == ["bash", '"$RECSYS_SLURM_DIR/bind.sh"']:
        cut = argv.index("--") + 1
        pieces.append(" ".join(argv[:cut]))
        argv = argv[cut:]
    pieces.append(" ".join(argv))
    return pieces


def step_minutes(spec) -> int:
    """The point's time limit in whole minutes, rounded up: a step's --time has a minute's
    granularity, so a point never gets less than the limit it asked for."""
    return max(1, -(-int(spec.time_seconds) // 60))


def task_env(spec):
    if not spec.array:
        return "# (not an array job)"
    return ("if [ -n \"${SLURM_ARRAY_TASK_ID:-}\" ]; then\n"
            f"    export RECSYS_TASK_INDEX=$(( {int(spec.task_offset)} + SLURM_ARRAY_TASK_ID ))\n"
            f"    export RECSYS_TASK_COUNT={int(spec.task_count)}\n"
            "fi")


def submit_hint(spec, script_path, ids=None, written=True):
    """The script's "Submit by hand with: sbatch ..." comment: only for a script written to a file
    (a submission, `render -o DIR`), with the --dependency to fill in where it waits for jobs of
    its chain whose ids are not known yet."""
    if not written:
        return ("Printed only, not written to a file: `recsys-submit render -o DIR ...` writes the "
                "script(s) to DIR (which becomes the run directory)")
    command = "sbatch"
    if any(k not in (ids or {}) for k in spec.after_ok + spec.after_any):
        command += f" --dependency={dependency_string(spec, ids or {})}"
    return f"Submit by hand with: {command} {shlex.quote(script_path or f'{spec.key}.sbatch')}"


def _comment(text, what):
    """A value for one of the script's `#` comment lines: a newline there ends the comment and the
    rest runs as a command, so a control character is refused (a loaded profile has none)."""
    if has_control(text):
        raise RequestError(f"{what}: {text!r} has a control character, which the job script cannot "
                           "show in a comment")
    return text


def render(spec, run_dir, script_path=None, ids=None, token=None, written=True, in_allocation=False):
    """The sbatch script text of `spec` for run directory `run_dir`; `written`: whether it is
    saved as `script_path` (what its comment tells the reader to sbatch), or only printed."""
    profile = spec.profile
    container = profile.container
    step = " \\\n    ".join(step_lines(spec, run_dir, in_allocation))
    title = (f"{spec.kind} {spec.subject}: {spec.nodes} node(s) x {spec.ntasks_per_node} task(s), "
             f"{spec.gpus_per_node} GPU(s)/node, job key {spec.key}")
    return _template().substitute(
        directives="\n".join(directives(spec, run_dir, ids, token)),
        title=_comment(title, "the job's title"),
        profile_name=_comment(profile.name, "profile name"),
        profile_path=_comment(profile.path or "", f"profile {profile.name!r}: path"),
        submit_hint=_comment(submit_hint(spec, script_path, ids, written), "the script's path"),
        run_dir=shlex.quote(os.path.abspath(run_dir)),
        slurm_dir=shlex.quote(os.path.join(spec.code_dir, "slurm") if spec.code_dir else slurm_dir()),
        key=shlex.quote(spec.key),
        profile=shlex.quote(profile.name),
        profile_sha256=shlex.quote(profile.content_sha256()),
        task_env=task_env(spec),
        setup="\n".join(profile.setup or []) or "# (none)",
        env=env_lines(spec),
        bind_env=_exports(bind_env(profile.node)) if spec.bind else "# (engine does its own binding)",
        container_block=container_block(spec, run_dir),
        container=shlex.quote(container.image if container is not None else ""),
        requeue="yes" if spec.requeue else "no",
        checkpoint_dir=quote(spec.checkpoint_dir or ""),
        max_idle_requeues=int(MAX_IDLE_REQUEUES),
        step=step,
    )


def render_allocation(spec, run_dir, points, token=None, concurrent=False, nodelist=None, exclude=None,
                      schedule=None):
    """The sbatch script of one allocation (`spec`: its size, time and name) that runs a study's
    points in turn (slurm/study-allocation.sbatch.tmpl); `points`: [(point JobSpec, its run dir,
    its script path)], each script rendered by `render(..., in_allocation=True)`. `concurrent`
    (a node screen, jobs.study.running.screen): every point at once, each on its own nodes after the
    previous point's; `nodelist`, `exclude`: the allocation's `--nodelist` / `--exclude`, Slurm host
    lists (`exclude`: e.g. the nodes a `study screen` flagged). `schedule` (a screen with
    `--network`): rounds, each [(index into `points`, [allocation node indices])], the points of a
    round at once on their nodes, one round after the other; every point in one round."""
    profile = spec.profile
    path = os.path.join(slurm_dir(), "study-allocation.sbatch.tmpl")
    with open(path) as handle:
        template = _Template(handle.read())
    def call(point, point_dir, script):
        return ["recsys_point", shlex.quote(os.path.abspath(point_dir)), shlex.quote(script),
                shlex.quote(point.key), str(int(point.nodes)), str(60 * step_minutes(point))]

    lines, first = [], 0
    if schedule is not None:
        placed = sorted(i for rnd in schedule for i, _ in rnd)
        if placed != list(range(len(points))):
            raise ValueError(f"schedule: every point in one round, got {placed} for {len(points)} point(s)")
        for number, rnd in enumerate(schedule, 1):
            lines.append(f"# round {number} of {len(schedule)}: {len(rnd)} point(s) at once")
            for i, nodes in rnd:
                if len(nodes) != int(points[i][0].nodes) or not all(0 <= n < int(spec.nodes) for n in nodes):
                    raise ValueError(f"schedule: point {i} needs {points[i][0].nodes} of the allocation's "
                                     f"{spec.nodes} node(s), got indices {nodes}")
                # a trailing comma keeps one index a list (FIRST alone is a start)
                lines.append(" ".join(call(*points[i]) + [",".join(map(str, nodes)) + ",", "&"]))
            lines.append("wait")
    else:
        for point, point_dir, script in points:
            line = call(point, point_dir, script)
            if concurrent:
                line += [str(first), "&"]
                first += int(point.nodes)
            lines.append(" ".join(line))
        if concurrent and lines:
            lines.append("wait")
    heads = directives(spec, run_dir, None, token)
    for flag, hosts in (("--nodelist", nodelist), ("--exclude", exclude)):
        if hosts is not None:
            if not re.fullmatch(r"[A-Za-z0-9_.\-\[\],]+", hosts):
                raise RequestError(f"{flag}: {hosts!r} is not a Slurm host list such as node[1-4],gpu7")
            heads.append(f"#SBATCH {flag}={hosts}")
    title = (f"study allocation {spec.subject}: {spec.nodes} node(s) x {spec.ntasks_per_node} task(s), "
             f"{len(points)} point(s)" + (f", in {len(schedule)} rounds, each round's points at once on their "
                                          "own nodes" if schedule is not None else
                                          ", all at once, each on its own node(s) (not in turn as below)"
                                          if concurrent else ""))
    return template.substitute(
        directives="\n".join(heads),
        title=_comment(title, "the allocation's title"),
        profile_name=_comment(profile.name, "profile name"),
        profile_path=_comment(profile.path or "", f"profile {profile.name!r}: path"),
        run_dir=shlex.quote(os.path.abspath(run_dir)),
        time_limit_s=str(int(spec.time_seconds)),
        points="\n".join(lines) or "# (no points)",
    )
