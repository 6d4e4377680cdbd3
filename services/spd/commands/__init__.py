"""The `spd` subcommands, one module each (add_parser / run), and the error they share."""


class UsageError(Exception):
    """A command-line value outside the contract: printed as `spd <command>: error: ...`, exit 2."""
