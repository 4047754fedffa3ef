"""`csweep`: one module per command, each with its options beside its handler; every input is
checked before Ray starts, a model loads or storage is touched."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from . import export_model, pull, report, resume, run, spaces, ui
from ._options import Parser, UsageError


def build_parser() -> Parser:
    p = Parser(prog="csweep", description="Hyperparameter coupling sweeps for SD embeddings and LoRAs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # in the order `csweep --help` lists them
    run.add_parser(sub)
    resume.add_parsers(sub)
    report.add_parsers(sub)
    spaces.add_parsers(sub)
    ui.add_parser(sub)
    pull.add_parser(sub)
    export_model.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except UsageError as exc:
        print(f"csweep: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("csweep: interrupted", file=sys.stderr)
        return 130


def cli() -> None:
    """Console-script entry point."""
    rc = main()
    # the process ends here: objects still alive are moved out of the collector's reach, so
    # that exiting skips a last full collection of a heap that holds MLflow, pandas and
    # SQLAlchemy (about 2 s of a sweep's exit on two cores); atexit handlers still run
    import gc

    gc.freeze()
    sys.exit(rc)


__all__ = ["UsageError", "build_parser", "cli", "main"]
