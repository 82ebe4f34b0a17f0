"""``ror export`` and ``ror publish``: write the token-aligned dataset, and push it to the hub."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..errors import InputError
from .app import DEFAULT_DB_PATH, DbOption, LockTimeoutOption, app, console, deprecated_alias, open_store, parse_fractions, progress_display


@app.command("export")
def export_cmd(
    name: Annotated[str, typer.Argument(help="Dataset name; written to exports/NAME unless --out is given.")],
    out: Annotated[Path | None, typer.Option("--out", help="Export directory (replaced atomically if it holds an earlier export).")] = None,
    labels: Annotated[str, typer.Option("--labels", help="Which labels: auto (adjudicated, else human, else aggregate, else judge, else baseline), adjudicated, human, aggregate, judge, baseline, majority, import.")] = "auto",
    tokenizer: Annotated[str | None, typer.Option("--tokenizer", help="Fast tokenizer (hub name in the local cache, or a local directory) for the 'tokens' configuration.")] = None,
    chat_template: Annotated[bool, typer.Option("--chat-template", help="Tokenize the chat-template rendering (problem as user turn, reasoning as thinking).")] = False,
    split_seed: Annotated[int, typer.Option("--split-seed", help="Seed of the by-trace train/validation/test split.")] = 0,
    split_fractions: Annotated[str, typer.Option("--split-fractions", help="train,validation,test fractions of traces (by trace, never splitting one).")] = "0.8,0.1,0.1",
    stratify_by: Annotated[str | None, typer.Option("--stratify-by", help="Stratify the split by a trace field: dataset, model or source.")] = None,
    license: Annotated[str | None, typer.Option("--license", help="License identifier for the card (check the traces' own licenses). Default: the sources' common known licence, else other.")] = None,
    source_license: Annotated[list[str] | None, typer.Option("--source-license", help="SOURCE=LICENSE: the licence of a trace source (repeatable); sources without one are not publishable.")] = None,
    view: Annotated[bool, typer.Option("--view", help="Also write the viewer site (`ror view`) into the export folder's view/ (open view/index.html).")] = False,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
    old_seed: Annotated[int | None, typer.Option("--seed", hidden=True, help="Deprecated: --split-seed.")] = None,
    old_split: Annotated[str | None, typer.Option("--split", hidden=True, help="Deprecated: --split-fractions.")] = None,
) -> None:
    """Export segments (and, with --tokenizer, token-aligned labels) as a Hugging Face dataset with a card."""
    from .. import pipeline

    # `--split` names a hub split in `ror run`/`ingest`, and `--seed` the judge's sampling seed
    split_seed = deprecated_alias(old_seed, "--seed", split_seed, "--split-seed")
    split_fractions = deprecated_alias(old_split, "--split", split_fractions, "--split-fractions")
    fractions = parse_fractions(split_fractions)
    source_licenses = parse_source_licenses(source_license or [])
    out_dir = out or Path("exports") / name
    with _open_for_export(db, lock_timeout) as store, progress_display() as progress:
        summary = pipeline.export(
            store, out_dir, labels=labels, tokenizer=tokenizer, chat_template=chat_template, split_seed=split_seed,
            split_fractions=fractions, stratify_by=stratify_by, name=name, license=license, source_licenses=source_licenses,
            progress=progress,
        )
        site = pipeline.view(store, out_dir / "view") if view else None
    table = Table(title=f"ror export: {name}", show_header=False)
    table.add_column("what")
    table.add_column("value", overflow="fold")  # a long path folds onto the next line, never cut to "…"
    for k, v in summary.table_rows():
        table.add_row(k, v)
    if site is not None:
        table.add_row("viewer", f"{site.index} ({site.traces} traces)")
    console.print(table)


def _open_for_export(db: Path, lock_timeout: float):
    """The store, read-write to record the export's run; read-only where the file or its folder cannot
    be written (read-only media): the run is then recorded in the export's manifest."""
    import os

    from ..errors import StoreLockedError, StoreError

    path = Path(db).expanduser()
    writable = path.is_file() and os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    if not writable:
        return open_store(db, lock_timeout, must_exist=True, read_only=True)
    try:
        return open_store(db, lock_timeout, must_exist=True)
    except StoreLockedError:
        raise
    except StoreError:  # e.g. a read-only file system that os.access does not report
        return open_store(db, lock_timeout, must_exist=True, read_only=True)


def parse_source_licenses(values: list[str]) -> dict[str, str]:
    """``["SOURCE=LICENSE", ...]`` -> ``{source: licence}``; raises :class:`InputError` on a malformed item."""
    out = {}
    for item in values:
        source, sep, lic = item.rpartition("=")
        if not sep or not source.strip() or not lic.strip():
            raise InputError(f"--source-license {item!r} must look like SOURCE=LICENSE (e.g. org/repo=mit)")
        out[source.strip()] = lic.strip()
    return out


@app.command("publish")
def publish_cmd(
    name: Annotated[str, typer.Argument(help="Export name under exports/, or an export directory.")],
    repo_id: Annotated[str, typer.Option("--repo-id", help="Hub dataset repository ORG/NAME (created if missing).")],
    private: Annotated[bool, typer.Option("--private", help="Create the repository as private.")] = False,
    exports_dir: Annotated[Path, typer.Option("--exports-dir", help="Where named exports live.")] = Path("exports"),
    allow_unknown_license: Annotated[bool, typer.Option("--allow-unknown-license", help="Publish even though some source's licence is unknown (you have checked you may).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Upload nothing: list the files and sizes that would be uploaded and validate the card's metadata offline (no token needed).")] = False,
) -> None:
    """Push an export to the Hugging Face hub with the token in HF_TOKEN (never stored anywhere)."""
    from ..export import plan_publish, publish_export

    if dry_run:
        plan = plan_publish(name, repo_id, exports_dir=exports_dir, allow_unknown_license=allow_unknown_license)
        table = Table(title=f"ror publish --dry-run: {plan.out_dir} -> {repo_id} (nothing uploaded)")
        table.add_column("file", overflow="fold")
        table.add_column("bytes", justify="right", no_wrap=True)
        for path, size in plan.files:
            table.add_row(path, f"{size:,}")
        table.add_row(f"total: {len(plan.files)} files", f"{plan.total_bytes:,}")
        console.print(table)
        console.print(f"card metadata valid (license {plan.card.get('license')}, configs {', '.join(c.get('config_name', '?') for c in plan.card.get('configs') or [])})", markup=False)
        return

    with console.status(f"publishing {name} to {repo_id} ..."):
        url = publish_export(name, repo_id, exports_dir=exports_dir, private=private, allow_unknown_license=allow_unknown_license)
    console.print(f"published {name} to {url}")
