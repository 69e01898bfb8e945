"""The ``sailor`` command: inspect runs and the catalog, plan a request, run the demo."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from sailor_tasks.cli import catalog, demo, gke, plan, rebalance, runs, simulate, submit, trace


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sailor", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    runs.add_parser(sub)
    catalog.add_parser(sub)
    plan.add_parser(sub)
    rebalance.add_parser(sub)
    trace.add_parser(sub)
    gke.add_parser(sub)  # buckets, render
    submit.add_parser(sub)
    demo.add_data_parser(sub)  # demo-data
    simulate.add_parser(sub)
    demo.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
