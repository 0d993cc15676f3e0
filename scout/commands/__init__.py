"""Subcommands of the ``scout`` console script. Each module exposes ``register(subparsers)``,
which adds its parser and sets ``func`` (called with the parsed args, returns an exit code)."""
