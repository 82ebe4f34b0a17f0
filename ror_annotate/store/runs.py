"""Store methods on the ``runs`` table: how every command records itself.

Generated from ``store.py`` by ``scripts/split_store.py``: edit freely; see that script for the layout.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from ..provenance import scrub_secrets, scrub_text, scrub_value
from ..records import Run, utc_now

from .schema import _to_aware, to_naive_utc
from .connection import _signals_held, duckdb_errors, is_interrupt
from .progress import ProgressFile
from .access import AccessMixin


class RunsMixin(AccessMixin):
    """The ``runs`` table and the progress file of a running command.

    Mixed into :class:`~ror_annotate.store.Store`.
    """

    def run_ids_with_status(self, statuses: Sequence[str]) -> list[str]:
        """Ids of the runs whose status is one of ``statuses`` (``running``, ``interrupted``, ``failed``, ``ok``)."""
        with duckdb_errors(self.path, "read runs"):
            rows = self.con.execute("SELECT run_id FROM runs WHERE list_contains(?, status) ORDER BY started_at", [list(statuses)]).fetchall()
        return [r[0] for r in rows]

    # ------------------------------------------------------------------ runs
    def start_run(self, command: str, parameters: dict[str, Any] | None = None) -> Run:
        """Record the start of a command; secrets in ``parameters`` are scrubbed before writing.

        Prefer :meth:`run`, which also records how the command ended.
        """
        self._require_writable("record a run")
        run = self.detached_run(command, parameters)
        with duckdb_errors(self.path, "record a run"):
            self.con.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    run.run_id, run.command, json.dumps(run.parameters, default=str), json.dumps(run.package_versions),
                    to_naive_utc(run.started_at), None, run.status, json.dumps(run.counts),
                ],
            )
        return run

    def detached_run(self, command: str, parameters: dict[str, Any] | None = None) -> Run:
        """A new :class:`Run` (id, scrubbed parameters, package versions) that is not written to the store.

        :meth:`start_run` records it; a command reading a read-only store keeps it elsewhere (``ror
        export`` writes it into the export's manifest).
        """
        from ..provenance import package_versions

        return Run(
            run_id=f"run-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}",
            command=command,
            parameters=scrub_secrets(parameters or {}),
            package_versions=package_versions(),
        )

    def finish_run(self, run_id: str, *, status: str = "ok", counts: dict[str, Any] | None = None) -> None:
        """Record the end of a run with its final status and counts (merged into any stored counts;
        every string scrubbed of secrets, :func:`~ror_annotate.provenance.scrub_value`)."""
        with duckdb_errors(self.path, "record a run"):
            row = self.con.execute("SELECT counts FROM runs WHERE run_id = ?", [run_id]).fetchone()
            merged = json.loads(row[0]) if row and row[0] else {}
            merged.update(counts or {})
            self.con.execute(
                "UPDATE runs SET ended_at = ?, status = ?, counts = ? WHERE run_id = ?",
                [to_naive_utc(utc_now()), status, json.dumps(scrub_value(merged), default=str), run_id],
            )

    def update_run_counts(self, run_id: str, counts: dict[str, Any]) -> None:
        """Merge ``counts`` into a running run's counts (e.g. live usage accounting; secrets scrubbed)."""
        with duckdb_errors(self.path, "record a run"):
            row = self.con.execute("SELECT counts FROM runs WHERE run_id = ?", [run_id]).fetchone()
            merged = json.loads(row[0]) if row and row[0] else {}
            merged.update(counts)
            self.con.execute("UPDATE runs SET counts = ? WHERE run_id = ?", [json.dumps(scrub_value(merged), default=str), run_id])

    @contextmanager
    def run(self, command: str, parameters: dict[str, Any] | None = None) -> Iterator[Run]:
        """Track one command as a run: the one way every command records itself.

        Yields the :class:`Run` (fill ``run.counts`` as the work goes). On exit the run is recorded
        ``ok``, ``interrupted`` (KeyboardInterrupt, which SIGTERM also becomes in the CLI) or
        ``failed`` (any other exception, whose type and message are kept in ``counts["error"]``,
        secrets scrubbed), and the exception propagates. Secrets in ``parameters`` are scrubbed
        once, by :meth:`start_run`. The progress file beside the store (:class:`ProgressFile`)
        records the same outcome, so ``ror status`` can show it while the store is locked.
        """
        run = self.start_run(command, parameters)
        progress = ProgressFile.for_store(self.path)
        outer, self._progress = self._progress, progress
        outside_transaction = self._shared.tx_depth == 0
        if progress is not None:
            progress.start(run)
        status = "failed"
        try:
            yield run
            status = "ok"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except SystemExit as exc:
            status = "ok" if exc.code in (0, None) else "failed"
            raise
        except BaseException as exc:
            if is_interrupt(exc):  # Ctrl-C while DuckDB ran or fetched a query
                status = "interrupted"
                raise KeyboardInterrupt() from exc
            run.counts["error"] = scrub_text(f"{type(exc).__name__}: {' '.join(str(exc).split())}")[:500]
            raise
        finally:
            self._progress = outer
            # a second Ctrl-C must not leave the run recorded as "running"; one that ends a run recorded
            # "ok" stops the command once it is recorded (it was dropped, and the next stage ran)
            with _signals_held(deliver=status == "ok"):
                if status != "ok" and outside_transaction:
                    self._abandon_transaction()
                try:
                    self.finish_run(run.run_id, status=status, counts=run.counts)
                finally:
                    if progress is not None:
                        progress.finish(run, status)

    def report_progress(self, stage: str, *, done: int, total: int | None, info: str = "") -> None:
        """Note a running stage's progress in the progress file (no-op outside :meth:`run`)."""
        if self._progress is not None:
            self._progress.update(stage, done=done, total=total, info=info)

    def runs(self) -> list[Run]:
        """All recorded runs, oldest first."""
        rows = self.con.execute(
            "SELECT run_id, command, parameters, package_versions, started_at, ended_at, status, counts FROM runs ORDER BY started_at"
        ).fetchall()
        return [
            Run(
                run_id=r[0], command=r[1], parameters=json.loads(r[2] or "{}"), package_versions=json.loads(r[3] or "{}"),
                started_at=_to_aware(r[4]), ended_at=_to_aware(r[5]), status=r[6], counts=json.loads(r[7] or "{}"),
            )
            for r in rows
        ]
