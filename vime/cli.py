"""`vime` command line. Exit codes: 0 ok, 1 problems in the spec (`doctor`: a package the spec
needs does not import), 2 usage, 3 internal error,
4 a job run here (`submit --local`, `--ray-address`) failed or was cancelled; such a job
stopped by Ctrl-C exits 130, by SIGHUP 129, by SIGTERM 143 (128 + the signal)."""

from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback
from pathlib import Path

from vime import __version__, render
from vime.words import plural

EXIT_OK, EXIT_SPEC, EXIT_USAGE, EXIT_INTERNAL, EXIT_JOB_FAILED = 0, 1, 2, 3, 4


class UsageError(Exception):
    """Bad command line or unreadable files: exit 2, one line, no traceback."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors: exit 2, never a traceback
        self.print_usage(sys.stderr)
        print(f"vime: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _spec_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="the experiment spec (TOML)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key, TOML value syntax (repeatable)")
    parser.add_argument("--strict", action="store_true", help="treat warnings as errors")
    parser.add_argument("--format", choices=("human", "concise"), default="human",
                        help="how diagnostics are printed (default: human)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vime", description="Plan, check and compile RL post-training specs.")
    parser.add_argument("--version", action="version", version=f"vime {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    plan = verbs.add_parser("plan", help="check a spec and show its layout; writes nothing")
    _spec_options(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    compile_ = verbs.add_parser("compile", help="check, plan and write the build folder")
    _spec_options(compile_)
    compile_.add_argument("-o", "--output", help="build folder (default build/<experiment.name>)")
    explain = verbs.add_parser("explain", help="the long explanation of a diagnostic code")
    explain.add_argument("code", nargs="?", help="e.g. V201; without it, list every code")
    submit = verbs.add_parser("submit", help="compile, then submit one Slurm job that starts Ray "
                              "on every node and runs the runtime")
    _spec_options(submit)
    where = submit.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true",
                       help="run the same job on this machine, one process per node, no Slurm")
    where.add_argument("--ray-address", metavar="ADDR",
                       help="run the driver on this running Ray cluster (after checking its GPUs)")
    where.add_argument("--dry-run", action="store_true",
                       help="print the sbatch script and the Ray port plan; submit nothing")
    submit.add_argument("--fresh", action="store_true",
                        help="start a new run (experiment.name-2, -3, ...) beside the old one "
                        "instead of resuming its checkpoint; nothing is deleted")
    submit.add_argument("--quiet", action="store_true",
                        help="--local / --ray-address: no progress, only the outcome; "
                        "Slurm: print only the job id")
    submit.add_argument("--detach", action="store_true",
                        help="--local / --ray-address: run the job in the background, apart "
                        "from this terminal (as a Slurm job is); `vime logs -f`, `vime status` "
                        "and `vime cancel` reach it by its id")
    submit.add_argument("--as-job", help=argparse.SUPPRESS)  # the detached launcher's job id
    status = verbs.add_parser("status", help="state of a submitted job (squeue, then sacct)")
    status.add_argument("job", help="Slurm job id or job folder")
    logs = verbs.add_parser("logs", help="a node's log of a submitted job")
    logs.add_argument("job", help="Slurm job id or job folder")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="follow until the job ends; node 0: its progress and outcome, as "
                      "`submit --local` shows them (exit 0 succeeded, 4 not)")
    logs.add_argument("--node", type=int, default=0, metavar="N",
                      help="which node (default 0: the head, which runs the driver)")
    logs.add_argument("--raw", action="store_true", help="with -f: the log itself, not progress")
    logs.add_argument("--quiet", action="store_true", help="with -f: only the outcome")
    cancel = verbs.add_parser("cancel", help="cancel a submitted job; its nodes stop their Ray")
    cancel.add_argument("job", help="Slurm job id or job folder")
    convert = verbs.add_parser("convert", help="HF safetensors <-> Megatron torch_dist with the "
                               "spec's architecture and parallel layout (runs here: one GPU per rank, or one "
                               "CPU process per rank on a machine without GPUs)")
    _spec_options(convert)
    convert.add_argument("--to", choices=("torch_dist", "hf"), default="torch_dist",
                         help="torch_dist: model.hf_checkpoint -> model.torch_dist_checkpoint; "
                         "hf: back (default target: <torch_dist_checkpoint>_hf)")
    convert.add_argument("-o", "--output", help="target folder (never overwritten)")
    convert.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    convert.add_argument("--single-gpu", action="store_true",
                         help="save with tp = ep = 1 from one process (megatron-core reshards "
                              "it on load, slowly for expert parallelism)")
    imports = verbs.add_parser("import", help="an upstream vime or slime launch script as a "
                               "spec, read without running it (docs/import.md)")
    imports.add_argument("script", help="the launch script (with --argv: a file of train.py's "
                         "flags, - for stdin)")
    imports.add_argument("-o", "--output", help="write the spec here (default: stdout)")
    imports.add_argument("--force", action="store_true", help="overwrite the -o file")
    imports.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                         help="a variable the script reads from its environment (repeatable)")
    imports.add_argument("--argv", action="store_true",
                         help="SCRIPT is the flag list train.py received, not a script")
    imports.add_argument("--repo-root", metavar="DIR",
                         help="the checkout the script's `source` paths are in (e.g. what "
                         "/root/slime is on the cluster); default: the folders above the script")
    report = verbs.add_parser("report", help="the run's curves (reward, eval, response "
                              "length, log-prob gap, route match, time per phase) as one HTML "
                              "file in the job folder")
    report.add_argument("job", help="Slurm job id or job folder")
    report.add_argument("-o", "--output", help="the file to write (default <job folder>/"
                        "report.html)")
    doctor = verbs.add_parser("doctor", help="which of torch, Ray, vLLM, megatron-core, "
                              "Transformer Engine, wandb and TensorBoard import here, with "
                              "versions, and which the spec needs")
    doctor.add_argument("spec", nargs="?", help="the experiment spec (TOML) whose needs to check")
    doctor.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key, TOML value syntax (repeatable)")
    doctor.add_argument("--no-import", action="store_true",
                        help="read package metadata only; import nothing (fast)")
    return parser


def cmd_import(args) -> int:
    """Translate a launch script into a spec (stdout or -o); return 0, or 1 when the script
    holds something the spec cannot say.

    Raises:
        UsageError: the script cannot be read, or -o exists without --force
            (main() prints it and exits 2).
    """
    from vime.importer import cli as import_cli

    try:
        return import_cli.run(args.script, args.output, args.force, args.env, args.argv,
                              args.repo_root)
    except import_cli.ImportUsageError as err:
        raise UsageError(str(err)) from None


def _load(args, strict: bool | None = None) -> tuple:
    """Run the pipeline on args.spec with args.sets; return (source, pipeline result).
    strict: whether warnings are errors (None: args.strict).

    Raises:
        UsageError: the spec file cannot be read.
    """
    from vime import pipeline

    path = Path(args.spec)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UsageError(f"cannot read spec {args.spec}: {err.strerror}") from None
    # V708, V709 judge the checkpoint a submit would resume from: `submit --fresh` leaves it
    # where it is, and `convert` writes the initial weights, which do not load it
    resume = args.verb != "convert" and not getattr(args, "fresh", False)
    result = pipeline.run_file(args.spec, data, args.sets, path.resolve().parent,
                               args.strict if strict is None else strict, resume=resume)
    return result.source, result


def _print_diagnostics(result, fmt: str) -> None:
    formatter = render.human if fmt == "human" else render.concise
    for diag in result.diagnostics:
        sys.stderr.write(formatter(diag) + ("\n" if fmt == "human" else ""))
    if result.diagnostics:
        sys.stderr.write(render.summary(result.diagnostics))


def cmd_plan(args) -> int:
    """Print the spec's plan (text, or JSON with --json) and its diagnostics; write nothing.
    Return 0, or 1 when the spec has errors.

    Raises:
        UsageError: the spec file cannot be read (main() prints it and exits 2).
    """
    from vime.emit import plan_json

    source, result = _load(args)
    if args.json:
        obj = plan_json.plan_object(source.name, result.diagnostics, result.spec,
                                    result.plan or result.sketch)
        if result.sketch is not None:
            obj["planning_only"] = True
        plan_json.write(obj, sys.stdout)
        return EXIT_OK if result.ok else EXIT_SPEC
    if result.plan is not None or result.sketch is not None:
        if result.sketch is not None:
            sys.stdout.write(render.PLANNING_ONLY)
        sys.stdout.write(render.plan_text(result.plan or result.sketch))
        if result.diagnostics:
            sys.stdout.write("\n")
    _print_diagnostics(result, args.format)
    return EXIT_OK if result.ok else EXIT_SPEC


def cmd_compile(args) -> int:
    """Write the build folder (resolved.toml, plan.json, argument files, job.sbatch); return
    0, 1 when the spec has errors (nothing written), or 2 when the folder cannot be written.

    Raises:
        UsageError: the spec file cannot be read (main() prints it and exits 2).
    """
    from vime.emit import build, plan_json

    source, result = _load(args)
    _print_diagnostics(result, args.format)
    if not result.ok:
        return EXIT_SPEC
    spec = result.spec
    target = Path(args.output) if args.output else Path("build") / spec.experiment.name
    obj = plan_json.plan_object(source.name, result.diagnostics, spec, result.plan)
    try:
        build.write(target, build.files(result.plan, source.name, source.text, obj, str(target),
                                        python=sys.executable))
    except (build.BuildError, OSError) as err:
        print(f"vime: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {target}/: resolved.toml plan.json megatron.args vllm.args job.sbatch README.txt")
    return EXIT_OK


def cmd_explain(args) -> int:
    """Print a diagnostic code's explanation, or every code with its one-line summary;
    return 0, or 2 for an unknown code."""
    from vime import check

    if not args.code:
        for code, (name, text) in sorted(check.STAGE_CODES.items()):
            print(f"{code}  {name:<36} {text.splitlines()[0]}")
        for code, registered in sorted(check.RULES.items()):
            print(f"{code}  {registered.name:<36} {registered.summary}")
        from vime.importer.table import CODES

        for code, (name, _severity, text) in sorted(CODES.items()):
            print(f"{code}  {name:<36} {text.splitlines()[0]}")
        return EXIT_OK
    text = check.explain(args.code)
    if text is None:
        from vime.importer.table import explain as import_explain

        text = import_explain(args.code)
    if text is None:
        print(f"vime: error: no diagnostic code {args.code!r} (`vime explain` lists them)",
              file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(text)
    return EXIT_OK


def cmd_submit(args) -> int:
    """Compile, then start the job: on Slurm, here (--local) or on a Ray cluster
    (--ray-address); return 0, 1 when the spec has errors, or 4 when a job run here fails.

    Raises:
        UsageError: the spec cannot be read, the checkpoint or submission is refused, or a
            detached launcher fails to start (main() prints it and exits 2).
    """
    from vime.diagnostics import finalize
    from vime.emit import plan_json
    from vime.launch import resume, shared, submit

    # warnings become errors (--strict) once the launcher's own checks have joined them, so
    # that one submit reports them all
    source, result = _load(args, strict=False)
    launcher = "local" if args.local else "ray-address" if args.ray_address else "slurm"
    if not result.ok:
        result.diagnostics = finalize(result.diagnostics, args.strict)
    else:
        from vime.check import files
        from vime.check.cluster import hidden_in_local_environment

        # the checkpoint folder where this launcher's job reads it (V730)
        default_driver = (os.environ.get("VIME_DRIVER") or submit.DEFAULT_DRIVER) == \
            submit.DEFAULT_DRIVER
        said = files.at_submit(result.spec, launcher, default_driver)
        said += files.prompt_files_at_submit(result.spec, launcher, default_driver)  # V732
        if not default_driver:  # another driver (VIME_DRIVER) may load neither of them
            result.diagnostics = [d for d in result.diagnostics if d.code not in ("V730", "V732")]
        if launcher == "local":  # and the GPUs this machine's environment shows (V707)
            said += hidden_in_local_environment(result.spec, os.environ)
        result.diagnostics = finalize([*(d for d in result.diagnostics if not any(
            s.code == d.code and s.path == d.path for s in said)), *said], args.strict)
        if launcher != "local":  # paths the nodes need, on this machine only (V701)
            python = sys.executable if launcher == "slurm" else None  # a Ray cluster: its own
            result.diagnostics = shared.with_unshared(result, source.name, python, args.strict)
    _print_diagnostics(result, args.format)
    if not result.ok:
        return EXIT_SPEC
    try:
        prepared = submit.prepare(result, source.name, source.text,
                                  plan_json.plan_object(source.name, result.diagnostics,
                                                        result.spec, result.plan), launcher,
                                  ray_address=args.ray_address)
        if args.dry_run:
            sys.stdout.write(submit.dry_run_text(prepared))
            return EXIT_OK
        if args.fresh:
            source, result, prepared = _fresh(args, prepared, launcher)
        if not args.as_job:  # the detached launcher takes the lock itself, under its id
            # before the start point: a live job's checkpoints are not this run's to judge
            submit.check_lock(prepared)
        spec = prepared.plan.spec
        start = resume.start_point(spec, prepared.experiment_dir)
        if start.problem:  # the job would stop on it after Ray's start
            raise UsageError(start.describe(spec.rollout.num_rollout))
        if start.next_rollout >= spec.rollout.num_rollout:
            # said before Ray starts or the job queues (tests/launch/test_start.py)
            print(f"vime: {spec.experiment.name} is finished: its checkpoint "
                  f"{start.checkpoint} is at rollout {start.next_rollout} of "
                  f"rollout.num_rollout = {spec.rollout.num_rollout}; nothing to run. Raise "
                  "rollout.num_rollout to train on, or --fresh for a new run beside it.")
            return EXIT_OK
        if launcher == "slurm":
            folder = submit.submit_slurm(prepared)
            return _submitted(folder, result, start, args.quiet)
        _preflight_here(prepared, source, args.ray_address)
        if args.detach:
            return _detach(args, prepared, start, launcher)
        return _run_here(args, prepared, start, launcher)
    except submit.SubmitError as err:
        raise UsageError(str(err)) from None


def _fresh(args, prepared, launcher: str):
    """--fresh: the same spec under experiment.name = <name>-<n>, a new run folder beside
    the old one; nothing of the old run is touched."""
    from vime.emit import plan_json
    from vime.launch import resume, submit

    spec = prepared.plan.spec
    if spec.model.load or spec.model.save:
        start = resume.start_point(spec, prepared.experiment_dir)
        if start.checkpoint is not None:
            key = "model.load" if spec.model.load else "model.save"
            raise UsageError(f"--fresh: {key} = {start.load_dir} holds checkpoint "
                             f"{start.checkpoint.name}, which every run of this spec resumes "
                             f"from; set {key} to another folder to start fresh")
    name = resume.fresh_name(str(prepared.experiment_dir.parent), spec.experiment.name)
    args.sets = [*args.sets, f'experiment.name="{name}"']
    source, result = _load(args)
    if not result.ok:  # the name is valid and unique: nothing else changed
        _print_diagnostics(result, args.format)
        raise UsageError("--fresh: the spec did not compile under its new name")
    prepared = submit.prepare(result, source.name, source.text, plan_json.plan_object(
        source.name, result.diagnostics, result.spec, result.plan), launcher,
        ray_address=args.ray_address)
    print(f"vime: --fresh: a new run {name} in {prepared.experiment_dir} (the old one stays; "
          f"resume this one with {prepared.info['resume']})", flush=True)
    return source, result, prepared


def _preflight_here(prepared, source, ray_address: str | None) -> None:
    """What the job would fail on after Ray's start, checked before it."""
    from vime.launch import local, submit

    if ray_address:
        problem = local.unreachable(ray_address)
        if problem:
            raise UsageError(problem)
        return
    if prepared.launch["driver"] != submit.DEFAULT_DRIVER:
        return  # another driver (VIME_DRIVER) may read no prompts
    from runtime.node.preflight import prompt_data_problem, save_dir_problem

    # the head node's own checks and messages (runtime/node/preflight.py), from the same folders
    spec = prepared.plan.spec
    problem = (prompt_data_problem(spec.data.prompt_data, Path(source.name).resolve().parent,
                                   spec.data.input_key, spec.data.label_key)
               or save_dir_problem(spec.model.save, Path(source.name).resolve().parent,
                                   prepared.experiment_dir,
                                   hf=spec.checkpoint.save_hf_interval > 0))
    if problem:
        raise UsageError(problem)


