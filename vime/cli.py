"""`vime` command line. Exit codes: 0 ok, 1 problems in the spec, 2 usage, 3 internal error."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from vime import __version__, render
from vime.parse import Source

EXIT_OK, EXIT_SPEC, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


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
    return parser


def _load(args) -> tuple:
    from vime import pipeline

    path = Path(args.spec)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else err
        raise UsageError(f"cannot read spec {args.spec}: {reason}") from None
    source = Source(args.spec, text)
    return source, pipeline.run(source, args.sets, path.resolve().parent, args.strict)


def _print_diagnostics(result, fmt: str) -> None:
    formatter = render.human if fmt == "human" else render.concise
    for diag in result.diagnostics:
        sys.stderr.write(formatter(diag) + ("\n" if fmt == "human" else ""))
    if result.diagnostics:
        sys.stderr.write(render.summary(result.diagnostics))


def cmd_plan(args) -> int:
    from vime.emit import plan_json

    source, result = _load(args)
    if args.json:
        obj = plan_json.plan_object(source.name, result.diagnostics, result.spec, result.plan)
        sys.stdout.write(plan_json.dumps(obj))
        return EXIT_OK if result.ok else EXIT_SPEC
    if result.plan is not None:
        sys.stdout.write(render.plan_text(result.plan))
        if result.diagnostics:
            sys.stdout.write("\n")
    _print_diagnostics(result, args.format)
    return EXIT_OK if result.ok else EXIT_SPEC


def cmd_compile(args) -> int:
    from vime.emit import build, plan_json

    source, result = _load(args)
    _print_diagnostics(result, args.format)
    if not result.ok:
        return EXIT_SPEC
    spec = result.spec
    target = Path(args.output) if args.output else Path("build") / spec.experiment.name
    obj = plan_json.plan_object(source.name, result.diagnostics, spec, result.plan)
    try:
        build.write(target, build.files(result.plan, source.name, source.text, obj, str(target)))
    except (build.BuildError, OSError) as err:
        print(f"vime: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {target}/: resolved.toml plan.json megatron.args vllm.args job.sbatch README.txt")
    return EXIT_OK


def cmd_explain(args) -> int:
    from vime import check

    if not args.code:
        for code, (name, text) in sorted(check.STAGE_CODES.items()):
            print(f"{code}  {name:<36} {text.splitlines()[0]}")
        for code, registered in sorted(check.RULES.items()):
            print(f"{code}  {registered.name:<36} {registered.summary}")
        return EXIT_OK
    text = check.explain(args.code)
    if text is None:
        print(f"vime: error: no diagnostic code {args.code!r} (`vime explain` lists them)",
              file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(text)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"plan": cmd_plan, "compile": cmd_compile, "explain": cmd_explain}[args.verb]
    try:
        return handler(args)
    except UsageError as err:
        print(f"vime: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as err:  # an internal error is vime's bug, not the user's
        if os.environ.get("VIME_DEBUG"):
            traceback.print_exc()
        print(f"vime: internal error: {type(err).__name__}: {err}\n"
              "This is a bug in vime, not in your spec; rerun with VIME_DEBUG=1 for the "
              "traceback and report it.", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
