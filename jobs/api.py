"""The Python API: the same operations as the `recsys-submit` CLI, which goes through it too.

    from jobs.api import JobRequest, build_chain, submit, status, watch, logs, cancel, requeue
    run = submit([JobRequest(kind="benchmark", model="hello", nodes=2)], "ci")
    chain = build_chain("train", model="dlrm", preprocess_from="/raw", data_path="/data",
                        then_evaluate=True, profile="ci")      # preprocess -> train -> evaluate
    print(watch(submit(chain, "ci")["run_dir"])["jobs"])          # finished jobs carry ["summary"]
    record, submitted = run_study(load_spec("docs/studies/dlrm-strong.yaml"), "ci")
    report, paths = report_study(record.study_dir)                  # scaling.{md,csv,json,png}
    comparison, paths = compare_studies([baseline_dir, record.study_dir])  # compare.{md,csv,json,png}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .errors import RequestError, SlurmCommandError, StorageError, SubmitError, ToolkitError
from .planning.request import JobRequest, build_chain
from .profiles import ProfileError, list_profiles
from .schedulers import backend_class, capabilities
from .submit import dry_run, load, render_plan, render_text, submit

__all__ = ["JobRequest", "build_chain", "ToolkitError", "profile_schema", "study_schema", "RequestError", "SubmitError", "SlurmCommandError", "StorageError",
           "ProfileError", "render", "render_plan", "dry_run", "submit", "status", "watch", "run_failed", "summary_line", "logs",
           "log_files", "cancel", "requeue", "find_run", "load_profile", "list_profiles", "runs_in_foreground",
           "load_spec", "spec_from_flags", "run_study", "find_study", "study_status", "watch_study",
           "study_progress_line", "report_study", "compare_studies", "dry_run_study", "reference_study",
           "published_results", "published_results_text", "project_study", "projection_text",
           "tensorboard_logdirs", "tensorboard_command", "find_studies", "study_history", "study_history_text",
           "plot_study_history", "history_point", "screen_nodes", "collect_screen",
           "default_runs_dir"]

# Following a run (jobs.status, jobs.runs) and the studies are loaded by the operations that use
# them: a job command (render, submit) does not pay for them at start-up. The types below are for
# the type checker only (never imported at run time).
if TYPE_CHECKING:
    from .profiles.profile import Profile
    from .runs.records import StatusResult
    from .study.running.record import StudyRecord, StudyStatus
    from .study.spec import Point, StudySpec

ProfileRef = Union[str, "Profile"]      # a profile name, a YAML file, or a loaded Profile
Log = Optional[Callable[[str], None]]   # a callable taking one line
# The JSON documents a study command writes (screen.json, scaling.json, compare.json,
# projection.json, the history index's entries): versioned records on disk, returned as the same
# mappings the files hold (their keys: docs/studies.md).
Document = Dict[str, Any]


def load_profile(name_or_path: ProfileRef) -> Profile:
    """A validated jobs.profiles.Profile by name (search path) or file."""
    return load(name_or_path)


def find_run(run: Optional[str] = None, runs_dir: Optional[str] = None) -> str:
    """A run directory from a path, a name under the runs dir, or (None) the newest run."""
    from .runs.rundir import find_run as find

    return find(run, runs_dir)


def status(run_dir: str) -> StatusResult:
    """One poll (jobs.runs.records.StatusResult): result["jobs"][i]["state"], ["done"], ["calls"]."""
    from .status import poll

    return poll(run_dir)


def watch(run_dir: str, on_poll: Optional[Callable[[StatusResult], Any]] = None, first: Optional[float] = None,
          factor: float = 1.5, ceiling: Optional[float] = None, timeout: Optional[float] = None,
          outage: Optional[float] = None) -> StatusResult:
    """Poll a run until every job has ended (jobs.status.watch); the last StatusResult."""
    from .status import watch as watch_run

    return watch_run(run_dir, on_poll=on_poll, first=first, factor=factor, ceiling=ceiling, timeout=timeout,
                     outage=outage)


def run_failed(result: StatusResult) -> bool:
    """Whether any job of a polled run did not complete."""
    from .status import run_failed as failed

    return failed(result)


def summary_line(summary: Dict[str, Any]) -> str:
    """A finished job's engine summary as one line (what `recsys-submit status` prints)."""
    from .status import summary_line as line

    return line(summary)


def log_files(run_dir: str, key: Optional[str] = None, rank: Optional[int] = None) -> List[str]:
    """The run's batch logs, or one rank's logs (which files those are is the backend's)."""
    from .status import log_files as files

    return files(run_dir, key=key, rank=rank)


