"""Options shared by subcommands: which model, which device."""

from __future__ import annotations

import argparse
from typing import Any

from tl_reward.model.demo import DEMO_MODEL_NAME


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--device``, ``--trust-remote-code``."""
    parser.add_argument("--model", default=DEMO_MODEL_NAME,
                        help=f"hub name, local directory or built-in name (default: the demo RM "
                             f"{DEMO_MODEL_NAME})")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if present)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow custom modeling code (ArmoRM)")


def load_model(args: argparse.Namespace) -> Any:
    """The ``HookedRewardModel`` the options name."""
    from tl_reward import HookedRewardModel

    return HookedRewardModel.from_pretrained(args.model, device=args.device,
                                             trust_remote_code=args.trust_remote_code)
