"""The Typer application behind ``ror`` and what every command shares.

A user mistake (any :class:`~ror_annotate.errors.RorError`, and a usage error of the command line
itself: unknown option, missing argument, bad value, code E010) prints one line
``error [CODE]: message`` on stderr and exits with the error's ``exit_status``: 2, or 3 when the
judge labelled nothing or too little (E506); a traceback means a bug in ror_annotate.
"""

from __future__ import annotations

import inspect
import io
import os
from contextlib import contextmanager
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.console import Console
from rich.table import Table
from rich.markup import escape  # messages may contain [brackets] (paths, lists, extras)
from typer.core import TyperGroup

from ..errors import ConfigError, RorError, UsageError

class _ScrubbedFile:
    """A text stream whose writes pass :func:`~ror_annotate.provenance.scrub_text` first (API keys,
    URL passwords, ``Bearer``/``Basic`` values, tokens of the environment); every other attribute is
    the wrapped stream's (``isatty``, ``encoding``, ``fileno``, ``flush``)."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def write(self, text: str) -> int:
        from ..provenance import scrub_text

        return int(self._target.write(scrub_text(text)) or 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


class _ScrubbingConsole(Console):
    """Rich's console, with everything it writes scrubbed of secrets: whatever a command prints
    (a server URL with ``user:password@``, a provider's message that repeats the request's
    ``Authorization`` header) reaches the terminal without them."""

    @property  # type: ignore[override]
    def file(self) -> Any:
        return _ScrubbedFile(Console.file.fget(self))  # type: ignore[attr-defined]

    @file.setter
    def file(self, new_file: Any) -> None:
        Console.file.fset(self, new_file)  # type: ignore[attr-defined]


class _StdoutConsole(_ScrubbingConsole):
    """Rich's console for stdout, ending quietly with status 0 when the reader closes the pipe
    (``ror agree | head -1``); rich's own handler exits with status 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        _silence_stdout()
        raise SystemExit(0)


# markup=False: what goes to stdout is data (rater, model, file and study names in tables and summaries),
# and a name such as "[/x]" was read as a Rich closing tag (MarkupError traceback in every command
# that printed it) or "[bold red]alice" restyled the table. Styles on stdout come from Table / Text
# objects, never from markup in strings; err_console keeps markup for its coded lines (data escaped).
console = _StdoutConsole(markup=False)
err_console = _ScrubbingConsole(stderr=True)

# typer 0.2x vendors click (typer._click); older typer uses click itself. Catch whichever parses.
# NoArgsIsHelpError (click >= 8.2) is how `ror` alone asks for the help: it is let through.
_CLICK_USAGE_ERRORS: tuple[type[Exception], ...] = (click.exceptions.UsageError,)
_NO_ARGS_IS_HELP: tuple[type[Exception], ...] = tuple(
    e for e in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if e is not None
)
try:
    from typer._click.exceptions import NoArgsIsHelpError as _VendoredNoArgsIsHelp
    from typer._click.exceptions import UsageError as _VendoredUsageError

    _CLICK_USAGE_ERRORS += (_VendoredUsageError,)
    _NO_ARGS_IS_HELP += (_VendoredNoArgsIsHelp,)
except ImportError:  # pragma: no cover - typer without a vendored click
    pass

# typer 0.29 shows every flag as "--force <bool>" although a flag takes no value (and rejects one):
# show flags bare, as click does.
_display_type_rich = getattr(typer.core.TyperOption, "display_type_rich", None)
if _display_type_rich is not None:
    def _flag_without_type(self: Any, ctx: Any, _shown: Callable[..., str | None] = _display_type_rich) -> str | None:
        return None if getattr(self, "is_flag", False) else _shown(self, ctx)

    typer.core.TyperOption.display_type_rich = _flag_without_type  # type: ignore[method-assign]


def print_error(exc: RorError) -> None:
    """Print ``error [CODE]: message`` on stderr, on one line whatever the message holds, every known
    secret scrubbed (:func:`~ror_annotate.provenance.scrub_text`: API keys, URL passwords, tokens)."""
    from ..provenance import scrub_text

    message = scrub_text(" ".join(exc.message.split()))  # library errors quoted inside often span several lines
    err_console.print(f"[bold red]error[/] [{exc.code}]: {escape(message)}", highlight=False, soft_wrap=True)