def load_spec(path: str) -> StudySpec:
    """A validated jobs.study.spec.StudySpec from a study YAML file."""
    from .study.spec import load_spec as read_spec

    return read_spec(path)


def spec_from_flags(model: str, gpus: str, **flags: Any) -> StudySpec:
    """A StudySpec for a quick sweep from CLI-style values (`gpus="1,2,4"`, `variants=["amp=false,true"]`)."""
    from .study.spec import spec_from_flags as from_flags

    return from_flags(model, gpus, **flags)


def runs_in_foreground(scheduler: str) -> bool:
    """Whether a scheduler's submissions run to their end before submit returns (local)."""
    return capabilities(scheduler).foreground


def render(requests: Union[JobRequest, Sequence[JobRequest]], profile: ProfileRef, runs_dir: Optional[str] = None,
           check_data: bool = False) -> str:
    """The script(s) a submission would write, as one text (scripts separated by a header);
    `check_data`: refuse engine arguments that name no data, as a submission would (--dry-run)."""
    if isinstance(requests, JobRequest):
        requests = [requests]
    return render_text(requests, profile, runs_dir=runs_dir, check_data=check_data)


def logs(run_dir: str, rank: Optional[int] = None, key: Optional[str] = None) -> str:
    """Concatenated text of the run's batch logs (or one rank's logs)."""
    chunks = []
    for path in log_files(run_dir, key=key, rank=rank):
        with open(path, errors="replace") as handle:
            chunks.append(f"==> {path} <==\n{handle.read()}")
    return "\n".join(chunks)


def _backend(run_dir):
    from .recovery import load_settled

    record = load_settled(run_dir)      # a job an interrupted submission left is found first
    return backend_class(record.scheduler)(), record


def _unfinished(action, run_dir, backend, record):
    """(the run's jobs not known to have ended, "job KEY (ID) is STATE" of those that ended),
    from one poll of the backend. A job Slurm has not reported yet (UNKNOWN) counts as
    unfinished: the scheduler decides. Every job ended: RequestError, one line with their
    states (a requeue would re-run a COMPLETED job, a cancel would do nothing)."""
    from . import states

    polled = {job.key: job for job in backend.poll(run_dir, record).jobs}
    unfinished, ended = [], []
    for job in record.jobs:
        seen = polled.get(job.key)
        if seen is not None and seen.tasks and all(s in states.TERMINAL for s in seen.tasks.values()):
            ended.append(f"job {job.key} ({job.job_id}) is {seen.state}")
        else:
            unfinished.append(job)
    if not unfinished:
        why = ("requeue only restarts queued or running jobs; submit again" if action == "requeue"
               else "nothing to cancel")
        raise RequestError(f"{action}: run {run_dir}: {', '.join(ended)}; {why}")
    return unfinished, ended


def cancel(run_dir: str, log: Log = None) -> List[str]:
    """Cancel the jobs of a run that are queued or running (one poll, then one scancel on
    Slurm); returns their ids. Jobs that already ended are left alone and named to `log` (a
    callable taking one line); a run whose jobs have all ended is refused (RequestError)."""
    from .recovery import refuse_in_flight

    backend, record = _backend(run_dir)
    refuse_in_flight("cancel", run_dir, record)     # a job that may still go in is never left behind
    if not record.jobs:
        return []
    jobs, ended = _unfinished("cancel", run_dir, backend, record)
    if ended and log:
        log(f"cancel: left alone, already ended: {', '.join(ended)}")
    backend.cancel(run_dir, jobs)
    return [j.job_id for j in jobs]


def requeue(run_dir: str, log: Log = None, timeout: Optional[float] = None) -> List[str]:
    """Requeue the running jobs of a run after each has saved a checkpoint (on Slurm: USR2 to
    the batch script, which checkpoints and requeues; waits up to `timeout` s); returns their
    ids. `log` gets one line per requeued task with the steps its checkpoint kept. Jobs that
    already ended, or not started, are left alone and named to `log`; a run whose jobs have all
    ended is refused (RequestError), and so is a job that ends before it is signalled: Slurm
    refuses the signal, where a plain `scontrol requeue` would run a COMPLETED job again."""
    from .recovery import refuse_in_flight

    backend, record = _backend(run_dir)
    refuse_in_flight("requeue", run_dir, record)
    if not record.jobs:
        return backend.requeue(run_dir, []) or []
    jobs, ended = _unfinished("requeue", run_dir, backend, record)
    if ended and log:
        log(f"requeue: left alone, already ended: {', '.join(ended)}")
    return backend.requeue(run_dir, jobs, log=log, timeout=timeout) or []


