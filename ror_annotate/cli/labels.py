"""``ror labels``: labels from elsewhere. ``ror labels import FILE`` maps another project's labels onto
the six behaviors through a crosswalk and stores them as their own rater."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .app import DEFAULT_DB_PATH, DbOption, LockTimeoutOption, app, console, open_store

labels_app = typer.Typer(help="Labels from other projects: import them through a crosswalk onto the six behaviors.", no_args_is_help=True)
app.add_typer(labels_app, name="labels")


@labels_app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="Labels file: .jsonl, .csv or .parquet (per segment, or per character span of the trace text).")],
    annotator: Annotated[str, typer.Option("--annotator", help="Rater id written on the imported labels.")],
    kind: Annotated[str, typer.Option("--kind", help="machine or human: who produced the labels.")],
    crosswalk: Annotated[str, typer.Option("--crosswalk", help="Built-in crosswalk (thought-anchors, reasoningflow, venhoff, six-behaviors; name@vN) or a YAML file.")] = "six-behaviors",
    label_column: Annotated[str, typer.Option("--label-column", help="Column holding the source category.")] = "label",
    unit: Annotated[str, typer.Option("--unit", help="auto, segment or span (auto: span when char_start/char_end columns exist).")] = "auto",
    min_share: Annotated[float, typer.Option("--min-share", help="Span unit: least share of a segment's non-space characters the winning label must cover.")] = 0.5,
    model: Annotated[str | None, typer.Option("--model", help="Model or method that produced the labels (declared with the rater).")] = None,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Import labels another project produced, mapped onto the six behaviors (source 'import')."""
    from .. import pipeline
    from ..labels_import import ImportOptions

    options = ImportOptions.from_options(
        {"annotator": annotator, "kind": kind, "crosswalk": crosswalk, "label_column": label_column, "unit": unit,
         "min_share": min_share, "model": model}
    )
    with open_store(db, lock_timeout, must_exist=True) as store:
        summary = pipeline.import_labels(store, file, options)
    table = Table(title=f"ror labels import: {summary.file}", show_header=False)
    table.add_column("what")
    table.add_column("value", overflow="fold")  # a long path folds onto the next line, never cut to "…"
    for k, v in summary.table_rows():
        table.add_row(k, v)
    console.print(table)
