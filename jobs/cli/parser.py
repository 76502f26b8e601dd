"""The `recsys-submit` parser: every command's flags, help and examples (built without jobs.api,
so `--help` and argument errors start fast on login nodes)."""

import argparse
import os

from jobs import tensorboard_cli
from jobs.vocabulary import BIND_MODES, DATASETS, MODELS, PAYLOADS, PREPROCESS_ENGINES, PREPROCESS_MODES
from jobs.vocabulary import KINDS as JOB_KINDS

PROG = "recsys-submit"
_CLEAR_TO_EOL = "\x1b[K"      # ANSI erase to end of line (the live progress line on a terminal)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump) and exit code 2."""

    def error(self, message):
        self.exit(2, f"{PROG}: error: {message}\n")


_EXAMPLES = {
    "train": ["recsys-submit train --profile local --model ncf -- --synthetic --max-steps 20",
              "recsys-submit train --profile mysite --model dlrm --nodes 8 --time 4:00:00 "
              "-- --data-path /data/criteo --amp",
              "recsys-submit train --profile mysite --model ncf --preprocess-from /raw/ml-20m "
              "--data-path /data/ml-20m --then-evaluate -- --amp"],
    "evaluate": ["recsys-submit evaluate --profile mysite --model dlrm -- --data-path /data/criteo "
                 "--checkpoint-dir /ckpt/dlrm"],
    "predict": ["recsys-submit predict --profile mysite --model wide_deep -- --data-path /data/new-rows "
                "--checkpoint-dir /ckpt/wd --predictions /results/wd-scores"],
    "benchmark": ["recsys-submit benchmark --profile mysite --model dlrm --nodes 2 -- --synthetic "
                  "--benchmark-steps 200",
                  "recsys-submit benchmark --profile ci --model hello --nodes 2   # the smoke payload"],
    "preprocess": ["recsys-submit preprocess --profile local --dataset movielens --input raw/ml --output data/ml",
                   "recsys-submit preprocess --profile mysite --dataset criteo --mode array --shards 24 "
                   "--input /raw/criteo --output /data/criteo",
                   "recsys-submit preprocess --profile mysite --dataset criteo --mode multinode --nodes 4 "
                   "--input /raw/criteo --output /data/criteo"],
}
_ENGINE_ARGS = ("Arguments after `--` go to the training engine (`python -m recsys.train --help`) and are "
                "checked by its parser before anything is submitted; --model and --run-mode are set "
                "from recsys-submit's own --model and the subcommand.")
_PREPROC_ARGS = "Arguments after `--` go to the preprocessing stage (`python -m preproc DATASET run --help`)."


def _epilog(kind):
    lines = "\n".join(f"  {example}" for example in _EXAMPLES[kind])
    tail = _PREPROC_ARGS if kind == "preprocess" else _ENGINE_ARGS
    return f"examples:\n{lines}\n\n{tail}"