def run_study(spec: StudySpec, profile: ProfileRef, runs_dir: Optional[str] = None, max_concurrent: Optional[int] = None,
              placement: Optional[str] = None, nodes: Optional[int] = None, refresh_code: bool = False,
              exclude: Optional[str] = None, overlap_other_users: bool = False) -> Tuple[StudyRecord, List[str]]:
    """Submit the missing or failed points of a study, in rounds of repeats, at most
    `max_concurrent` queued or running (default: 1 on a profile with shared_nodes, else no cap),
    or (`placement` "allocation") all in one allocation of `nodes` nodes (without the `exclude`
    ones: a Slurm host list, or the `--exclude=` line `study screen` prints):
    (StudyRecord, [point ids submitted]). On a shared-nodes profile another user's study job in
    the queue refuses it unless `overlap_other_users`."""
    from .study.analysis.published import check_data_path
    from .study.running import run as study_run

    check_data_path(spec)       # a reference spec's placeholder data_path: refused before anything exists
    return study_run.run(spec, profile, runs_dir=runs_dir, max_concurrent=max_concurrent, placement=placement,
                         nodes=nodes, refresh_code=refresh_code, exclude=exclude,
                         overlap_other_users=overlap_other_users)


def dry_run_study(spec: StudySpec, profile: ProfileRef) -> Tuple[List[Point], Dict[str, Document], Optional[str]]:
    """Every check `run_study` makes before submitting (spec, sizes against the profile, each
    point's flags against the engine's parser), with no scheduler: ([Point], {point id: the NVIDIA
    published row it matches: table, throughput, model_size}, a warning line or None)."""
    from .study.analysis import published
    from .study.spec import expand

    profile = load(profile)
    points = expand(spec, profile)
    platform = published.platform_of(profile)
    matches = {}
    for point in points:
        precision, xla = published.settings_of(spec.engine_args, point.variant, platform)
        row = published.match(spec.model, platform, point.gpus, point.batch_per_gpu, precision, xla)
        if row is not None:
            matches[point.id] = {"table": row.table, "throughput": row.throughput[precision],
                                 "model_size": row.model_size}
    warning = None
    if published.is_placeholder(spec.data_path):
        warning = f"data_path: {spec.data_path} is a placeholder; set your dataset directory before `study run`"
    return points, matches, warning


def find_study(study: Optional[str] = None, runs_dir: Optional[str] = None, wait: bool = False) -> str:
    """A study directory from a path, a name under the runs dir, or (None) the newest study.
    `wait`: a named study not created yet is looked for again for a while (a watch started
    alongside its `study run`; jobs.study.running.watch.find_study_to_watch)."""
    from .study.running import record as study_record, watch as study_watch

    if wait:
        return study_watch.find_study_to_watch(study, runs_dir)
    return study_record.find_study(study, runs_dir)


def study_status(study_dir: str) -> StudyStatus:
    """One poll of every point of a study (one Slurm call): a jobs.study.running.record.StudyStatus."""
    from .study.running import record as study_record

    return study_record.poll(study_record.StudyRecord.load(study_dir))


def watch_study(study_dir: str, on_poll: Optional[Callable[[StudyStatus], Any]] = None, first: Optional[float] = None,
                ceiling: Optional[float] = None, timeout: Optional[float] = None) -> StudyStatus:
    """Poll a study until no point is pending or running; the last StudyStatus."""
    from .study.running import watch as study_watch

    return study_watch.watch(study_dir, on_poll=on_poll, first=first, ceiling=ceiling, timeout=timeout)


def study_progress_line(status: StudyStatus) -> str:
    """`[#####-----]  3/8 done  1 running ...  elapsed 0:00:42` of a StudyStatus."""
    from .study.running import record as study_record

    return study_record.progress_line(status)


def report_study(study_dir: str, out_dir: Optional[str] = None,
                 plot: Optional[bool] = None) -> Tuple[Document, Dict[str, str]]:
    """Write the study's scaling table and plot; returns (report dict, {kind: path})."""
    from .study.analysis import projection
    from .study.analysis import report as study_report

    from .study.analysis import history

    return study_report.write(study_dir, out_dir=out_dir, want_plot=plot, project=projection.for_report,
                              on_written=history.on_report)


def reference_study(model: str, profile: ProfileRef) -> Tuple[StudySpec, str]:
    """The study spec that reproduces NVIDIA's published table of `model` on the platform of
    `profile` (its node type: dgxa100, dgx1, dgx2): (StudySpec, YAML text with comments)."""
    from .study.analysis import published

    return published.reference_spec(model, load(profile))