def _submitted(folder, result, start, quiet: bool) -> int:
    job_id = folder.info["job_id"]
    if quiet:  # for scripts: job=$(vime submit --quiet SPEC)
        print(job_id)
        return EXIT_OK
    print(f"submitted job {job_id}: {plural(result.spec.cluster.nodes, 'node')} × "
          f"{plural(result.spec.cluster.gpus_per_node, 'GPU')}\n"
          f"job folder  {folder.path}\n"
          f"logs        {folder.path / 'logs'}/node-0.log (head and driver), node-<i>.log\n"
          f"start       {start.describe(result.spec.rollout.num_rollout)}\n"
          f"follow      vime status {job_id}\n"
          f"progress    vime logs -f {job_id}")
    return EXIT_OK


def _detach(args, prepared, start, launcher: str) -> int:
    """--detach: the job runs on under a launcher of its own (vime/launch/detach.py); print
    where to follow it.

    Raises:
        SubmitError: the launcher did not start the job (cmd_submit makes it a UsageError).
    """
    from vime.launch import detach

    job_id, folder, pid = detach.detach(prepared, launcher, args.spec, args.sets, args.strict,
                                        args.ray_address)
    spec = prepared.plan.spec
    print(f"vime: job {job_id}: {spec.experiment.name}, detached (launcher pid {pid})\n"
          f"  folder  {folder}\n"
          f"  {start.describe(spec.rollout.num_rollout)}\n"
          f"  follow  vime logs -f {job_id}\n"
          f"  status  vime status {job_id}\n"
          f"  stop    vime cancel {job_id}")
    return EXIT_OK


