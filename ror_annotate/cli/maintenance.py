"""``ror recover`` and ``ror migrate``: store maintenance after a fault or an upgrade."""

from __future__ import annotations

from .app import DEFAULT_DB_PATH, DbOption, LockTimeoutOption, app, console, open_store


@app.command("recover")
def recover_cmd(db: DbOption = DEFAULT_DB_PATH) -> None:
    """Open a store whose write-ahead log is damaged: move the log aside (never deleted), keep the commits it still holds, report what was lost."""
    from ..recover import recover_store

    report = recover_store(db)
    if not report.recovered:
        console.print(f"{report.path}: its log replays (or there is none) and no commit is missing; nothing to recover", markup=False, highlight=False, soft_wrap=True)
        return
    gained = {t: report.recovered_counts.get(t, 0) - report.checkpoint_counts.get(t, 0) for t in report.recovered_counts}
    if report.wal_aside is not None:
        lines = [
            f"{report.path}: the write-ahead log was damaged ({report.error})",
            f"moved aside, not deleted: {report.wal_aside}",
            "last checkpointed state: " + ", ".join(f"{n} {t}" for t, n in report.checkpoint_counts.items()),
            f"recovered from the log ({report.replayed_bytes} of {report.wal_bytes} bytes): "
            + ", ".join(f"{n} {t}" for t, n in gained.items()),
            f"lost: the log's last {report.lost_bytes} bytes (the commits written after byte {report.replayed_bytes}); "
            "re-run the commands that wrote them (`ror status` lists the runs kept)",
        ]
    else:
        lines = [f"{report.path}: the write-ahead log replayed, but it was cut short or damaged after its last readable commit"]
    if report.lost_commits:
        lines.append(
            f"commit journal: {report.lost_commits} committed transaction(s) were missing from the store; "
            f"{report.judge_responses} paid LLM judge response(s) among them, {report.judge_restored} restored into the judge's "
            f"cache from the journal ({report.judge_responses - report.judge_restored} were there already): re-run `ror label` "
            "(or the `ror run` that was running) to rebuild their labels without paying again; the commits' other rows are lost, "
            "re-run the commands that wrote them (`ror status` lists the runs kept)"
        )
    lines.append("store now: " + ", ".join(f"{n} {t}" for t, n in report.recovered_counts.items()))
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command("migrate")
def migrate_cmd(db: DbOption = DEFAULT_DB_PATH, lock_timeout: LockTimeoutOption = 10.0) -> None:
    """Bring a store written by an older ror_annotate to this version's schema (changes no data)."""
    from ..store import CORE_MIGRATIONS

    with open_store(db, lock_timeout, must_exist=True) as store:
        version = store.schema_version("core")
        console.print(f"{store.path}: core schema v{version} (this ror_annotate: v{len(CORE_MIGRATIONS)})", markup=False, highlight=False)
