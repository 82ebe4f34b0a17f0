"""``ror``: one command-line entry point, one subcommand per pipeline stage.

Each stage registers its commands in its own module of this package; importing the package
registers all of them.
"""

from .app import app  # noqa: F401
from . import core  # noqa: F401,E402  (registers ingest, segment, label, run, status)

# Stages register here; a missing optional stage must not break the others.
for _name in ("codebook", "agree", "review", "review_flow", "export_cmds", "steer", "verify", "view", "aggregate", "labels", "maintenance"):
    try:
        __import__(f"{__name__}.{_name}")
    except ModuleNotFoundError as _exc:  # the stage's module is not written (yet) or its extra is absent
        if _exc.name not in (f"{__name__}.{_name}",):
            raise

__all__ = ["app"]