class _Version(argparse.Action):
    """`--version`: the installed distribution's version, read only when asked (keeps --help fast)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        import importlib.metadata

        try:
            version = importlib.metadata.version("recsys-submit")
        except importlib.metadata.PackageNotFoundError:     # a checkout that was never installed
            version = "unknown (not installed)"
        print(f"{PROG} {version}")
        parser.exit(0)


def _sub(sub, name, help, description=None, epilog=None):
    """A subcommand parser with its own help text, description and examples."""
    return sub.add_parser(name, help=help, description=description or help, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _job_options(parser, kind, render=False):
    """The flags of one job subcommand (train | evaluate | benchmark | preprocess), or of
    `render KIND` (no submission flags): only those that apply to it, each with its description."""
    size = parser.add_argument_group("where and how big")
    add = size.add_argument
    add("--profile", default=os.environ.get("RECSYS_PROFILE", "local"),
        help="cluster profile name or YAML file (default $RECSYS_PROFILE or 'local')")
    add("--nodes", type=int, help="number of nodes (default: the profile's, else 1)"
        + ("; more than 1 only with --mode multinode" if kind == "preprocess" else ""))
    add("--gpus-per-node", type=int, help="GPUs per node (default: all of the profile's node)")
    add("--ntasks-per-node", type=int,
        help="ranks per node (default: one per GPU)" if kind != "preprocess" else "tasks per node (default 1)")
    add("--time", help="time limit in a Slurm format (MM, HH:MM:SS, D-HH:MM, ...; default: the profile's)")
    add("--name", help="job name (reduced to [A-Za-z0-9._-] for Slurm)")
    add("--python", help="interpreter the ranks run (default: the profile's, else this one)")
    what = parser.add_argument_group("what to run")
    if kind == "preprocess":
        what.add_argument("--dataset", metavar="{" + ",".join(DATASETS) + "}", help="dataset to preprocess (default: from --model)")
        what.add_argument("--model", metavar="{" + ",".join(MODELS) + "}", help="the model the data is for (implies --dataset)")
        what.add_argument("--mode", dest="preprocess_mode", default="single", metavar="{" + ",".join(PREPROCESS_MODES) + "}",
                          help="single: one node, local Spark (default); array: criteo as dictionary -> "
                          "transform array -> finalize jobs; multinode: a Spark standalone cluster over --nodes "
                          "(a dask cluster with --engine nvtabular)")
        what.add_argument("--input", required=False, help="raw input directory (required)")
        what.add_argument("--output", help="output directory: the dataset the engine reads (required)")
        what.add_argument("--shards", type=int, help="--mode array: number of transform tasks")
        what.add_argument("--engine", dest="preprocess_engine", default="spark",
                          metavar="{" + ",".join(PREPROCESS_ENGINES) + "}",
                          help="spark (default) or nvtabular (criteo, outbrain, and tabular, whose only engine it is; "
                          "single or multinode: a dask cluster over --nodes)")
        what.add_argument("--array-parallelism", "--parallelism", type=int, dest="array_parallelism",
                          help="--mode array: at most this many transform tasks at once")
    else:
        what.add_argument("--model", help=f"{' | '.join(MODELS)}, or hello (the built-in smoke payload)")
        what.add_argument("--payload", default="recsys", metavar="{" + ",".join(PAYLOADS) + "}",
                          help="recsys: the training engine (default); hello: the smoke payload; collectives: "
                               "the fabric micro-benchmark (python -m recsys.collectives, docs/profiles.md)")
        what.add_argument("--data-path", help="dataset directory, passed to the engine as --data-path"
                          + (" (with --preprocess-from: the preprocessing output)" if kind == "train" else ""))
        what.add_argument("--array", type=int, help="run N copies as a Slurm array (each gets RECSYS_TASK_INDEX)")
        what.add_argument("--array-parallelism", "--parallelism", type=int, dest="array_parallelism",
                          help="at most this many array tasks at once (%%N)")
    if kind == "train":
        chain = parser.add_argument_group("chaining: preprocess -> train -> evaluate (each waits afterok)")
        chain.add_argument("--preprocess-from", metavar="RAW",
                           help="first preprocess RAW into --data-path (the preprocessing flags below apply)")
        chain.add_argument("--dataset", metavar="{" + ",".join(DATASETS) + "}", help="with --preprocess-from: dataset (default from --model)")
        chain.add_argument("--mode", dest="preprocess_mode", default="single", metavar="{" + ",".join(PREPROCESS_MODES) + "}",
                           help="with --preprocess-from: preprocessing mode (single | array | multinode)")
        chain.add_argument("--shards", type=int, help="with --preprocess-from --mode array: transform tasks")
        chain.add_argument("--engine", dest="preprocess_engine", default="spark",
                           metavar="{" + ",".join(PREPROCESS_ENGINES) + "}",
                           help="with --preprocess-from: preprocessing engine (spark | nvtabular)")
        chain.add_argument("--then-evaluate", action="store_true",
                           help="after training, evaluate the trained checkpoint (afterok) with the same engine "
                           "arguments; without a --checkpoint-dir the chain keeps it in RUN_DIR/checkpoints-train")
    run = parser.add_argument_group("scheduling")
    run.add_argument("--after", action="append", default=[], metavar="JOBID",
                     help="start only after these existing job ids end well (afterok); comma-separated or "
                     "repeated; ids Slurm does not know are refused")
    run.add_argument("--bind", metavar="{" + ",".join(BIND_MODES) + "}", help="CPU/memory binding of each rank (default: the profile's)")
    run.add_argument("--ht", action="store_true", default=None, help="bind the hyperthread siblings too")
    run.add_argument("--signal-seconds", type=int,
                     help="send USR2 this many seconds before the time limit (checkpoint, then requeue)")
    run.add_argument("--no-requeue", action="store_true", help="do not requeue the job on USR2")
    run.add_argument("--runs-dir", help="parent of run directories (default $RECSYS_RUNS_DIR or ./recsys-runs)")
    if render:
        return
    run.add_argument("--keep-partial", action="store_true",
                     help="if a later job of a chain fails to submit, keep the earlier ones (default: cancel them)")
    run.add_argument("--dry-run", action="store_true", help="print the script(s), submit nothing")
    run.add_argument("--no-wait", action="store_true",
                     help="local profile: return at once instead of running in the foreground "
                     "(Slurm submissions never wait: follow them with `status --watch`)")


_RUN_HELP = "run directory or name under the runs dir (default: the newest run)"


def build_parser():
    parser = _Parser(prog=PROG, description="Submit recommender training and preprocessing jobs "
                     "to Slurm (or run them locally) from cluster profiles.",
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="examples:\n  recsys-submit train --profile local --model ncf -- --synthetic --max-steps 20\n"
                     "  recsys-submit train --profile ci --model dlrm --nodes 2 -- --synthetic --batch-size 4096\n"
                     "  recsys-submit status --watch\n\n"
                     "`recsys-submit COMMAND --help` shows the flags of one command.")
    parser.add_argument("--version", action=_Version, help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    prof = _sub(sub, "profiles", "list, show or validate cluster profiles",
                epilog="examples:\n  recsys-submit profiles list\n  recsys-submit profiles show dgxa100\n"
                "  recsys-submit profiles validate mysite.yaml")
    prof_sub = prof.add_subparsers(dest="action", required=True, parser_class=_Parser, metavar="ACTION")
    plist = prof_sub.add_parser("list", help="profiles on the search path", description="Profiles on the search path "
                                "(built-in, ~/.config/recsys-submit/profiles, $RECSYS_PROFILE_PATH).")
    plist.add_argument("--json", action="store_true", help="print JSON (docs/submitting.md, \"JSON output\")")
    show = prof_sub.add_parser("show", help="print a profile as loaded (defaults filled)",
                               description="Print a profile as loaded (defaults filled).")
    show.add_argument("profile", help="profile name or YAML file")
    show.add_argument("--json", action="store_true", help="print JSON instead of YAML")
    val = prof_sub.add_parser("validate", help="validate profile files (default: all on the path)",
                              description="Validate profile files: every problem of a file, one line each "
                              "(<file>: <key>: <problem>); exit 2 when any file has one.")
    val.add_argument("files", nargs="*", help="profile YAML files (default: every profile on the search path)")
    prof_sub.add_parser("schema", help="print the profile format as a JSON Schema (for an editor)",
                        description="Print the profile file format as a JSON Schema (draft 2020-12) for an "
                        "editor's YAML language server: completion, types and unknown keys (docs/profiles.md).")
    fab = prof_sub.add_parser("fabric", help="print a fabric: section from measured collectives",
                              description="Print a profile's fabric: section (docs/profiles.md, \"Fabric\") from "
                              "the fabric files `recsys-submit benchmark --payload collectives` wrote (a 1-node job: "
                              "intra_node; one rank per node: inter_node), or add nccl-tests output as measured "
                              "figures to a profile's own fabric.",
                              epilog="examples:\n  recsys-submit profiles fabric intra.yaml inter.yaml --profile ci\n"
                                     "  recsys-submit profiles fabric --profile mysite "
                                     "--nccl-tests intra_node:alltoall=a2a.txt\n"
                                     "  recsys-submit profiles fabric --profile ci --core-sharing n1x2-r*.yaml "
                                     "n2x1-r*.yaml n2x2-r*.yaml n4x2-r*.yaml")
    fab.add_argument("files", nargs="*", help="fabric files of python -m recsys.collectives")
    fab.add_argument("--profile", required=True, help="the profile the figures are for (its GPUs per node)")
    fab.add_argument("--nccl-tests", action="append", default=[], metavar="LEVEL:COLLECTIVE=FILE",
                     help="nccl-tests output to add as measured (e.g. intra_node:allreduce=ar.txt); repeatable")
    fab.add_argument("--core-sharing", action="store_true",
                     help="ranks sharing a host's cores: every file's layout (N ranks on M nodes, repeats: median "
                          "and range) also goes into the profile's fabric.core_sharing.exchange by rank count")

    render = _sub(sub, "render", "print (or write) the sbatch script(s) of a job command; submit nothing",
                  description="Print the sbatch script(s) a job command would submit, or write them with -o.",
                  epilog="examples:\n  recsys-submit render train --profile dgxa100 --model dlrm --nodes 2 "
                  "-- --data-path /data/criteo\n  recsys-submit render train --profile ci --model hello -o "
                  "scripts/ && sbatch scripts/main.sbatch")
    kinds = render.add_subparsers(dest="kind", required=True, parser_class=_Parser, metavar="KIND")
    for kind in JOB_KINDS:
        job = _sub(kinds, kind, f"the script(s) of `recsys-submit {kind}`", epilog=_epilog(kind))
        job.add_argument("-o", "--out-dir", metavar="DIR",
                         help="write the script(s) as DIR/<job key>.sbatch, DIR becoming the run directory "
                         "(logs in DIR/logs), so that `sbatch DIR/<key>.sbatch` runs them by hand")
        _job_options(job, kind, render=True)
    for kind in JOB_KINDS:
        article = "an" if kind[0] in "aeiou" else "a"
        text = f"submit {article} {kind} job" + (" (or a preprocess -> train -> evaluate chain)" if kind == "train" else "")
        _job_options(_sub(sub, kind, text, epilog=_epilog(kind)), kind)

    st = _sub(sub, "status", "state of every job of a run (one Slurm call per poll)",
              description="State of every job of a run, with each finished job's engine summary and, "
                          "for a failed one, the last error line of its failing rank.",
              epilog="examples:\n  recsys-submit status\n  recsys-submit status --watch\n"
                     "  recsys-submit status recsys-runs/train-dlrm-20260101-120000 --json")
    st.add_argument("run", nargs="?", help=_RUN_HELP)
    st.add_argument("--watch", action="store_true", help="poll with back-off until all jobs end; exit 1 if one failed")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.add_argument("--runs-dir", help="where runs are (default $RECSYS_RUNS_DIR or ./recsys-runs)")
    lg = _sub(sub, "logs", "print (or follow) a run's logs",
              epilog="examples:\n  recsys-submit logs\n  recsys-submit logs --follow --rank 0\n"
                     "  recsys-submit logs RUN --job evaluate")
    lg.add_argument("run", nargs="?", help=_RUN_HELP)
    lg.add_argument("--rank", type=int, help="one rank's output instead of the batch logs")
    lg.add_argument("--job", help="only this job key of the run (main, preprocess, train, evaluate, ...)")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    lg.add_argument("--json", action="store_true", help="print the index of the log files (path, bytes) as JSON "
                                                        "instead of their text")
    lg.add_argument("--runs-dir", help="where runs are (default $RECSYS_RUNS_DIR or ./recsys-runs)")
    _study_parser(sub)
    tensorboard_cli.add_parser(sub, _sub)
    for name, text in (("cancel", "cancel every job of a run"), ("requeue", "checkpoint, then requeue the running jobs of a run")):
        cmd = _sub(sub, name, text, epilog=f"examples:\n  recsys-submit {name}\n  recsys-submit {name} RUN")
        cmd.add_argument("run", nargs="?", help=_RUN_HELP)
        cmd.add_argument("--runs-dir", help="where runs are (default $RECSYS_RUNS_DIR or ./recsys-runs)")
    comp = _sub(sub, "completion", "print a shell completion script (bash or zsh)",
                epilog='examples:\n  eval "$(recsys-submit completion bash)"    # in ~/.bashrc\n'
                       '  eval "$(recsys-submit completion zsh)"     # in ~/.zshrc')
    comp.add_argument("shell", choices=("bash", "zsh"), help="the shell the script is for")
    return parser


def _study_parser(sub):
    study = _sub(sub, "study", "scaling studies: run a sweep spec, follow it, report it",
                 epilog="examples:\n  recsys-submit study init dlrm-strong      # writes dlrm-strong.yaml\n"
                        "  recsys-submit study run dlrm-strong.yaml --profile mysite\n"
                        "  recsys-submit study status --watch\n  recsys-submit study report\n"
                        "  recsys-submit study compare baseline candidate --fail-if-slower 10")
    st_sub = study.add_subparsers(dest="action", required=True, parser_class=_Parser, metavar="ACTION")
    run = _sub(st_sub, "run", "submit every missing or failed point of a study; print its dir",
               epilog="examples:\n  recsys-submit study run dlrm-strong.yaml --profile mysite    # `study init` wrote it\n"
                      "  recsys-submit study run --profile local --model ncf --gpus 1,2 --batch-size 512 "
                      "--steps 20\n\nArguments after `--` (quick sweeps) go to every point's engine.")
    run.add_argument("spec", nargs="?", help="study spec YAML (docs/studies.md); or give --model and --gpus")
    run.add_argument("--profile", default=os.environ.get("RECSYS_PROFILE", "local"),
                     help="cluster profile name or YAML file (default $RECSYS_PROFILE or 'local')")
    run.add_argument("--max-concurrent", type=int,
                     help="keep at most K points queued or running at once, waiting with a progress line "
                          "(default: 1 on a profile with shared_nodes, so points are measured alone; else no cap)")
    run.add_argument("--allocation", action="store_true",
                     help="run the points in one allocation, each on its first nodes (the spec's placement: "
                          "allocation); what it does not finish the next `study run` submits again")
    run.add_argument("--nodes", type=int, help="with --allocation: its size (default: the largest point's nodes)")
    run.add_argument("--exclude", metavar="HOSTLIST",
                     help="with --allocation: nodes it leaves out (e.g. node3,node7, or the --exclude=... line "
                          "`study screen` prints)")
    run.add_argument("--refresh-code", action="store_true",
                     help="copy the checkout's recsys/ and slurm/ and the profile into the study again: points "
                          "submitted from now run the new copy (recorded in study.json); by default every point "
                          "runs the copy made when the study began")
    run.add_argument("--overlap-other-users", action="store_true",
                     help="on a shared_nodes profile, submit even while another user's study job is queued or "
                          "running (Slurm's singleton is per user: the points may run beside it)")
    run.add_argument("--runs-dir", help="parent of the study dir (default $RECSYS_RUNS_DIR or ./recsys-runs)")
    run.add_argument("--dry-run", action="store_true",
                     help="check the spec and every point against the profile and the engine, print the points "
                          "(and the NVIDIA published row each matches); submit nothing, no scheduler needed")
    quick = run.add_argument_group("a quick sweep without a spec file")
    quick.add_argument("--model", help=" | ".join(MODELS))
    quick.add_argument("--gpus", help="GPU counts, e.g. 1,2,4,8")
    quick.add_argument("--scaling", default="strong", help="strong (fixed global batch) | weak (fixed batch per GPU)")
    quick.add_argument("--batch-size", type=int, help="strong: global batch; weak: batch per GPU")
    quick.add_argument("--variant", action="append", default=[], help="KEY=V1,V2 crossed with the points")
    quick.add_argument("--repeats", type=int, help="runs of every point (the report shows their spread)")
    quick.add_argument("--warmup-steps", type=int, help="steps left out of the throughput")
    quick.add_argument("--steps", type=int, help="timed steps per point")
    quick.add_argument("--breakdown-steps", type=int,
                       help="split steps after the timed ones, timing each phase (default 20; 0: none)")
    quick.add_argument("--time", help="time limit of each point's job")
    quick.add_argument("--data-path", help="dataset directory (default: synthetic data)")
    quick.add_argument("--name", help="study name (its directory under the runs dir)")
    _sub(st_sub, "schema", "print the study spec format as a JSON Schema (for an editor)",
         description="Print the study spec format as a JSON Schema (draft 2020-12) for an editor's YAML "
                     "language server: completion, each key's meaning, types (docs/studies.md).")
    init = _sub(st_sub, "init", "write an example study spec shipped with the package, to edit and run",
                epilog="examples:\n  recsys-submit study init --list\n  recsys-submit study init dlrm-strong\n"
                       "  recsys-submit study run dlrm-strong.yaml --profile mysite --dry-run")
    init.add_argument("example", nargs="?", default="dlrm-strong", help="the example's name (default dlrm-strong)")
    init.add_argument("--out", help="where to write it (default ./EXAMPLE.yaml; an existing file is never replaced)")
    init.add_argument("--list", action="store_true", help="list the examples instead")
    status = _sub(st_sub, "status", "points done / running / pending / failed (one Slurm call per poll)",
                  epilog="examples:\n  recsys-submit study status\n  recsys-submit study status STUDY --watch")
    status.add_argument("study", nargs="?", help="study dir or name (default: newest)")
    status.add_argument("--watch", action="store_true", help="a live progress bar until no point is queued")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument("--runs-dir", help="where studies are (default $RECSYS_RUNS_DIR or ./recsys-runs)")
    report = _sub(st_sub, "report", "scaling table (markdown, CSV, JSON) and plot (PNG)",
                  epilog="examples:\n  recsys-submit study report\n  recsys-submit study report STUDY --out report/")
    report.add_argument("study", nargs="?", help="study dir or name (default: newest)")
    report.add_argument("--out", help="directory for scaling.{md,csv,json,png} (default STUDY/report)")
    plot = report.add_mutually_exclusive_group()
    plot.add_argument("--plot", action="store_true", default=None, help="require the PNG (needs matplotlib)")
    plot.add_argument("--no-plot", dest="plot", action="store_false", help="table only")
    report.add_argument("--json", action="store_true", help="print the report (scaling.json) instead of the table; "
                                                            "what was written goes to stderr")
    report.add_argument("--runs-dir", help="where studies are (default $RECSYS_RUNS_DIR or ./recsys-runs)")
    reference = _sub(st_sub, "reference", "write the study spec that reproduces an NVIDIA published table",
                     epilog="examples:\n  recsys-submit study reference --model wide_deep --profile dgxa100 "
                            "--out wd.yaml\n  recsys-submit study reference --list\n\nThe spec's data_path is a "
                            "placeholder: set it, then `study run wd.yaml --profile mysite`; `study report` shows "
                            "measured / published per point (docs/studies.md, \"Measured vs published\").")
    reference.add_argument("--model", choices=MODELS, help="the model whose published table to reproduce")
    reference.add_argument("--profile", help="cluster profile name or YAML file (its node type is the platform: "
                                             "dgxa100, dgx1, dgx2)")
    reference.add_argument("--out", help="write the spec to this file (default: stdout)")
    reference.add_argument("--list", action="store_true",
                           help="print what NVIDIA published, for which profiles (filtered by --model/--profile)")
    project = _sub(st_sub, "project", "project a study onto GPU counts it never ran: the band per count",
                   epilog="examples:\n  recsys-submit study project STUDY --profile dgxa100-pod --gpus 8,16,64\n"
                          "  recsys-submit study project docs/studies/dlrm-strong.yaml --profile dgxa100 "
                          "--gpus 1,8,64 --step-ms 25 --json\n\nCalibrated on the study's smallest measured point "
                          "(or --step-ms, one GPU's step time), the engine's\nown placement and byte counts and the "
                          "profile's fabric (docs/studies.md, \"Projecting a study\").")
    project.add_argument("source", metavar="SPEC|STUDY_DIR", help="a study directory or a study spec file")
    project.add_argument("--profile", required=True, help="the target profile (name or YAML file); it needs a "
                                                          "fabric: section")
    project.add_argument("--gpus", required=True, help="GPU counts to project, e.g. 8,16,64")
    project.add_argument("--step-ms", type=float, help="calibrate on this step time (ms) at the spec's batch on one "
                                                       "GPU (or --calibration-gpus N) instead of the study's "
                                                       "measured point")
    project.add_argument("--calibration-gpus", type=int, metavar="N",
                         help="the GPU count --step-ms was timed at (default 1; a model that does not fit one GPU: "
                              "where it fits); its own exchanges at N are taken out before scaling")
    project.add_argument("--published", action="store_true",
                         help="calibrate on NVIDIA's published 1-GPU row of the model at the spec's batch, "
                              "precision and XLA on the profile's platform")
    project.add_argument("--compute-curve", metavar="PATH[,PATH]",
                         help="one GPU measured at several batches (a compute-curve file or a study directory "
                              "whose smallest point is 1 GPU): compute follows this curve with the per-GPU batch "
                              "instead of shrinking in proportion")
    project.add_argument("--variant", help="the variant label to project (default: the first)")
    project.add_argument("--out", help="write projection.{md,csv,json,png} here")
    project.add_argument("--json", action="store_true", help="print the projection as JSON")
    pplot = project.add_mutually_exclusive_group()
    pplot.add_argument("--plot", action="store_true", default=None, help="require the PNG (needs matplotlib)")
    pplot.add_argument("--no-plot", dest="plot", action="store_false", help="tables only")
    compare = _sub(st_sub, "compare", "compare studies with the first, point by point: ratio and a verdict",
                   epilog="examples:\n  recsys-submit study compare baseline candidate\n"
                          "  recsys-submit study compare baseline candidate --fail-if-slower 10   # CI gate\n"
                          "  recsys-submit study compare A B C --out compare/ --no-plot\n\n"
                          "Points are matched by (GPUs, nodes, variant); each later study is tested against the "
                          "first\n(two-sided, alpha 0.05; 3 or more repeats on each side, 4 or more for a verdict).")
    compare.add_argument("studies", nargs="+", metavar="STUDY",
                         help="study dirs or names (from the runs dir or `study history`), at least two; "
                              "the first is the reference")
    compare.add_argument("--out", help="directory for compare.{md,csv,json,png} "
                                       "(default FIRST_STUDY/compare/vs-<other names>)")
    compare.add_argument("--fail-if-slower", type=float, metavar="PCT",
                         help="exit 1 when a point is slower than the first study by more than PCT %% "
                              "and the test says slower")
    cplot = compare.add_mutually_exclusive_group()
    cplot.add_argument("--plot", action="store_true", default=None, help="require the PNG (needs matplotlib)")
    cplot.add_argument("--no-plot", dest="plot", action="store_false", help="tables only")
    compare.add_argument("--runs-dir", help="where studies are (default $RECSYS_RUNS_DIR or ./recsys-runs)")
    history = _sub(st_sub, "history", "the finished studies of the runs dir over time; a point's throughput plot",
                   epilog="examples:\n  recsys-submit study history\n  recsys-submit study history --model ncf "
                          "--profile ci --json\n  recsys-submit study history --model ncf --plot g2-n1x2\n\n"
                          "A study is listed once its report is written (`study report`); `study compare` takes "
                          "the names listed.")
    history.add_argument("--model", help="only studies of this model")
    history.add_argument("--profile", help="only studies on this profile")
    history.add_argument("--json", action="store_true", help="print the entries as JSON")
    history.add_argument("--plot", metavar="POINT",
                         help="write POINT's throughput over the listed studies (e.g. g2-n1x2) as a PNG, each "
                              "marked with its compare verdict against the study before it (needs matplotlib)")
    history.add_argument("--out", help="the plot's file (default RUNS_DIR/history-POINT.png)")
    history.add_argument("--runs-dir", help="where studies are (default $RECSYS_RUNS_DIR or ./recsys-runs)")
    screen = _sub(st_sub, "screen", "the same one-node benchmark on every node of one allocation; slow nodes flagged",
                  epilog="examples:\n  recsys-submit study screen --profile mysite --nodes 16\n"
                         "  recsys-submit study screen --profile ci --nodelist 'node[1-4]' --margin 0.2\n"
                         "  recsys-submit study screen --profile mysite --nodes 16 --network   # and every node pair's link\n\n"
                         "Waits for the allocation, prints the per-node table and an --exclude= line of the nodes "
                         "more than\nthe margin below the median (exit 1 when a node is flagged or failed). "
                         "Arguments after `--` go to the engine.")
    screen.add_argument("screen", nargs="?", metavar="SCREEN_DIR",
                        help="a screen submitted before (e.g. one whose wait was interrupted): wait for it and "
                             "write its table; nothing is submitted")
    screen.add_argument("--profile", default=os.environ.get("RECSYS_PROFILE", "local"),
                        help="cluster profile name or YAML file (default $RECSYS_PROFILE or 'local')")
    where = screen.add_mutually_exclusive_group()
    where.add_argument("--nodes", type=int, help="screen N nodes, whichever Slurm gives")
    where.add_argument("--nodelist", help="screen these nodes (a Slurm host list, e.g. node[1-4])")
    screen.add_argument("--margin", type=float, default=0.1,
                        help="flag a node more than this fraction below the median throughput (default 0.1)")
    screen.add_argument("--model", help="the benchmark's model (default ncf, a small fixed size)")
    screen.add_argument("--gpus", type=int, help="GPUs of each node to use (default: all of the node's)")
    screen.add_argument("--steps", type=int, help="timed steps (default 100)")
    screen.add_argument("--warmup-steps", type=int, help="steps left out of the throughput (default 10)")
    net = screen.add_argument_group("the network (--network)")
    net.add_argument("--network", action="store_true",
                     help="then the fabric benchmark (python -m recsys.collectives) between every pair of the nodes, "
                          "pairs on disjoint nodes at once, and across all of them; a node slow with most of its "
                          "partners joins the --exclude line (3 or more nodes)")
    net.add_argument("--network-sizes", help="buffer sizes of the pairs' allreduce and alltoall "
                                             "(default 4M,64M)")
    net.add_argument("--network-iters", type=int, help="timed iterations per size (default 10)")
    net.add_argument("--network-time", type=int, metavar="MINUTES",
                     help="each pair's own step limit (default 3)")
    screen.add_argument("--json", action="store_true", help="print screen.json instead of the table")
    screen.add_argument("--runs-dir", help="parent of the screen's dir (default $RECSYS_RUNS_DIR or ./recsys-runs)")


def _parser_for(own):
    """The whole parser, or for `study ...` the study commands alone: they parse the same, and
    building every job command's options costs a study run 3-9 ms."""
    if own[:1] != ["study"]:
        return build_parser()
    parser = _Parser(prog=PROG)
    _study_parser(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
    return parser
