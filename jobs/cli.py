"""`recsys-submit`: profiles, render, train/evaluate/benchmark/preprocess, status, logs, cancel,
requeue, study (scaling studies: jobs.study, jobs.study_run, jobs.study_report). Errors are one
line on stderr with a non-zero exit (2: bad input, nothing submitted; 1: Slurm failed or a job
failed). Imports stay lazy so the command starts fast on login nodes.
"""

import argparse
import os
import re
import sys

from .vocabulary import KINDS as JOB_KINDS

PROG = "recsys-submit"


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump) and exit code 2."""

    def error(self, message):
        self.exit(2, f"{PROG}: error: {message}\n")


def _job_options(parser, kind=None):
    add = parser.add_argument
    add("--profile", default=os.environ.get("RECSYS_PROFILE", "local"),
        help="cluster profile name or YAML file (default $RECSYS_PROFILE or 'local')")
    add("--model", help="dlrm | wide_deep | ncf (hello: the built-in smoke payload)")
    add("--payload", default="recsys", help="recsys (training engine) or hello (smoke payload)")
    add("--nodes", type=int, help="number of nodes (default: profile's, else 1)")
    add("--gpus-per-node", type=int, help="GPUs per node (default: all of the profile's node)")
    add("--ntasks-per-node", type=int, help="ranks per node (default: one per GPU; one for preprocess)")
    add("--time", help="time limit in a Slurm format (MM, HH:MM:SS, D-HH:MM, ...)")
    add("--name", help="job name (reduced to [A-Za-z0-9._-] for Slurm)")
    add("--array", type=int, help="number of array tasks (each gets RECSYS_TASK_INDEX)")
    add("--array-parallelism", "--parallelism", type=int, dest="array_parallelism",
        help="at most this many array tasks at once (%%N)")
    add("--after", action="append", default=[], help="afterok dependency on job id(s), comma-separated")
    add("--bind", help="binding mode: exclusive | numa | interleave | off")
    add("--ht", action="store_true", default=None, help="bind the hyperthread siblings too")
    add("--signal-seconds", type=int, help="USR2 this many seconds before the time limit")
    add("--no-requeue", action="store_true", help="do not requeue on USR2")
    add("--python", help="interpreter the ranks run (default: profile's, else this one)")
    add("--runs-dir", help="parent of run directories (default $RECSYS_RUNS_DIR or ./recsys-runs)")
    add("--keep-partial", action="store_true",
        help="if a later job of a chain fails to submit, keep the earlier ones (default: cancel them)")
    add("--dry-run", action="store_true", help="print the script(s), submit nothing")
    add("--no-wait", action="store_true",
        help="local profile: return at once instead of running in the foreground "
        "(Slurm submissions never wait: follow them with `status --watch`)")
    pre = parser.add_argument_group("preprocessing")
    pre.add_argument("--dataset", help="criteo | movielens | outbrain (default from --model)")
    pre.add_argument("--mode", dest="preprocess_mode", default="single",
                     help="preprocess mode: single | array (criteo) | multinode (Spark standalone; dask with --engine nvtabular)")
    pre.add_argument("--input", help="raw input directory")
    pre.add_argument("--output", help="output directory")
    pre.add_argument("--shards", type=int, help="array mode: number of transform tasks")
    pre.add_argument("--engine", dest="preprocess_engine", default="spark",
                     help="preprocessing engine: spark | nvtabular (criteo, outbrain; multinode: a dask cluster)")
    chain = parser.add_argument_group("chaining (train)")
    chain.add_argument("--preprocess-from", metavar="RAW",
                       help="first preprocess RAW into --data-path (afterok chain)")
    chain.add_argument("--data-path", help="dataset directory passed to the engine (and preprocess output)")
    chain.add_argument("--then-evaluate", action="store_true",
                       help="after training, run evaluate with the same engine arguments (afterok)")


def build_parser():
    parser = _Parser(prog=PROG, description="Submit recommender training and preprocessing jobs "
                     "to Slurm (or run them locally) from cluster profiles.",
                     epilog="Engine arguments go after '--', e.g. "
                     "recsys-submit train --profile ci --model dlrm --nodes 2 -- --batch-size 4096")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    prof = sub.add_parser("profiles", help="list, show or validate cluster profiles")
    prof_sub = prof.add_subparsers(dest="action", required=True, parser_class=_Parser)
    prof_sub.add_parser("list", help="profiles on the search path")
    show = prof_sub.add_parser("show", help="print a profile as loaded (defaults filled)")
    show.add_argument("profile")
    val = prof_sub.add_parser("validate", help="validate profile files (default: all on the path)")
    val.add_argument("files", nargs="*")

    render = sub.add_parser("render", help="print the sbatch script(s) of a request; submit nothing")
    render.add_argument("kind", help=" | ".join(JOB_KINDS))
    _job_options(render)
    for kind in JOB_KINDS:
        job = sub.add_parser(kind, help=f"submit a {kind} job")
        _job_options(job, kind)

    st = sub.add_parser("status", help="state of every job of a run (one Slurm call per poll)")
    st.add_argument("run", nargs="?", help="run directory or name (default: newest)")
    st.add_argument("--watch", action="store_true", help="poll with back-off until all jobs end")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.add_argument("--runs-dir")
    lg = sub.add_parser("logs", help="print (or follow) a run's logs")
    lg.add_argument("run", nargs="?")
    lg.add_argument("--rank", type=int, help="one rank's output instead of the batch logs")
    lg.add_argument("--job", help="only this job key of the run")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    lg.add_argument("--runs-dir")
    _study_parser(sub)
    for name, text in (("cancel", "cancel every job of a run"), ("requeue", "requeue every job of a run")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("run", nargs="?")
        cmd.add_argument("--runs-dir")
    return parser


def _study_parser(sub):
    study = sub.add_parser("study", help="scaling studies: run a sweep spec, follow it, report it")
    st_sub = study.add_subparsers(dest="action", required=True, parser_class=_Parser)
    run = st_sub.add_parser("run", help="submit every missing or failed point of a study; print its dir")
    run.add_argument("spec", nargs="?", help="study spec YAML (docs/studies.md); or give --model and --gpus")
    run.add_argument("--profile", default=os.environ.get("RECSYS_PROFILE", "local"))
    run.add_argument("--max-concurrent", type=int, help="keep at most K points queued or running at once")
    run.add_argument("--runs-dir", help="parent of the study dir (default $RECSYS_RUNS_DIR or ./recsys-runs)")
    quick = run.add_argument_group("a quick sweep without a spec file")
    quick.add_argument("--model")
    quick.add_argument("--gpus", help="GPU counts, e.g. 1,2,4,8")
    quick.add_argument("--scaling", default="strong", help="strong | weak")
    quick.add_argument("--batch-size", type=int, help="strong: global batch; weak: batch per GPU")
    quick.add_argument("--variant", action="append", default=[], help="KEY=V1,V2 crossed with the points")
    quick.add_argument("--repeats", type=int)
    quick.add_argument("--warmup-steps", type=int)
    quick.add_argument("--steps", type=int)
    quick.add_argument("--time")
    quick.add_argument("--data-path")
    quick.add_argument("--name")
    status = st_sub.add_parser("status", help="points done / running / pending / failed (one Slurm call per poll)")
    status.add_argument("study", nargs="?", help="study dir or name (default: newest)")
    status.add_argument("--watch", action="store_true", help="a live progress bar until no point is queued")
    status.add_argument("--json", action="store_true")
    status.add_argument("--runs-dir")
    report = st_sub.add_parser("report", help="scaling table (markdown, CSV, JSON) and plot (PNG)")
    report.add_argument("study", nargs="?")
    report.add_argument("--out", help="directory for scaling.{md,csv,json,png} (default STUDY/report)")
    plot = report.add_mutually_exclusive_group()
    plot.add_argument("--plot", action="store_true", default=None, help="require the PNG (needs matplotlib)")
    plot.add_argument("--no-plot", dest="plot", action="store_false", help="table only")
    report.add_argument("--runs-dir")


def _cmd_study(args, engine_args):
    from . import study_run

    if args.action == "run":
        from .study import load_spec, spec_from_flags

        if args.spec and (args.model or args.gpus):
            raise _request_error("--model/--gpus: give a spec file or flags, not both")
        if args.spec:
            if engine_args:
                raise _request_error("--: engine arguments go in the spec's engine_args")
            spec = load_spec(args.spec)
        elif args.model and args.gpus:
            spec = spec_from_flags(args.model, args.gpus, scaling=args.scaling, batch_size=args.batch_size,
                                   variants=args.variant, repeats=args.repeats, warmup_steps=args.warmup_steps,
                                   steps=args.steps, time=args.time, data_path=args.data_path, name=args.name,
                                   engine_args=engine_args)
        else:
            raise _request_error("spec: give a study spec file, or --model and --gpus for a quick sweep")
        record, submitted = study_run.run(spec, args.profile, runs_dir=args.runs_dir,
                                          max_concurrent=args.max_concurrent)
        print(f"submitted {len(submitted)} of {len(record.points)} point(s)"
              + (f": {' '.join(submitted)}" if submitted else " (nothing missing or failed)"))
        print(f"study dir {record.study_dir}")
        from .backends import backend_class

        if submitted and backend_class(record.scheduler).foreground:     # local points ran already
            status = study_run.poll(record)
            print(study_run.progress_line(status))
            for point in status.points:
                if point.reason:
                    print(f"{PROG}: point {point.id} failed: {point.reason}", file=sys.stderr)
            return 1 if status.counts["failed"] else 0
        return 0
    study_dir = study_run.find_study(args.study, args.runs_dir)
    if args.action == "status":
        if args.watch:
            live = sys.stdout.isatty() and not args.json

            def show(status):
                line = study_run.progress_line(status)
                if live:
                    print(f"\r{line}", end="", flush=True)
                elif not args.json:
                    print(line, flush=True)

            status = study_run.watch(study_dir, on_poll=show)
            if live:
                print()
        else:
            status = study_run.poll(study_run.StudyRecord.load(study_dir))
        if args.json:
            import json

            print(json.dumps(status.to_dict(), indent=2))
        else:
            if not args.watch:
                print(study_run.progress_line(status))
            for point in status.points:
                extra = f"  {point.reason}" if point.reason else ""
                print(f"  {point.id:<28} {point.state:<8} {point.job_id or '-':>10}{extra}")
        return 1 if status.counts["failed"] else 0
    from . import study_report

    report, paths = study_report.write(study_dir, out_dir=args.out, want_plot=args.plot)
    print(open(paths["markdown"]).read(), end="")
    for kind, path in paths.items():
        print(f"wrote {kind} {path}")
    if "plot" not in paths and args.plot is None:
        print(f"{PROG}: no plot (matplotlib is not installed: pip install 'recsys-submit[plot]')",
              file=sys.stderr)
    return 1 if report["failures"] else 0


def _request_error(message):
    from .errors import RequestError

    return RequestError(message)


def _split_engine_args(argv):
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def requests_from_args(args, engine_args):
    """The JobRequest chain a job subcommand asks for (built by jobs.request.build_chain, as
    for the Python API)."""
    from .request import build_chain

    common = dict(profile=args.profile, payload=args.payload, nodes=args.nodes,
                  gpus_per_node=args.gpus_per_node, ntasks_per_node=args.ntasks_per_node,
                  time=args.time, name=args.name, bind=args.bind, hyperthreads=args.ht,
                  signal_seconds=args.signal_seconds, requeue=not args.no_requeue, python=args.python)
    return build_chain(args.kind, args.model, engine_args=engine_args, after=args.after,
                       array=args.array, array_parallelism=args.array_parallelism,
                       preprocess_from=args.preprocess_from, data_path=args.data_path,
                       then_evaluate=args.then_evaluate, dataset=args.dataset,
                       preprocess_mode=args.preprocess_mode, input=args.input, output=args.output,
                       shards=args.shards, preprocess_engine=args.preprocess_engine, **common)


_METRIC = re.compile(r"^(auc|bce|map_at_\d+|hr_at_\d+|ndcg_at_\d+)$")


def _summary_text(summary):
    """The engine's final summary record (docs/engine-log.md) as one line: metrics at their step,
    throughput, step time, world size, checkpoint."""
    from .enginelog import STEP_TIME, THROUGHPUT, number

    parts = []
    metrics = [f"{k} {number(summary, k):.4f}" for k in sorted(summary)
               if _METRIC.match(k) and number(summary, k) is not None]
    if metrics:
        parts.append(", ".join(metrics) + (f" at step {summary['eval_step']}"
                                           if summary.get("eval_step") is not None else ""))
    if number(summary, THROUGHPUT) is not None:
        parts.append(f"{number(summary, THROUGHPUT):,.0f} samples/s")
    if number(summary, STEP_TIME) is not None:
        parts.append(f"{number(summary, STEP_TIME):.1f} ms/step")
    parts.append(f"world size {summary.get('world_size')}")
    if summary.get("checkpoint"):
        parts.append(f"checkpoint {summary['checkpoint']}")
    return "; ".join(parts)


def _print_status(result, as_json=False):
    if as_json:
        import json

        print(json.dumps(result.to_dict(), indent=2))
        return
    print(f"run {result['run_dir']}  ({result['source']}, {result['calls']} Slurm call(s))")
    width = max([len(j["key"]) for j in result["jobs"]] + [3])
    for job in result["jobs"]:
        print(f"  {job['key']:<{width}}  {job['job_id']:>10}  {job['state']}")
        if job.get("summary"):
            print(f"  {'':<{width}}  {'':>10}  {_summary_text(job['summary'])}")
        if job.get("reason"):
            print(f"  {'':<{width}}  {'':>10}  {job['reason']}")


def _cmd_profiles(args):
    from .profiles import list_profiles, load_profile

    if args.action == "list":
        for ref in list_profiles():
            try:
                desc = load_profile(ref.path).description
            except ValueError as exc:
                desc = f"INVALID: {exc}"
            print(f"{ref.name:<14} {ref.source:<8} {desc}")
        return 0
    if args.action == "show":
        import yaml

        print(yaml.safe_dump(load_profile(args.profile).as_dict(), sort_keys=False), end="")
        return 0
    files = args.files or [ref.path for ref in list_profiles()]
    bad = 0
    for path in files:
        try:
            load_profile(path)
            print(f"ok      {path}")
        except ValueError as exc:
            bad += 1
            print(f"{PROG}: error: {exc}", file=sys.stderr)
    return 1 if bad else 0


def _cmd_job(args, engine_args):
    requests = requests_from_args(args, engine_args)
    if args.command == "render" or args.dry_run:
        from .submit import render_text

        print(render_text(requests, args.profile, runs_dir=args.runs_dir), end="")
        return 0
    from . import api

    record = api.submit(requests, args.profile, runs_dir=args.runs_dir, keep_partial=args.keep_partial,
                        wait=False if args.no_wait else None)
    for job in record.jobs:
        print(f"submitted {job.key} job {job.job_id}")
    print(f"run dir {record.run_dir}")
    if record.foreground:
        _print_status(api.status(record.run_dir))
        if record.error:
            print(f"{PROG}: error: {record.error}", file=sys.stderr)
            return 1
    return 0


def _cmd_status(args):
    from . import api

    run_dir = api.find_run(args.run, args.runs_dir)
    if args.watch:
        result = api.watch(run_dir, on_poll=lambda r: None if args.json else _print_status(r))
        if args.json:
            _print_status(result, True)
        from .status import run_failed

        return 1 if run_failed(result) else 0
    _print_status(api.status(run_dir), args.json)
    return 0


def _cmd_logs(args):
    from . import api

    run_dir = api.find_run(args.run, args.runs_dir)
    if not args.follow:
        text = api.logs(run_dir, rank=args.rank, key=args.job)
        if not text:
            print(f"(no logs yet in {run_dir}/logs)")
        else:
            print(text)
        return 0
    return _follow(api, run_dir, args)


def _follow(api, run_dir, args):
    import time

    offsets = {}
    delay, done = 0.5, False
    while True:
        for path in api.log_files(run_dir, key=args.job, rank=args.rank):
            with open(path, errors="replace") as handle:
                handle.seek(offsets.get(path, 0))
                chunk = handle.read()
                offsets[path] = handle.tell()
            if chunk:
                sys.stdout.write(chunk)
                sys.stdout.flush()
        if done:
            return 0
        done = api.status(run_dir)["done"]   # one more pass after the end to catch the tail
        if not done:
            time.sleep(delay)
            delay = min(delay * 1.5, 10.0)


def _cmd_cancel(args):
    from . import api

    run_dir = api.find_run(args.run, args.runs_dir)
    ids = api.cancel(run_dir) if args.command == "cancel" else api.requeue(run_dir)
    print(f"{args.command}: {' '.join(ids) or '(no jobs)'}")
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    own, engine_args = _split_engine_args(argv)
    args = build_parser().parse_args(own)
    if args.command in JOB_KINDS:
        args.kind = args.command
    try:
        if args.command == "profiles":
            return _cmd_profiles(args)
        if args.command == "render" or args.command in JOB_KINDS:
            return _cmd_job(args, engine_args)
        if args.command == "status":
            return _cmd_status(args)
        if args.command == "logs":
            return _cmd_logs(args)
        if args.command == "study":
            return _cmd_study(args, engine_args)
        return _cmd_cancel(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:    # one line for every error we know; tracebacks for bugs
        from .errors import RequestError, SlurmCommandError, SubmitError

        try:
            from .profiles import ProfileError
        except ImportError:     # pragma: no cover
            ProfileError = RequestError
        if isinstance(exc, (RequestError, ProfileError)):
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, (SubmitError, SlurmCommandError)):
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