def _run_here(args, prepared, start, launcher: str) -> int:
    from vime.launch import local, progress, resume, submit

    spec = prepared.plan.spec
    total = spec.rollout.num_rollout
    quiet = args.quiet
    shown = progress.Progress(prepared.experiment_dir, total, quiet=quiet)  # until on_start
    layout = local.layout_words(
        spec.cluster.nodes, spec.cluster.gpus_per_node,
        torch_pair=spec.train.backend == spec.inference.backend == "torch",
        here=launcher == "local" or local.on_this_machine(args.ray_address))

    def on_start(folder) -> None:
        nonlocal shown
        shown = progress.Progress(folder.path, total, quiet=quiet)
        where = "here, one process per node" if launcher == "local" else \
            f"on the Ray cluster at {args.ray_address}"
        shown.say(f"vime: job {folder.info['job_id']}: {spec.experiment.name}, "
                  f"{layout}, {where}\n"
                  f"  folder  {folder.path}\n"
                  f"  logs    {folder.path / 'logs'}/node-0.log (head and driver)\n"
                  f"  {start.describe(total)}")

    def on_poll() -> None:
        shown.poll()

    folder, code = (submit.submit_local(prepared, on_start, on_poll, args.as_job) if args.local
                    else submit.submit_attached(prepared, args.ray_address, on_start, on_poll,
                                                args.as_job))
    job_id = folder.info["job_id"]
    outcome = folder.read_json("outcome.json") or {}
    state = outcome.get("state") or ("succeeded" if code == 0 else "failed")
    after = resume.start_point(spec, prepared.experiment_dir) if state in progress.STOPPED \
        else None
    print(shown.ending(job_id, state, outcome.get("error"), folder.path / "logs" / "node-0.log",
                       after, resume_with=folder.info.get("resume")))
    if not quiet or state != "succeeded":
        print(f"job folder  {folder.path}")
    # a local or attached job has ended by now: there is nothing left to follow
    if code == 0:
        return EXIT_OK
    return code if code in (129, 130, 143) else EXIT_JOB_FAILED