def profile_schema() -> Dict[str, Any]:
    """The profile file format as a JSON Schema, for an editor's YAML language server."""
    from .profiles.editor_schema import profile_schema as schema

    return schema()


def study_schema() -> Dict[str, Any]:
    """The study spec format as a JSON Schema, for an editor's YAML language server."""
    from .study.running.editor_schema import study_schema as schema

    return schema()


def study_examples() -> Dict[str, str]:
    """{name: description} of the example study specs the package ships."""
    from .study.running import examples

    return examples.descriptions()


def write_study_example(name: str, path: Optional[str] = None) -> str:
    """Write the shipped example spec `name` to `path` (default ./NAME.yaml, never over a file); the path."""
    from .study.running import examples

    return examples.write(name, path or f"{name}{examples.SUFFIX}")


def published_results(model: Optional[str] = None, profile: Optional[ProfileRef] = None) -> List[Document]:
    """NVIDIA's published throughput rows (those studies are matched against), filtered by model and
    by a profile's platform, each with the profiles on the search path of that platform."""
    from .study.analysis import published

    return published.listing(model, load(profile) if profile else None)


def published_results_text(model: Optional[str] = None, profile: Optional[ProfileRef] = None) -> str:
    """published_results() as the table `recsys-submit study reference --list` prints."""
    from .study.analysis import published

    return published.listing_text(published_results(model, profile))


def compare_studies(study_dirs: Sequence[str], out_dir: Optional[str] = None, plot: Optional[bool] = None,
                    fail_if_slower: Optional[float] = None) -> Tuple[Document, Dict[str, str]]:
    """Compare studies point by point with the first (median ratio, Mann-Whitney U verdict) and
    write compare.{md,csv,json,png}; returns (comparison dict, {kind: path}). With
    `fail_if_slower` (percent), comparison["slower"] lists the points slower by more than that."""
    from .study.analysis import compare as study_compare

    return study_compare.write(study_dirs, out_dir=out_dir, want_plot=plot, fail_if_slower=fail_if_slower)


def find_studies(studies: Sequence[str], runs_dir: Optional[str] = None) -> List[str]:
    """Study dirs of `study compare`'s arguments: dirs, names under the runs dir, or names from
    the runs dir's history (the newest study of that name)."""
    from .study.analysis import compare as study_compare
    from .study.analysis import history

    return study_compare.find(studies, runs_dir, history=history.find)


def study_history(runs_dir: Optional[str] = None, model: Optional[str] = None,
                  profile: Optional[str] = None) -> List[Document]:
    """The finished studies of the runs dir (jobs.study.analysis.history), oldest first, each with its
    `state` now (present or gone)."""
    from .study.analysis import history

    return history.listing(runs_dir or _runs_dir(), model=model, profile=profile)


def study_history_text(entries: List[Document]) -> str:
    from .study.analysis import history

    return history.text(entries)


def history_point(point: str) -> str:
    """`study history --plot`'s POINT, checked (RequestError naming --plot)."""
    from .study.analysis import history

    return history.check_point(point)


def plot_study_history(entries: List[Document], point: str, path: str) -> List[Document]:
    """Write `point`'s throughput over the listed studies as a PNG, each marked with its compare
    verdict against the study before it; returns the plotted series."""
    from .study.analysis import history

    return history.plot(entries, point, path)


def screen_nodes(profile: ProfileRef, nodes: Optional[int] = None, nodelist: Optional[str] = None,
                 margin: Optional[float] = None, runs_dir: Optional[str] = None, log: Log = None,
                 on_submitted: Optional[Callable[[str], Any]] = None, **benchmark: Any) -> Document:
    """`study screen`: the one-node benchmark on every node of one allocation at once; waits for
    it and writes screen.{md,json} into the screen's dir. Returns the screen dict (jobs.study.running.screen)."""
    from .study.running import screen

    margin = screen.MARGIN if margin is None else margin
    screen_dir = screen.submit(profile, nodes=nodes, nodelist=nodelist, margin=margin, runs_dir=runs_dir, log=log,
                               **{k: v for k, v in benchmark.items() if v is not None})
    if on_submitted:
        on_submitted(screen_dir)
    return screen.collect(screen_dir, screen.wait(screen_dir), margin)


def default_runs_dir(profile: Optional[Profile] = None) -> str:
    """Where runs and studies go: $RECSYS_RUNS_DIR, the profile's runs_dir, or ./recsys-runs."""
    from .runs.rundir import default_runs_dir as runs_dir

    return runs_dir(profile)


