"""``report``: one self-contained HTML file of runs, audits and sweeps."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from diagnostics.cli.common import json_line


def command_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from diagnostics.evaluation.settings import checked_cost
    from diagnostics.report import SHOWN_POSITIONS, build_report
    from diagnostics.store import Store, complete_groups
    from diagnostics.untrusted import visible

    output = Path(args.output).expanduser()
    if output.is_dir():
        raise ValueError(f"{output} is a folder; give -o a file name, e.g. {output / 'report.html'}")
    if not output.parent.is_dir():
        raise ValueError(f"the folder {output.parent} does not exist; create it, or give -o a path in an existing folder")
    store = Store(args.db, read_only=True)
    completion = complete_groups(store, args.run_ids)  # build_report does the same: a group is reported whole
    checked_cost(args.cost)
    # Built before the file is opened: no half-written report.
    verdicts = None
    if args.verdicts:
        from diagnostics.verdicts.table import load_table

        verdicts = load_table(Path(args.verdicts))  # validated like any shared file
        if not verdicts["rows"]:
            raise ValueError(f"{args.verdicts} holds no verdicts yet: run python -m diagnostics verdicts")
    text = build_report(store, args.run_ids, args.audit, args.sweep, cost=args.cost, verdicts=verdicts)
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as error:
        raise ValueError(f"cannot write {output}: {error.strerror or error}") from None
    for note in completion.notes("reported"):
        print(f"note: {visible(note, limit=500)}", file=sys.stderr)
    for run_id in completion.run_ids:  # what build_report cut, said where the user sees it too
        total = store.position_count(run_id)
        if total > SHOWN_POSITIONS:
            print(f"note: run {visible(run_id, limit=200)} has {total:,} positions: the report shows the first "
                  f"{SHOWN_POSITIONS:,} and summarises the rest (its figures are over all {total:,})", file=sys.stderr)
    print(json_line({"report": str(output.resolve()), "runs": completion.run_ids, "audits": args.audit,
                      "added_for_groups": completion.added, "bytes": len(text.encode())}))
    return 0


def add_parser(commands: Any) -> None:
    """The ``report`` command's options."""
    from diagnostics.evaluation.settings import MAX_STORED_COST, NO_STORED_COST, cost_option
    from diagnostics.shareable import SHARED_DB_NAME
    report = commands.add_parser(
        "report", help="one self-contained HTML file for runs (a run or a compared group) and audits",
        description="One self-contained HTML file for runs (a run, or a compared group: each run told against its own "
                    "seed's reference, with the chart of why it leaves it) and audits. Made to be shared: absolute paths are "
                    "cut to their last part, URLs to their scheme, and the reproduce lines name the database by its base "
                    f"name ({SHARED_DB_NAME} where that name holds your user or host name).")
    report.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="runs to include (their stored audits come with them)")
    report.add_argument("--audit", action="append", default=[], metavar="AUDIT_ID", help="a stored audit to include (repeatable)")
    report.add_argument("--sweep", action="append", default=[], metavar="SWEEP_ID",
                        help="a stored sweep to include: its Pareto chart, figures with intervals and verdicts (repeatable)")
    report.add_argument("--verdicts", nargs="?", const="docs/verdicts.json", default=None, metavar="TABLE.json",
                        help="include the verdict table of real engines (default docs/verdicts.json)")
    report.add_argument("--cost", type=cost_option, default=None, metavar="C",
                        help="draft/target cost ratio of one step for the sweeps' modelled speed-up "
                             "(default: the one stored with each sweep, as the CLI and the Sweeps page use; "
                             f"{NO_STORED_COST:g} for a sweep stored without one; 0 to {MAX_STORED_COST:g}; "
                             "'analytic': the c each sweep's drafter shape implies, e.g. L/N for early-exit:L)")
    report.add_argument("--db", default=None, help="DuckDB file (default $SPECLAB_DB or data/runs.duckdb); "
                                                   "the report names it by its base name only")
    report.add_argument("-o", "--output", required=True, help="the HTML file to write")
    report.set_defaults(handler=command_report)
