"""Command line: ``feishu-progress serve | migrate | demo``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="feishu-progress", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the bot: callbacks + runtime API + admin listener")
    migrate = sub.add_parser("migrate", help="apply the database migrations (alembic upgrade head)")
    migrate.add_argument("--revision", default="head", help="target revision (default: head)")
    migrate.add_argument("--down", action="store_true", help="downgrade to --revision instead")
    sub.add_parser("demo", help="play a scripted task against the embedded sandbox and show the card")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    print(f"{args.command}: not available yet", file=sys.stderr)  # noqa: T201
    return 2