def collect_screen(screen_dir: str) -> Document:
    """A screen submitted before: wait for its allocation and write screen.{md,json}; the screen dict."""
    from .study.running import screen

    return screen.collect(screen.check_dir(screen_dir), screen.wait(screen.check_dir(screen_dir)))


def _runs_dir() -> str:
    return default_runs_dir()


def project_study(source: str, profile: ProfileRef, gpus: Sequence[int], variant: Optional[str] = None,
                  step_ms: Optional[float] = None, out_dir: Optional[str] = None, plot: Optional[bool] = None,
                  published: bool = False, compute_curve: Optional[Sequence[str]] = None,
                  calibration_gpus: Optional[int] = None) -> Tuple[Document, Dict[str, str]]:
    """What `gpus` GPU counts of `profile` would deliver for a study directory (calibrated on its
    smallest measured point) or a spec file (calibrated on `step_ms`, one GPU's step time, or with
    `published` on NVIDIA's 1-GPU row of the same model, batch and precision): the
    band from full overlap to none per count (docs/studies.md, "Projecting a study"). Writes
    projection.{md,csv,json,png} to `out_dir` when given; returns (record, {kind: path}).
    `compute_curve`: paths of one GPU measured at several batches (projection.compute_curve).
    `calibration_gpus`: the GPU count `step_ms` was timed at (default 1)."""
    from .study.analysis import projection

    record = projection.run(source, load(profile), gpus, variant=variant, step_ms=step_ms, use_published=published,
                            compute_curve=compute_curve, calibration_gpus=calibration_gpus)
    paths = projection.write(record, out_dir, want_plot=plot) if out_dir else {}
    return record, paths


def projection_text(record: Document) -> str:
    """A projection record as the markdown table `study project` prints."""
    from .study.analysis import projection

    return projection.markdown(record)


def tensorboard_logdirs(target: Optional[str] = None,
                        runs_dir: Optional[str] = None) -> Tuple[str, str, List[Tuple[str, str]]]:
    """What `recsys-submit tensorboard` shows: ``(kind, directory, [(name, event dir)])``, kind
    ``run`` (its jobs, by job name) or ``study`` (each point's latest attempt, by point id such as
    ``g8-n1x8-r0``). `target`: a run or study directory or name; None: the newest run."""
    from .runs import tensorboard as tb
    from .study.running import record as study_record

    study_dir = None
    if target:
        try:
            study_dir = study_record.find_study(target, runs_dir)
        except RequestError:
            pass                                   # not a study: a run, or an error naming the run
    if study_dir:
        record = study_record.StudyRecord.load(study_dir)
        named = [pair for p in record.points for pair in tb.point_logdirs(p.id, p.runs[-1] if p.runs else None)]
        kind, where = "study", study_dir
    else:
        where = find_run(target, runs_dir)
        named, kind = tb.run_logdirs(where), "run"
    if not named:
        raise RequestError(f"tensorboard: no event files or traces under {where} (logs/tensorboard/<job>: "
                           "written by runs with --log-path, unless --no-tensorboard)")
    return kind, where, named


def tensorboard_command(named: List[Tuple[str, str]],
                        port: Optional[int] = None) -> Tuple[List[str], str, str, Optional[str]]:
    """``(argv, the same quoted for a shell, the ssh -L tunnel line for a laptop, the shell line of
    the TensorBoard for the Profile tab or None)`` of the TensorBoard that shows `named` side by
    side (jobs.runs.tensorboard.profile_command: the profile plugin reads only --logdir)."""
    from .runs import tensorboard as tb

    port = port or tb.DEFAULT_PORT
    argv, profile = tb.command(named, port), tb.profile_command(named, port)
    return argv, tb.shell_line(argv), tb.tunnel_line(port), profile and tb.shell_line(profile)


def fabric_section(profile: ProfileRef, files: Iterable[str] = (), nccl_tests: Iterable[str] = (),
                   core_sharing: bool = False) -> Dict[str, Any]:
    """A `fabric:` mapping for `profile`: from the fabric files of python -m recsys.collectives
    (repeats of a layout: median and range), or the profile's own fabric with nccl-tests outputs
    (["LEVEL:COLLECTIVE=FILE", ...]) added as measured figures. `core_sharing`: the files' layouts
    also become the profile's ``core_sharing.exchange`` (ranks sharing a host's cores).
    RequestError (one line) names the file or value at fault."""
    from .profiles.fabric_files import fabric_section as section

    return section(load(profile), files=files, nccl_tests=nccl_tests, core_sharing=core_sharing)