def _usage_error(exc: Exception) -> UsageError:
    """Our one-line error for a command-line usage error of click (no 4-line box)."""
    ctx = getattr(exc, "ctx", None)
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    # click 8.2.0-8.2.1 name an option without an environment variable "(env var: 'None')" in the hint
    message = exc.format_message().replace(" (env var: 'None')", "")  # type: ignore[attr-defined]
    return UsageError(f"{message}{where}")


def _sigterm_as_interrupt() -> None:
    """SIGTERM (``kill``, a scheduler's stop) ends a command like Ctrl-C: one line, exit 130, the run
    recorded ``interrupted``, finished units of work kept."""
    import signal
    import threading

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        if getattr(signal.getsignal(signal.SIGINT), "__name__", "") == "_interrupted_while_starting":
            signal.signal(signal.SIGINT, signal.default_int_handler)  # the command runs: Ctrl-C is KeyboardInterrupt again


#: The command's exit status once it has settled (:func:`_settled`), else None.
_SETTLED: int | None = None


def _settled(status: int) -> None:
    """The command is over (its outcome printed, its store closed): from here to the process's end, an
    interrupt ends the process at once with ``status`` (the command's own exit status).

    Interpreter teardown (joining the worker pools' threads, atexit callbacks) runs Python code where
    the interrupt handler raised ``KeyboardInterrupt`` ("Exception ignored in: <module 'threading'>"
    and a traceback), and once CPython has put the default handlers back, a SIGTERM killed the
    finished command (status -15, seen at the end of `ror run --workers 2` on the 201 shared traces).
    Only in the ``ror`` process itself (a program that runs the CLI in-process keeps its handlers).
    """
    import signal
    import threading

    from . import _is_command_process

    if threading.current_thread() is not threading.main_thread() or not _is_command_process():
        return
    global _SETTLED
    _SETTLED = status

    def finish(signum: int, frame: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)

    for sig in (signal.SIGINT, getattr(signal, "SIGTERM", None)):
        if sig is not None:
            signal.signal(sig, finish)


def _forget_unhandled_interrupt() -> None:
    """Clear CPython's note that a KeyboardInterrupt went unhandled, once the CLI has handled it.

    CPython notes a KeyboardInterrupt that leaves code run from a *string* (``exec(source)``, as
    :mod:`dataclasses` and :mod:`typing` do while modules are imported) and, at exit, ends the process
    by SIGINT (status -2) whatever exit code was asked for, even when the interrupt was caught
    further up (``Python/pythonrun.c``: ``run_eval_code_obj`` sets ``_Py_UnhandledKeyboardInterrupt``;
    ``Modules/main.c``: ``Py_RunMain`` calls ``exit_sigint``). A SIGTERM that landed while such code ran
    (about 1 in 10 stops within the first two seconds of ``ror run``) ended ``ror`` with -2 after its
    ``interrupted:`` line. Running a string that raises nothing resets the note
    (``run_eval_code_obj`` clears it first), so the exit code is the documented 130.
    """
    exec("pass")  # noqa: S102  (a constant string; the point is the interpreter's bookkeeping)


def _is_interrupt(exc: BaseException) -> bool:
    if isinstance(exc, KeyboardInterrupt):
        return True
    from ..store import is_interrupt  # DuckDB's disguises of Ctrl-C ("Query interrupted")

    return is_interrupt(exc)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that nothing more is written to a closed pipe (Python's documented
    recipe for SIGPIPE: https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass


def _quiet_on_broken_pipe(self: Console) -> None:
    """Every console of the CLI process ends quietly with status 0 when its reader closes the pipe."""
    self.quiet = True
    _silence_stdout()
    raise SystemExit(0)


# The help pages (`ror --help | head -1`, `ror agree --help | less` quit early) are printed by typer's
# own rich console, whose broken-pipe handler exits with status 1 like ours did before
# (`_StdoutConsole`): the CLI's process gives every console the same quiet exit 0.
Console.on_broken_pipe = _quiet_on_broken_pipe  # type: ignore[method-assign]


class _FoldingTable(Table):
    """Rich's table whose columns fold a word too long for its cell onto the next line.

    typer's help tables add their columns with rich's default overflow, "ellipsis": at 80 columns an
    option's own name (``--no-retry-fail…``), a URL default (``http://127.0.0.1…``) or an environment
    variable (``LABEL_STUDIO_API_K…``) was cut and could not be read. Folded, every character shows.
    """

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*renderables, **kwargs)
        for column in self.columns:
            column.overflow = "fold"