def cmd_convert(args) -> int:
    """Print and run the checkpoint conversion (HF <-> torch_dist) for the spec's layout;
    return 0, 1 when the spec has errors, or 3 when the conversion fails.

    Raises:
        UsageError: no target folder is set, there is nothing to convert back, or the
            target exists (main() prints it and exits 2).
    """
    import shlex
    import subprocess

    from vime import convert

    _source, result = _load(args)
    _print_diagnostics(result, args.format)
    if not result.ok:
        return EXIT_SPEC
    try:
        planned = convert.conversion(result.spec, args.to, args.output, args.single_gpu)
    except convert.ConvertError as err:
        raise UsageError(str(err)) from None
    print(" ".join(shlex.quote(part) for part in planned.command))
    if args.dry_run:
        return EXIT_OK
    completed = subprocess.run(planned.command, check=False)
    return EXIT_OK if completed.returncode == 0 else EXIT_INTERNAL


def cmd_report(args) -> int:
    """Write the report of a job's run and print where it is; return 0.
    Raises:
        UsageError: the job is not found or the report cannot be written (main() prints
            it and exits 2).
    """
    from vime import report
    from vime.launch import follow, slurm

    try:
        folder = follow.find(args.job)
    except (follow.FollowError, slurm.SlurmError) as err:
        raise UsageError(str(err)) from None
    try:
        path, rollouts = report.write(folder, Path(args.output) if args.output else None)
    except OSError as err:
        raise UsageError(f"cannot write the report: {err}") from None
    print(f"wrote {path}: {plural(rollouts, 'rollout')} of {folder.path.parent.name} "
          "(open it in a browser; it needs no server)")
    return EXIT_OK


