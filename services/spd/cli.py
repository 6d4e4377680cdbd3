"""`spd`: the command line. Each subcommand lives in spd.commands.<name> with add_parser/run."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from spd.commands import UsageError

COMMANDS = ["generate", "workers", "up", "http", "bench", "train", "k8s", "eval"]  # module names under spd.commands
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spd", description="Speculative Pipeline Decoding serving system")
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                        default=os.environ.get("SPD_LOG_LEVEL", "WARNING").upper(),
                        help="logging threshold (default: $SPD_LOG_LEVEL, else WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"spd.commands.{name}")
        module.add_parser(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return args.run(args) or 0
    except UsageError as e:
        print(f"spd {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"spd {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
