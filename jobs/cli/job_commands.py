"""The job commands (render, train, evaluate, benchmark, preprocess), profiles, status, logs,
cancel and requeue: each goes through jobs.api."""

import os
import sys


from .parser import PROG

def _split_engine_args(argv):
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def requests_from_args(args, engine_args):
    """The JobRequest chain a job subcommand asks for (built by jobs.api.build_chain, as for a
    program)."""
    from jobs.api import build_chain

    flag = vars(args).get      # each subcommand has only its own flags
    common = dict(profile=args.profile, payload=flag("payload", "recsys"), nodes=args.nodes,
                  gpus_per_node=args.gpus_per_node, ntasks_per_node=args.ntasks_per_node,
                  time=args.time, name=args.name, bind=args.bind, hyperthreads=args.ht,
                  signal_seconds=args.signal_seconds, requeue=not args.no_requeue, python=args.python)
    return build_chain(args.kind, flag("model"), engine_args=engine_args, after=args.after,
                       array=flag("array"), array_parallelism=flag("array_parallelism"),
                       preprocess_from=flag("preprocess_from"), data_path=flag("data_path"),
                       then_evaluate=bool(flag("then_evaluate")), dataset=flag("dataset"),
                       preprocess_mode=flag("preprocess_mode", "single"), input=flag("input"),
                       output=flag("output"), shards=flag("shards"),
                       preprocess_engine=flag("preprocess_engine", "spark"), **common)


def _print_status(api, result, as_json=False):
    if as_json:
        import json

        print(json.dumps(result.to_dict(), indent=2))
        return
    print(f"run {result['run_dir']}  ({result['source']}, {result['calls']} Slurm call(s))")
    width = max([len(j["key"]) for j in result["jobs"]] + [3])
    for job in result["jobs"]:
        print(f"  {job['key']:<{width}}  {job['job_id']:>10}  {job['state']}")
        if job.get("summary"):
            print(f"  {'':<{width}}  {'':>10}  {api.summary_line(job['summary'])}")
        if job.get("reason"):
            print(f"  {'':<{width}}  {'':>10}  {job['reason']}")


def _print_json(data) -> int:
    import json

    print(json.dumps(data, indent=2))
    return 0


def _cmd_profiles(api, args):
    if args.action == "schema":
        return _print_json(api.profile_schema())
    if args.action == "list":
        rows = []
        for ref in api.list_profiles():
            try:
                row = {"description": api.load_profile(ref.path).description, "error": None}
            except ValueError as exc:
                row = {"description": None, "error": str(exc)}
            rows.append({"name": ref.name, "source": ref.source, "path": ref.path, **row})
            if not args.json:
                print(f"{ref.name:<14} {ref.source:<8} {row['description'] or 'INVALID: ' + row['error']}")
        if args.json:
            import json

            print(json.dumps(rows, indent=2))
        return 0
    if args.action == "show":
        data = api.load_profile(args.profile).as_dict()
        if args.json:
            import json

            print(json.dumps(data, indent=2, default=str))
            return 0
        import yaml

        print(yaml.safe_dump(data, sort_keys=False), end="")
        return 0
    if args.action == "fabric":
        import yaml

        section = api.fabric_section(args.profile, args.files, args.nccl_tests, args.core_sharing)
        print(yaml.safe_dump({"fabric": section}, sort_keys=False, width=10_000), end="")
        return 0
    files = args.files or [ref.path for ref in api.list_profiles()]
    bad = 0
    for path in files:
        try:
            api.load_profile(path)
            print(f"ok      {path}")
        except ValueError as exc:
            bad += 1
            for problem in getattr(exc, "problems", [exc]):    # every problem, one line each
                print(f"{PROG}: error: {problem}", file=sys.stderr)
    return 2 if bad else 0


def _cmd_job(api, args, engine_args):
    requests = requests_from_args(args, engine_args)
    out_dir = vars(args).get("out_dir")
    if out_dir:
        parts = api.render_plan(requests, args.profile, run_dir=os.path.abspath(out_dir), write=True)
        for spec, _text in parts:
            print(f"wrote {os.path.join(os.path.abspath(out_dir), spec.key + '.sbatch')}")
        first = parts[0][0]
        print(f"Submit by hand with: sbatch {os.path.join(os.path.abspath(out_dir), first.key + '.sbatch')}"
              + ("  (then the others in order, each with --dependency=afterok:<the ids it waits for>; "
                 "every script names its own)" if len(parts) > 1 else ""))
        return 0
    if args.command == "render" or args.dry_run:
        # a dry run refuses engine arguments that name no data, as the submission would; a render does not
        dry = bool(vars(args).get("dry_run"))
        print(api.render(requests, args.profile, runs_dir=args.runs_dir, check_data=dry), end="")
        return 0
    record = api.submit(requests, args.profile, runs_dir=args.runs_dir, keep_partial=args.keep_partial,
                        wait=False if args.no_wait else None)
    for job in record.jobs:
        print(f"submitted {job.key} job {job.job_id}")
    print(f"run dir {record.run_dir}")
    if record.foreground:
        _print_status(api, api.status(record.run_dir))
        if record.error:
            print(f"{PROG}: error: {record.error}", file=sys.stderr)
            return 1
    return 0


def _cmd_status(api, args):
    run_dir = api.find_run(args.run, args.runs_dir)
    if args.watch:
        result = api.watch(run_dir, on_poll=lambda r: None if args.json else _print_status(api, r))
        if args.json:
            _print_status(api, result, True)
        return 1 if api.run_failed(result) else 0
    result = api.status(run_dir)
    _print_status(api, result, args.json)
    return 1 if api.run_failed(result) else 0       # a failed or hung run, as `study status` (issue 47, 11)


def _cmd_logs(api, args):
    run_dir = api.find_run(args.run, args.runs_dir)
    if args.json:
        import json

        files = [{"path": path, "bytes": os.path.getsize(path)}
                 for path in api.log_files(run_dir, key=args.job, rank=args.rank) if os.path.isfile(path)]
        print(json.dumps({"run_dir": run_dir, "files": files}, indent=2))
        return 0
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


def _cmd_cancel(api, args):
    run_dir = api.find_run(args.run, args.runs_dir)
    act = api.cancel if args.command == "cancel" else api.requeue
    ids = act(run_dir, log=lambda line: print(line, flush=True))
    print(f"{args.command}: {' '.join(ids) or '(no jobs)'}")
    return 0
