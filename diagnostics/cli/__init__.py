"""Command line: ``python -m diagnostics run | compare | sweep | report | audit | bench | make-head``.

One module per command (its options and what it does); ``common`` holds what they share. Each
run prints one JSON object on stdout; progress goes to stderr. Bad input ends with a one-line
``error: …`` on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import os
import sys

from diagnostics.cli import audit, bench, compare, heads, report, run, sweep, verdicts
from diagnostics.cli.common import Parser, progress_wanted, silence_library_progress_bars


def build_parser() -> Parser:
    """Every command's parser, in the order ``--help`` lists them."""
    parser = Parser(prog="python -m diagnostics", description="Speculative-decoding verification lab")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (run, compare, sweep, report, audit, verdicts, bench, heads):
        command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    words = sys.argv[1:] if argv is None else list(argv)
    if not sys.stderr.isatty() or "--no-progress" in words:
        silence_library_progress_bars()  # before build_parser imports the libraries that read the environment
    args = build_parser().parse_args(argv)
    if not progress_wanted(args):
        silence_library_progress_bars()
    from diagnostics.engine import EngineError
    from diagnostics.models import ModelError
    from diagnostics.policy import PolicyError
    from diagnostics.rules import RuleError
    from diagnostics.evaluation.sandbox import SandboxUnavailable
    from diagnostics.store import StoreError

    try:
        return args.handler(args)
    except (RuleError, PolicyError, ModelError, EngineError, StoreError, ValueError, SandboxUnavailable) as error:
        from diagnostics.untrusted import visible

        # One line, whatever the message quotes (a file's rule spec, a path): escapes shown, not run.
        print(f"error: {visible(error, limit=2000)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(getattr(args, "interrupted", "interrupted: what was recorded is kept and the run is marked 'interrupted'"),
              file=sys.stderr)
        return 130
