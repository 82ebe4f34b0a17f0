"""The Typer application behind ``ror`` and what every command shares.

A user mistake (any :class:`~ror_annotate.errors.RorError`) prints one line
``error [CODE]: message`` on stderr and exits with status 2; a traceback means a bug in ror_annotate.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape  # messages may contain [brackets] (paths, lists, extras)
from typer.core import TyperGroup

from ..errors import ConfigError, RorError

console = Console()
err_console = Console(stderr=True)


def _sigterm_as_interrupt() -> None:
    """SIGTERM (``kill``, a scheduler's stop) ends a command like Ctrl-C: one line, exit 130, the run
    recorded ``interrupted``, finished units of work kept."""
    import signal
    import threading

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def _is_interrupt(exc: BaseException) -> bool:
    # DuckDB turns Ctrl-C during a query into its own InterruptException ("Query interrupted").
    if isinstance(exc, KeyboardInterrupt):
        return True
    return type(exc).__name__ == "InterruptException" and "duckdb" in type(exc).__module__


class RorGroup(TyperGroup):
    """Top-level command group that turns :class:`RorError` into one clear line and exit code 2."""

    def invoke(self, ctx: Any) -> Any:
        _sigterm_as_interrupt()
        try:
            return super().invoke(ctx)
        except RorError as exc:
            # One line, whatever the message holds (library errors quoted inside often span several).
            message = " ".join(exc.message.split())
            err_console.print(f"[bold red]error[/] [{exc.code}]: {escape(message)}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None  # typer vendors click: click.exceptions.Exit is not caught
        except BaseException as exc:
            if not _is_interrupt(exc):
                raise
            err_console.print(
                "interrupted: everything finished before Ctrl-C is stored; run the same command again to resume",
                highlight=False, soft_wrap=True,
            )
            raise typer.Exit(130) from None


app = typer.Typer(
    cls=RorGroup,
    name="ror",
    help="ror_annotate: label reasoning traces with six behaviors, review them, measure agreement, export, probe and steer.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

DbOption = Annotated[
    Path,
    typer.Option("--db", envvar="ROR_DB", help="DuckDB store file (env ROR_DB).", show_default=True),
]
LockTimeoutOption = Annotated[
    float,
    typer.Option("--lock-timeout", help="Seconds to wait while another ror process holds the store's lock."),
]
DEFAULT_DB_PATH = Path(os.environ.get("ROR_DB", "ror.duckdb"))


def open_store(db: Path, lock_timeout: float = 10.0, *, must_exist: bool = False, read_only: bool = False):
    """Open the store for a command (imported lazily so ``ror --help`` stays fast).

    Commands that only read (``status``, ``agree``) pass ``must_exist=True``: a mistyped ``--db``
    then gets an error instead of a new, empty store file; with ``read_only`` they write nothing
    and work on read-only media.

    Raises
    ------
    StoreError
        ``must_exist`` and there is no file at ``db``.
    """
    from ..errors import StoreError
    from ..store import Store

    if must_exist and str(db) != ":memory:" and not Path(db).expanduser().is_file():
        raise StoreError(f"no store at {Path(db).expanduser().resolve()}; check --db (or ROR_DB), or create one with `ror ingest FILE`")
    return Store(db, lock_timeout=lock_timeout, read_only=read_only)


def parse_fractions(text: str, flag: str = "--split") -> tuple[float, float, float]:
    """Parse ``"0.8,0.1,0.1"`` into train/validation/test fractions; ConfigError names ``flag``."""
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3:
        raise ConfigError(f"{flag} {text!r}: give three comma-separated fractions train,validation,test such as 0.8,0.1,0.1")
    return parts  # type: ignore[return-value]
