"""The progress file beside a store (``<db>.progress.json``) that ``ror status`` reads while the store is locked.

Generated from ``store.py`` by ``scripts/split_store.py``: edit freely; see that script for the layout.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from ..provenance import scrub_value
from ..records import Run, utc_now


class ProgressFile:
    """A small JSON file beside the store (``<db>.progress.json``) that a writing command keeps up to date.

    DuckDB lets no other process open a file, even read-only, while one process writes it (see
    ``shared/pitfalls/DB-01``), so ``ror status`` reads this file to show a running job. It is written
    atomically (temporary file + rename), at most once per ``min_interval`` seconds for progress
    updates, and always at a run's start and end. It holds counts and stage names only: never
    parameters; every string in it passes :func:`~ror_annotate.provenance.scrub_text` before it is
    written (a judge's failure text may repeat an endpoint's echo of the API key).
    """

    def __init__(self, path: Path, min_interval: float | None = None) -> None:
        import os

        self.path = path
        # ROR_PROGRESS_INTERVAL (seconds) lets a watcher (or a test) ask for finer updates.
        self.min_interval = float(os.environ.get("ROR_PROGRESS_INTERVAL", "1.0")) if min_interval is None else min_interval
        self._last = 0.0
        self._state: dict[str, Any] = {}

    @classmethod
    def for_store(cls, db_path: str) -> "ProgressFile | None":
        """The progress file of the store at ``db_path`` (None for in-memory stores)."""
        return None if db_path == ":memory:" else cls(Path(db_path + ".progress.json"))

    def start(self, run: Run) -> None:
        import os

        self._state = {
            "run_id": run.run_id, "command": run.command, "pid": os.getpid(), "status": "running",
            "started_at": run.started_at.isoformat(), "stages": {},
        }
        self._write(force=True)

    def update(self, stage: str, *, done: int, total: int | None, info: str = "") -> None:
        """Record that ``stage`` has done ``done`` of ``total`` units (throttled)."""
        if not self._state:
            return
        first = stage not in self._state["stages"]
        self._state["stages"][stage] = {"done": done, "total": total, "info": info}
        self._write(force=first or (total is not None and done >= total))

    def finish(self, run: Run, status: str) -> None:
        if not self._state:
            return
        self._state["status"] = status
        self._state["counts"] = run.counts
        self._state["ended_at"] = utc_now().isoformat()
        self._write(force=True)

    def _write(self, *, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.min_interval:
            return
        self._last = now
        self._state["updated_at"] = utc_now().isoformat()
        tmp = self.path.with_name(self.path.name + f".{uuid.uuid4().hex[:6]}.tmp")
        try:
            tmp.write_text(json.dumps(scrub_value(self._state), default=str), encoding="utf-8")
            tmp.replace(self.path)
        except OSError:
            tmp.unlink(missing_ok=True)  # read-only media or a full disk must not fail the job itself

    @staticmethod
    def read(db_path: str | Path) -> dict[str, Any] | None:
        """The last state written beside the store at ``db_path``, or None."""
        path = Path(str(Path(db_path).expanduser().resolve()) + ".progress.json")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
