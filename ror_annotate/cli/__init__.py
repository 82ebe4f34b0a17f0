"""``ror``: one command-line entry point, one subcommand per pipeline stage.

Each stage registers its commands in its own module of this package; importing the package
registers all of them.
"""

import os as _os
import signal as _signal
import sys as _sys
import threading as _threading

#: The one line an interrupted command prints (cli/app.py prints the same once a command runs).
INTERRUPTED = "interrupted: everything finished before Ctrl-C is stored; run the same command again to resume"


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM while ``ror`` imports its modules (about a second): nothing is stored yet;
    the one ``interrupted:`` line and exit 130, as later (was: a KeyboardInterrupt traceback, or a
    silent death by SIGTERM, status -15)."""
    _os.write(2, (INTERRUPTED + "\n").encode())
    _os._exit(130)


def _is_command_process() -> bool:
    """Whether this process is the ``ror`` command (its script, or ``python -m ror_annotate[.cli]``),
    not a program that imports the package: only the command may take over the process's signals."""
    argv0 = _sys.argv[0] if _sys.argv else ""
    tail = argv0.replace("\\", "/")
    return _os.path.basename(argv0) in ("ror", "ror.exe") or tail.endswith(("ror_annotate/__main__.py", "ror_annotate/cli/__main__.py"))


def _ignore_interrupts_at_exit() -> None:
    """The last exit callback (registered first): once the command has settled (cli/app.py's
    ``_settled``), interrupts are ignored for the rest of the teardown. CPython puts the default
    handlers back late in its finalization, and a SIGTERM then killed the finished command (-15)."""
    from .app import _SETTLED  # its value now (the package's ``app`` is the Typer application)

    if _SETTLED is not None:
        for sig in (_signal.SIGINT, getattr(_signal, "SIGTERM", None)):
            if sig is not None:
                _signal.signal(sig, _signal.SIG_IGN)


if _threading.current_thread() is _threading.main_thread() and _is_command_process():
    for _sig in (_signal.SIGINT, getattr(_signal, "SIGTERM", None)):
        if _sig is not None and _signal.getsignal(_sig) in (_signal.SIG_DFL, _signal.default_int_handler):
            _signal.signal(_sig, _interrupted_while_starting)
    import atexit as _atexit

    _atexit.register(_ignore_interrupts_at_exit)  # first registered, so run last
    from ..gc_policy import set_for_process as _set_gc_for_process

    _set_gc_for_process()  # fewer collections: a fifth less CPU for `ror run` (ror_annotate/gc_policy.py)

from .app import app  # noqa: F401,E402
from . import core  # noqa: F401,E402  (registers ingest, segment, label, run, status)

# Stages register here; a missing optional stage must not break the others.
for _name in ("codebook", "agree", "review", "review_flow", "export_cmds", "steer", "verify", "view", "aggregate", "labels", "maintenance"):
    try:
        __import__(f"{__name__}.{_name}")
    except ModuleNotFoundError as _exc:  # the stage's module is not written (yet) or its extra is absent
        if _exc.name not in (f"{__name__}.{_name}",):
            raise

__all__ = ["app"]
