"""`spd`: the command line. Each subcommand lives in spd.commands.<name> with add_parser/run."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from spd.commands import UsageError
from spd import settings

COMMANDS = ["generate", "workers", "up", "http", "bench", "train", "k8s", "eval"]  # module names under spd.commands
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help line ends with its default, unless it already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (action.option_strings and default not in (None, False, [], "", argparse.SUPPRESS)
                and "default" not in text.lower()):
            text += f" (default: {default})"
        return text


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (commands import their heavy modules only when they run)."""
    parser = Parser(prog="spd", description="Speculative Pipeline Decoding serving system")
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                        default=settings.log_level(settings.CLI_LOG_LEVEL),
                        help="logging threshold (default: $SPD_LOG_LEVEL, else WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"spd.commands.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
