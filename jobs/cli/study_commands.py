"""The `recsys-submit study ...` commands: each goes through jobs.api and prints its table, JSON or
progress."""

import os
import sys

from .job_commands import _print_json
from .parser import _CLEAR_TO_EOL, PROG

def _cmd_study(api, args, engine_args):
    if args.action == "run":
        if args.spec and (args.model or args.gpus):
            raise api.RequestError("--model/--gpus: give a spec file or flags, not both")
        if args.spec:
            if engine_args:
                raise api.RequestError("--: engine arguments go in the spec's engine_args")
            spec = api.load_spec(args.spec)
        elif args.model and args.gpus:
            spec = api.spec_from_flags(args.model, args.gpus, scaling=args.scaling, batch_size=args.batch_size,
                                       variants=args.variant, repeats=args.repeats, warmup_steps=args.warmup_steps,
                                       steps=args.steps, breakdown_steps=args.breakdown_steps, time=args.time,
                                       data_path=args.data_path, name=args.name, engine_args=engine_args)
        else:
            raise api.RequestError("spec: give a study spec file, or --model and --gpus for a quick sweep")
        if args.dry_run:
            return _study_dry_run(api, spec, args.profile)
        record, submitted = api.run_study(spec, args.profile, runs_dir=args.runs_dir,
                                          max_concurrent=args.max_concurrent,
                                          placement="allocation" if args.allocation else None, nodes=args.nodes,
                                          refresh_code=args.refresh_code, exclude=args.exclude,
                                          overlap_other_users=args.overlap_other_users)
        print(f"submitted {len(submitted)} of {len(record.points)} point(s)"
              + (f": {' '.join(submitted)}" if submitted else " (nothing missing or failed)"))
        print(f"study dir {record.study_dir}")
        if submitted and api.runs_in_foreground(record.scheduler):     # local points ran already
            status = api.study_status(record.study_dir)
            print(api.study_progress_line(status))
            for point in status.points:
                if point.reason:
                    print(f"{PROG}: point {point.id} failed: {point.reason}", file=sys.stderr)
            return 1 if status.counts["failed"] else 0
        return 0
    if args.action == "compare":
        return _cmd_compare(api, args)
    if args.action == "history":
        return _cmd_history(api, args)
    if args.action == "screen":
        return _cmd_screen(api, args, engine_args)
    if args.action == "reference":
        return _cmd_reference(api, args)
    if args.action == "init":
        return _cmd_init(api, args)
    if args.action == "schema":
        return _print_json(api.study_schema())
    if args.action == "project":
        return _cmd_project(api, args)
    study_dir = api.find_study(args.study, args.runs_dir, wait=args.action == "status" and args.watch)
    if args.action == "status":
        if args.watch:
            live = sys.stdout.isatty() and not args.json

            def show(status):
                line = api.study_progress_line(status)
                if live:       # back to the line's start and clear it: a shorter line leaves nothing behind
                    print(f"\r{line}{_CLEAR_TO_EOL}", end="", flush=True)
                elif not args.json:
                    print(line, flush=True)

            status = api.watch_study(study_dir, on_poll=show)
            if live:
                print()
        else:
            status = api.study_status(study_dir)
        if args.json:
            import json

            print(json.dumps(status.to_dict(), indent=2))
        else:
            if not args.watch:
                print(api.study_progress_line(status))
            for point in status.points:
                extra = f"  {point.reason}" if point.reason else ""
                print(f"  {point.id:<28} {point.state:<8} {point.job_id or '-':>10}{extra}")
        if args.watch and status.counts["missing"]:     # nobody submits them: waiting would never end
            print(f"{PROG}: error: study {study_dir}: {status.counts['missing']} of {len(status.points)} point(s) "
                  "missing and no `study run` is submitting them; `recsys-submit study run` with its spec "
                  f"({os.path.join(study_dir, 'study.yaml')}) and profile submits them", file=sys.stderr)
            return 1
        return 1 if status.counts["failed"] else 0
    report, paths = api.report_study(study_dir, out_dir=args.out, plot=args.plot)
    if args.json:
        with open(paths["json"]) as handle:        # the file written: the same document
            sys.stdout.write(handle.read())
        for kind, path in paths.items():
            print(f"wrote {kind} {path}", file=sys.stderr)
        for line in report["warnings"]:
            print(f"{PROG}: warning: {line}", file=sys.stderr)
    else:
        _print_written(paths, args.plot, report["warnings"])   # spread, baseline and provenance problems
    # a failed point or a baseline without throughput (failed, pending, unknown) is not a finished table
    return 1 if report["failures"] or report["baseline_problems"] else 0


def _print_written(paths, plot, warnings):
    """What `study report` and `study compare` wrote: the markdown, then every file, a missing
    optional plot and the warnings (stderr)."""
    print(open(paths["markdown"]).read(), end="")
    for kind, path in paths.items():
        print(f"wrote {kind} {path}")
    if "plot" not in paths and plot is None:
        print(f"{PROG}: no plot (matplotlib is not installed: pip install 'recsys-submit[plot]')",
              file=sys.stderr)
    for line in warnings:
        print(f"{PROG}: warning: {line}", file=sys.stderr)


