"""The RUN_DIR argument of every command that reads a run: a run dir, or the run's config."""

from __future__ import annotations

from pathlib import Path

METAVAR = "RUN_DIR"
HELP = "the run dir, or the TOML config whose run_dir it is"


class RunDirError(ValueError):
    """The argument names neither a run dir nor a config (the message says which it is)."""


def add_run_dir(parser, name: str = "run_dir", **kw) -> None:
    """Add the positional RUN_DIR argument with the same metavar and help everywhere."""
    parser.add_argument(name, metavar=METAVAR, help=kw.pop("help", HELP), **kw)


def resolve_run_dir(arg: str | Path) -> Path:
    """A run dir, or the run_dir of a config file (a `.toml` file). Raises ConfigError for a
    config that does not load and RunDirError for another kind of file."""
    path = Path(arg)
    if path.is_file():
        if path.suffix == ".toml":
            from ..config import load_config
            from ..display import path as tidy

            return Path(tidy(load_config(path).run_dir))
        if path.name != "state.sqlite":
            raise RunDirError(f"{arg}: a file, but neither a run dir nor a run's .toml config")
    return path
