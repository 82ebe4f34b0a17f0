"""``ror view``: write the static viewer site (trace pages, compare view, dashboard), optionally serve it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import UsageError
from .app import DEFAULT_DB_PATH, DbOption, LockTimeoutOption, app, console, open_store

_D = "Dashboard"


@app.command("view")
def view_cmd(
    out: Annotated[Path, typer.Option("--out", help="Site folder; open OUT/index.html in a browser (no server needed).")] = Path("view"),
    from_export: Annotated[Path | None, typer.Option("--from-export", help="Build from an export folder (or a downloaded copy of the dataset) instead of the store.")] = None,
    serve: Annotated[bool, typer.Option("--serve", help="After building, serve the site on 127.0.0.1 until Ctrl-C.")] = False,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port of --serve (0: any free port).")] = 8765,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="Traces read from the store per batch (memory is bounded by one batch).")] = None,
    low_confidence: Annotated[float | None, typer.Option("--low-confidence", help="Labels with a confidence below this are 'low confidence' for the filter.")] = None,
    reference: Annotated[str | None, typer.Option("--reference", help="Reference of the confusion matrices, as `ror agree --reference`.", rich_help_panel=_D)] = None,
    resamples: Annotated[int | None, typer.Option("--resamples", help="Bootstrap resamples of the agreement intervals (as `ror agree`).", rich_help_panel=_D)] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Bootstrap seed (as `ror agree`).", rich_help_panel=_D)] = None,
    cell_examples: Annotated[int | None, typer.Option("--cell-examples", min=0, help="At most this many segments listed behind one confusion-matrix cell (default 500).", rich_help_panel=_D)] = None,
    agreement: Annotated[bool, typer.Option("--agreement/--no-agreement", help="Compute the agreement figures (from integer label codes; off: the dashboard says so).", rich_help_panel=_D)] = True,
    title: Annotated[str | None, typer.Option("--title", help="Title shown on every page.")] = None,
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
) -> None:
    """Write a self-contained static site to look at labelled traces (coloured by behavior, every
    rater's label, filters, compare view) and a study dashboard (agreement as `ror agree --json`,
    confusion matrices linked to their segments, calibration, cost ledger, review progress)."""
    from .. import pipeline
    from ..view import ViewOptions, make_server

    options = ViewOptions.from_options({
        "batch_size": batch_size, "low_confidence": low_confidence, "reference": reference, "resamples": resamples,
        "seed": seed, "title": title, "agreement": agreement, "cell_examples": cell_examples,
    })
    if from_export is not None:
        if reference is not None or resamples is not None or seed is not None or cell_examples is not None or not agreement:
            raise UsageError("--reference, --resamples, --seed, --cell-examples and --no-agreement set the agreement figures, which need the store; "
                             "drop them with --from-export")
        summary = pipeline.view(from_export, out, options)
    else:
        with open_store(db, lock_timeout, must_exist=True, read_only=True) as store:
            summary = pipeline.view(store, out, options)
    console.print(f"view: {summary.traces} traces, {summary.segments} segments, {summary.labels} labels, raters: {', '.join(summary.raters) or 'none'}", highlight=False)
    if summary.agreement:
        console.print(f"no agreement figures: {summary.agreement}", highlight=False)
    console.print(f"open {summary.index.resolve().as_uri()}", highlight=False)
    if serve:
        server = make_server(out, port)
        console.print(f"serving {out} on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)", highlight=False)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            console.print("stopped", highlight=False)
        finally:
            server.server_close()