def _fold_help_tables() -> None:
    try:
        import typer.rich_utils as rich_utils
    except ImportError:  # pragma: no cover - typer without rich: plain click help, never cut
        return
    rich_utils.Table = _FoldingTable  # type: ignore[attr-defined,misc]
    rich_utils.Columns = _folded_help  # type: ignore[attr-defined,misc,assignment]


def _folded_help(items: list[Any], *args: Any, **kwargs: Any) -> Any:
    """An option's help, its ``[env var: ...]`` and ``[default: ...]`` one under the other, long words folded.

    typer lays them out with rich's ``Columns``, whose cells cut a word wider than the cell with "…"."""
    from rich.console import Group
    from rich.text import Text

    for item in items:
        if isinstance(item, Text):
            item.overflow = "fold"
    return Group(*items)


_fold_help_tables()


def one_line_short_help(group: Any) -> None:
    """Give every command under ``group`` (subgroups included) help paragraphs that the terminal wraps.

    typer's rich help keeps a docstring's own line breaks, so a docstring wrapped at 120 characters
    showed as cut lines at 80 columns ("... Krippendorff's alpha," then "Gwet's AC1, ..." on a line of
    its own; "links again. With" then "--adjudicator EMAIL ..."). Each paragraph becomes one line
    (``short_help``: the first paragraph), except a paragraph marked ``\\b`` or a list (lines starting
    ``-``, ``*``), kept as written. A ``short_help`` already set stays.
    """
    for command in group.commands.values():
        if command.help:
            paragraphs = inspect.cleandoc(command.help).split("\n\n")
            joined = [p if p.startswith("\b") or any(line.lstrip()[:2] in ("- ", "* ") for line in p.splitlines()) else " ".join(p.split())
                      for p in paragraphs]
            command.help = "\n\n".join(joined)
            if command.short_help is None:
                command.short_help = joined[0]
        if isinstance(getattr(command, "commands", None), dict):  # a group (typer may vendor its own click)
            one_line_short_help(command)


class RorGroup(TyperGroup):
    """Top-level command group: a :class:`RorError` or a usage error becomes one clear line and exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        one_line_short_help(self)

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        # `ror --bogus` fails while parsing the group's own options, before invoke
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except BrokenPipeError:
            # `ror --help | head -1` with a rich older than Console.on_broken_pipe: click would exit 1
            _silence_stdout()
            raise typer.Exit(0) from None
        except _NO_ARGS_IS_HELP:
            raise  # `ror` alone prints the help
        except _CLICK_USAGE_ERRORS as exc:
            print_error(_usage_error(exc))
            raise typer.Exit(2) from None

    def invoke(self, ctx: Any) -> Any:
        _sigterm_as_interrupt()
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
            _settled(0)
            return result
        except BrokenPipeError:
            # `ror agree ... | head -1`: the reader has all it wants; like other Unix tools, stop quietly.
            _silence_stdout()
            raise typer.Exit(0) from None
        except _NO_ARGS_IS_HELP:
            raise  # `ror review` alone prints the group's help
        except _CLICK_USAGE_ERRORS as exc:
            print_error(_usage_error(exc))
            raise typer.Exit(2) from None
        except BaseException as exc:
            if isinstance(exc, RorError) and not _is_interrupt(exc):
                print_error(exc)
                _settled(exc.exit_status)
                raise typer.Exit(exc.exit_status) from None  # typer vendors click: click.exceptions.Exit is not caught
            if not _is_interrupt(exc):
                raise
            from . import INTERRUPTED

            err_console.print(INTERRUPTED, highlight=False, soft_wrap=True)
            _forget_unhandled_interrupt()
            _settled(130)
            raise typer.Exit(130) from None


app = typer.Typer(
    cls=RorGroup,
    name="ror",
    help="ror_annotate: label reasoning traces with six behaviors, review them, measure agreement, export, probe and steer.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("ror_annotate")
        except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
            from .. import __version__ as number
        console.print(f"ror_annotate {number}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    """Options of ``ror`` itself; the help text is the Typer app's."""

