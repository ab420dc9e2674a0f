"""The ``tl-reward`` command: one module per subcommand, each with ``add_parser`` and ``run``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from tl_reward.errors import TLRewardError

#: subcommand name -> module under tl_reward.cli
SUBCOMMANDS: dict[str, str] = {
    "demo": "tl_reward.cli.demo",
    "score": "tl_reward.cli.score",
    "explain": "tl_reward.cli.explain",
    "sweep": "tl_reward.cli.sweep",
    "audit": "tl_reward.cli.audit",
    "compare": "tl_reward.cli.compare",
    "faithfulness": "tl_reward.cli.faithfulness",
    "irm": "tl_reward.cli.irm",
    "sae-fit": "tl_reward.cli.sae_fit",
    "circuit": "tl_reward.cli.circuit",
    "run-report": "tl_reward.cli.run_report",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="tl-reward",
                                     description="Mechanistic interpretability for reward models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tl-reward`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except TLRewardError as exc:
        print(f"tl-reward: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