def cmd_doctor(args) -> int:
    """Print what is installed in this Python and, given a spec, what it needs; return 1
    when a package the spec needs does not import here (or the spec does not resolve), else 0.

    Raises:
        UsageError: the spec file cannot be read (main() prints it and exits 2).
    """
    from vime import doctor

    wanted: dict[str, str] = {}
    if args.spec:
        args.strict, args.format = False, "human"
        source, result = _load(args)
        if result.spec is None:
            _print_diagnostics(result, args.format)
            return EXIT_SPEC
        wanted = doctor.needs(result.spec)
    found = doctor.installed() if args.no_import else doctor.imports()
    print(f"python {sys.executable} ({sys.version.split()[0]})")
    for line in doctor.table(found, wanted):
        print(line)
    if not args.spec:
        return EXIT_OK
    lacking = doctor.missing(found, wanted)
    if lacking:
        names = ", ".join(f.package.module for f in lacking)
        print(f"{args.spec} needs {plural(len(lacking), 'package')} this Python cannot "
              f"import: {names}")
        return EXIT_SPEC
    print(f"{args.spec}: every package it needs imports here"
          + (" (metadata only: --no-import)" if args.no_import else ""))
    return EXIT_OK


def cmd_follow(args) -> int:
    """Show a job's state (status), its node's log (logs) or cancel it (cancel); return 0,
    or the outcome of a followed run.

    Raises:
        UsageError: the job is not found, or Slurm refuses the query (main() prints it
            and exits 2).
    """
    from vime.launch import follow, slurm

    try:
        folder = follow.find(args.job)
        if args.verb == "status":
            sys.stdout.write(follow.status_text(folder))
            return EXIT_OK
        if args.verb == "logs":
            if args.follow and args.node == 0 and not args.raw:
                return follow.watch(folder, args.quiet)
            return follow.logs(folder, args.node, args.follow)
        print(follow.cancel(folder))
        return EXIT_OK
    except (follow.FollowError, slurm.SlurmError) as err:
        raise UsageError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"plan": cmd_plan, "compile": cmd_compile, "explain": cmd_explain,
               "submit": cmd_submit, "status": cmd_follow, "logs": cmd_follow,
               "cancel": cmd_follow, "convert": cmd_convert, "import": cmd_import,
               "doctor": cmd_doctor, "report": cmd_report}[args.verb]
    try:
        return handler(args)
    except UsageError as err:
        print(f"vime: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("vime: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except OSError as err:  # the machine's file system: a path, a permission, a full disk
        if os.environ.get("VIME_DEBUG"):
            traceback.print_exc()
        reason = "No space left on device" if err.errno == errno.ENOSPC else (
            err.strerror or str(err))
        print(f"vime: error: {reason}: {err.filename or ''}\nThis is the environment "
              "(a permission, a full disk, a file where a folder should be), not a bug in vime; "
              "fix that path or choose another (experiment.output_dir, model.save).",
              file=sys.stderr)
        return EXIT_USAGE
    except Exception as err:  # an internal error is vime's bug, not the user's
        if os.environ.get("VIME_DEBUG"):
            traceback.print_exc()
        print(f"vime: internal error: {type(err).__name__}: {err}\n"
              "This is a bug in vime, not in your spec; rerun with VIME_DEBUG=1 for the "
              "traceback and report it.", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