def _cmd_compare(api, args):
    dirs = api.find_studies(args.studies, args.runs_dir)       # dirs, names, or names from `study history`
    comparison, paths = api.compare_studies(dirs, out_dir=args.out, plot=args.plot,
                                            fail_if_slower=args.fail_if_slower)
    _print_written(paths, args.plot, comparison["warnings"])   # failed and unfinished points: no verdict
    for line in comparison["slower"]:
        print(f"{PROG}: slower than {comparison['reference']} by more than {args.fail_if_slower:g}%: {line}",
              file=sys.stderr)
    # the regression gate, or a failed point (as `study report`): not a clean comparison
    return 1 if comparison["slower"] or comparison["failures"] else 0


def _cmd_history(api, args):
    """`study history`: the table (or JSON); with --plot the PNG of one point over time."""
    import json

    runs_dir = args.runs_dir or api.default_runs_dir()
    entries = api.study_history(runs_dir, model=args.model, profile=args.profile)
    if args.plot:
        path = args.out or os.path.join(runs_dir, f"history-{api.history_point(args.plot)}.png")
        api.plot_study_history(entries, args.plot, path)
        print(f"wrote plot {path}", file=sys.stderr if args.json else sys.stdout)
    print(json.dumps(entries, indent=2) if args.json else api.study_history_text(entries), end="\n" if args.json else "")
    return 0


def _cmd_screen(api, args, engine_args):
    """`study screen`: submit, wait, print the table (or JSON) and the --exclude line."""
    import json

    if args.screen:
        if args.nodes is not None or args.nodelist is not None:
            raise api.RequestError("--nodes/--nodelist: a new screen's; not with SCREEN_DIR (a screen submitted "
                                   "before)")
        screen = api.collect_screen(args.screen)
    else:
        screen = api.screen_nodes(args.profile, nodes=args.nodes, nodelist=args.nodelist, margin=args.margin,
                                  runs_dir=args.runs_dir, log=lambda line: print(f"{PROG}: {line}", file=sys.stderr),
                                  on_submitted=lambda d: print(f"screen dir {d}", flush=True,
                                                               file=sys.stderr if args.json else sys.stdout),
                                  model=args.model, gpus=args.gpus, steps=args.steps, warmup_steps=args.warmup_steps,
                                  engine_args=engine_args or None, network=args.network,
                                  network_sizes=args.network_sizes, network_iters=args.network_iters,
                                  network_time=args.network_time)
    if args.json:
        print(json.dumps(screen, indent=2))
    else:
        print(open(os.path.join(screen["screen_dir"], "screen.md")).read(), end="")
        if screen["exclude"]:
            print(screen["exclude"])        # the last line: pass it on to sbatch or a study's allocation
    return 1 if screen["flagged"] else 0


def _cmd_project(api, args):
    """`study project`: the table (or JSON) on stdout, the files written when --out is given."""
    import json

    record, paths = api.project_study(args.source, args.profile, args.gpus, variant=args.variant,
                                      step_ms=args.step_ms, published=args.published, out_dir=args.out,
                                      calibration_gpus=args.calibration_gpus,
                                      plot=args.plot,
                                      compute_curve=args.compute_curve.split(",") if args.compute_curve else None)
    print(json.dumps(record, indent=2) if args.json else api.projection_text(record), end="\n" if args.json else "")
    for kind, path in paths.items():
        print(f"wrote {kind} {path}", file=sys.stderr if args.json else sys.stdout)
    unfit = [str(p["gpus"]) for p in record["points"] if p["fits"] is False]
    if unfit:
        print(f"{PROG}: warning: the tables do not fit the GPUs' memory at {', '.join(unfit)} GPU(s)",
              file=sys.stderr)
    return 0


def _study_dry_run(api, spec, profile):
    """`study run --dry-run`: every check of a run, the points printed, nothing submitted."""
    import shlex

    points, matches, placeholder = api.dry_run_study(spec, profile)
    sizes = len({(p.nodes, p.gpus_per_node) for p in points})
    variants = len({p.variant_label for p in points})
    print(f"dry run: study {spec.name} on profile {profile}: {len(points)} point(s) ({sizes} size(s) x "
          f"{variants} variant(s) x {spec.repeats} repeat(s)), {len(matches)} matching an NVIDIA published row; "
          "nothing submitted")
    for p in points:
        row = matches.get(p.id)
        pub = f"published {row['throughput']:,.0f} ({row['table']})" if row else "published -"
        print(f"  {p.id:<40} {p.nodes} x {p.gpus_per_node}  batch/GPU {p.batch_per_gpu}  global {p.global_batch}  "
              f"{pub}  engine: {shlex.join(p.engine_args)}")
    if placeholder:
        print(f"{PROG}: warning: {placeholder}", file=sys.stderr)
    return 0


def _cmd_init(api, args):
    if args.list:
        for name, description in api.study_examples().items():
            print(f"{name:<20} {description}")
        return 0
    print(f"wrote {api.write_study_example(args.example, args.out)}")
    return 0


def _cmd_reference(api, args):
    if args.list:
        print(api.published_results_text(model=args.model, profile=args.profile), end="")
        return 0
    if not args.model or not args.profile:
        raise api.RequestError("--model/--profile: give both (or --list to see what is published)")
    _, text = api.reference_study(args.model, args.profile)
    if args.out:
        try:
            with open(args.out, "w") as handle:
                handle.write(text)
        except OSError as exc:
            raise api.RequestError(f"--out: cannot write {args.out!r}: {exc.strerror}") from None
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0
