"""One module per `specgen` subcommand (see specgen.cli.COMMANDS)."""