DbOption = Annotated[
    Path,
    typer.Option("--db", envvar="ROR_DB", help="DuckDB store file (env ROR_DB).", show_default=True),
]
def _lock_timeout(value: float) -> float:
    """``--lock-timeout``: seconds >= 0, ``inf`` to wait as long as it takes; ``nan`` and negative
    values were taken as 0 (``nan`` printed "waited nan s")."""
    if value != value or value < 0:  # NaN compares unequal to itself
        raise typer.BadParameter(f"{value:g} is not a number of seconds >= 0 (give e.g. 30, or inf to wait as long as it takes)")
    return value


LockTimeoutOption = Annotated[
    float,
    typer.Option("--lock-timeout", help="Seconds to wait while another ror process holds the store's lock (inf: as long as it takes).",
                 callback=_lock_timeout),
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
    new = str(db) != ":memory:" and not read_only and not Path(db).expanduser().exists()
    store = Store(db, lock_timeout=lock_timeout, read_only=read_only)
    return _removed_if_left_empty(store) if new else store


@contextmanager
def _removed_if_left_empty(store: Any) -> Any:
    """A store this command created: removed again (file, WAL, progress file, commit journal) when the command fails
    before storing any trace with a coded error (a hub that cannot be reached, a bad input), so no empty
    store is left. An interrupted command keeps the store: its run is recorded there as interrupted."""
    try:
        yield store
    except RorError as exc:  # not an interrupt: an interrupted run stays recorded in the store
        if _is_interrupt(exc):
            raise
        try:
            empty = store.counts().get("traces", 0) == 0
        except Exception:  # noqa: BLE001 - a store in a bad state is left for the user to look at
            empty = False
        store.close()
        if empty:
            for suffix in ("", ".wal", ".progress.json", ".commits"):  # .commits: ror_annotate.journal.JOURNAL_SUFFIX
                Path(store.path + suffix).unlink(missing_ok=True)
        raise
    finally:
        store.close()


def deprecated_alias(old_value: Any, old_flag: str, value: Any, flag: str) -> Any:
    """``old_value`` (with a warning naming ``flag``) when the deprecated ``old_flag`` was given, else ``value``."""
    if old_value is None:
        return value
    err_console.print(f"[yellow]warning[/]: {old_flag} is deprecated here; use {flag}", highlight=False)
    return old_value


def progress_display() -> Any:
    """A rich progress display for a pipeline stage's ``progress`` argument (on stderr).

    Transient: the bars show while the work runs and give way to the command's summary; on a
    non-terminal (a pipe, a log file) nothing is printed, so a failing command prints only its error.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from rich.table import Column

    # The description (the judge's carries its running cost) gives way first: done/total and the
    # elapsed time are never cut, whatever the terminal's width.
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False, table_column=Column(
            no_wrap=True, overflow="ellipsis", max_width=max(10, err_console.width - 45))),
        BarColumn(),
        MofNCompleteColumn(table_column=Column(no_wrap=True, min_width=3)),
        TimeElapsedColumn(table_column=Column(no_wrap=True, min_width=7)),
        # on a non-terminal the display goes nowhere (rich 13.0 still wrote a newline when merely disabled)
        console=err_console if err_console.is_terminal else Console(file=io.StringIO()), transient=True,
        disable=not err_console.is_terminal,
    )


def parse_fractions(text: str, flag: str = "--split-fractions") -> tuple[float, float, float]:
    """Parse ``"0.8,0.1,0.1"`` into train/validation/test fractions; ConfigError names ``flag``."""
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3:
        raise ConfigError(f"{flag} {text!r}: give three comma-separated fractions train,validation,test such as 0.8,0.1,0.1")
    return parts  # type: ignore[return-value]
