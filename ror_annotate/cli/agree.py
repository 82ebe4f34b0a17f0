"""``ror agree``: agreement statistics over labels in the store, or over a long-format CSV."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ..errors import InputError
from ..options import RESAMPLES_MAX, SEED_MAX
from .app import DEFAULT_DB_PATH, DbOption, LockTimeoutOption, app, console, open_store

_SEL = "Selection (store)"
_OUT = "Output"


def _fmt_estimate(est: dict[str, Any]) -> tuple[str, str]:
    if est.get("value") is None:
        return f"undefined ({str(est.get('reason')).replace('_', ' ')})", ""  # fewer_than_two_raters: fewer than two raters
    ci = f"[{est['ci_low']:.3f}, {est['ci_high']:.3f}]" if est.get("ci_low") is not None else ""
    return f"{est['value']:.3f}", ci


def _print_tables(d: dict[str, Any]) -> None:
    token = d.get("token_weighted") or {}
    n_traces = d.get("n_traces")
    traces = "? traces" if n_traces is None else f"{n_traces} trace{'' if n_traces == 1 else 's'}"
    table = Table(title=f"Agreement: {d['n_items']} items ({d.get('n_pairable_items', '?')} labelled by two or more), {traces}, {d['n_annotators']} annotators")
    # Token-weighted columns only when there are token counts (not for a CSV without weights).
    for col in ("statistic", "segment", "CI", *(("token", "CI") if token else ())):
        table.add_column(col)
    for key, name in (
        ("percent_agreement", "percent agreement"),
        ("fleiss_kappa", "Fleiss' kappa"),
        ("krippendorff_alpha", "Krippendorff's alpha"),
        ("gwet_ac1", "Gwet's AC1"),
    ):
        table.add_row(name, *_fmt_estimate(d[key]), *(_fmt_estimate(token[key]) if token else ()))
    console.print(table)
    if n_traces == 1 and (d.get("bootstrap") or {}).get("unit") == "trace" and (d.get("bootstrap") or {}).get("n_resamples"):
        # resampling whole traces from one trace draws that trace every time: every interval is one point
        console.print("note: one trace, so the trace-level bootstrap intervals have zero width; label more traces for intervals")
    pairs = Table(title="Cohen's kappa per pair")
    for col in ("A", "B", "items", "kappa", "CI"):
        pairs.add_column(col)
    for k in d["cohen_kappa"]:
        v, ci = _fmt_estimate(k)
        pairs.add_row(k["annotator_a"], k["annotator_b"], f"{k['n_items']:g}", v, ci)
    console.print(pairs)
    pc = d.get("per_class")
    if pc and pc.get("annotators"):
        _print_per_class(pc, d["categories"], d.get("reasons", {}))


def _print_per_class(pc: dict[str, Any], categories: list[str], reasons: dict[str, str]) -> None:
    """Classes as rows and one column per annotator, so names are not cut in an 80-column terminal;
    an undefined F1 shows as "n/a" with its reason listed once under the table."""
    annotators = list(pc["annotators"])
    ref = "the majority of the other annotators" if pc["reference"] == "majority" else pc["reference"]
    t = Table(title=f"Per-class F1 vs {ref}")
    t.add_column("class")
    for ann in annotators:
        t.add_column(ann, justify="right", overflow="fold")
    used: set[str] = set()

    def cell(est: dict[str, Any], with_ci: bool = False) -> str:
        if est.get("value") is None:
            used.add(str(est.get("reason")))
            return f"n/a ({est.get('reason')})"
        value, ci = _fmt_estimate(est)
        return f"{value} {ci}".strip() if with_ci else value

    for c in categories:
        t.add_row(c, *(cell(pc["annotators"][a]["classes"][c]["f1"]) for a in annotators))
    t.add_row("macro-F1", *(cell(pc["annotators"][a]["macro_f1"], with_ci=True) for a in annotators), style="bold")
    console.print(t)
    for reason in sorted(used):
        console.print(f"  n/a ({reason}): {reasons.get(reason, '')}", highlight=False)


def _print_trust(d: dict[str, Any]) -> None:
    """Agreement by rater kind, calibration, drift and weighted estimates (when present)."""
    if d.get("by_kind"):
        _print_by_kind(d["by_kind"])
    if d.get("calibration") is not None:
        _print_calibration(d["calibration"])
    if d.get("drift"):
        _print_drift(d["drift"])
    if d.get("weighted"):
        _print_weighted(d["weighted"])


def _print_by_kind(kinds: dict[str, Any]) -> None:
    t = Table(title="Agreement by rater kind (Krippendorff's alpha; Cohen's kappa per machine-human pair)")
    for col in ("group", "raters", "value", "CI"):
        t.add_column(col, overflow="fold")
    for g in ("human-human", "machine-machine", "pooled"):
        t.add_row(g, str(len(kinds[g]["annotators"])), *_fmt_estimate(kinds[g]["krippendorff_alpha"]))
    for k in kinds["machine-human"]:
        t.add_row("machine-human", f"{k['annotator_a']} | {k['annotator_b']}", *_fmt_estimate(k))
    console.print(t)


def _by_rater(title: str, raters: list[str], rows: list[tuple[str, list[str]]]) -> Table:
    """A table with one row per statistic and one column per rater: at 80 columns a rater's name and an
    estimate with its interval stay whole (one column per statistic cut them into 4-letter pieces)."""
    t = Table(title=title)
    t.add_column("")
    for name in raters:
        t.add_column(name, justify="right", overflow="fold")
    for label, cells in rows:
        t.add_row(label, *cells)
    return t


def _with_ci(est: dict[str, Any]) -> str:
    value, ci = _fmt_estimate(est)
    return f"{value} {ci}".strip()


def _print_calibration(cal: dict[str, Any]) -> None:
    if not cal["raters"]:
        console.print(f"calibration: {cal.get('note', 'no raters')}", highlight=False)
        return
    rs = cal["raters"]
    console.print(_by_rater(
        f"Calibration vs human reference ({cal['n_reference_items']} reviewed segments; {rs[0]['n_bins']} bins)",
        [r["name"] for r in rs],
        [("confidence", [r["confidence_kind"] for r in rs]), ("segments", [str(r["n_items"]) for r in rs]),
         ("accuracy", [f"{r['accuracy']:.3f}" for r in rs]), ("mean confidence", [f"{r['mean_confidence']:.3f}" for r in rs]),
         ("calibration error (ECE)", [_with_ci(r["ece"]) for r in rs]), ("Brier score", [_with_ci(r["brier"]) for r in rs]),
         ("Brier kind", [r["brier_kind"] for r in rs])],
    ))


def _print_drift(drift: dict[str, Any]) -> None:
    t = Table(title=f"Drift by {drift['by']} (Krippendorff's alpha)")
    for col in ("window", "items", "pooled", "human-human", "machine-machine", "machine-human kappa (mean)"):
        t.add_column(col, overflow="fold")
    for w in drift["windows"]:
        mh = [k["value"] for k in w["machine-human"] if k["value"] is not None]
        cells = [" ".join(_fmt_estimate(w[g]["krippendorff_alpha"])) for g in ("pooled", "human-human", "machine-machine")]
        t.add_row(w["window"][:16], str(w["n_items"]), *cells, f"{sum(mh) / len(mh):.3f} ({len(mh)} pairs)" if mh else "n/a")
    console.print(t)


def _print_weighted(wt: dict[str, Any]) -> None:
    strata = ", ".join(f"{s} {n} (pi {', '.join(f'{p:.3g}' for p in wt['inclusion_probabilities'][s])})" for s, n in wt["strata"].items())
    scored = [r for r in wt["raters"] if r.get("n_items")]
    console.print(_by_rater(
        f"Weighted estimates, study {wt['study']}: {wt['n_reviewed']} reviewed of N = {wt['population']}; {strata}",
        [r["rater"] for r in scored],
        [("segments", [str(r["n_items"]) for r in scored]),
         ("accuracy (Hajek)", [_with_ci(r["weighted"]["accuracy"]) for r in scored]),
         ("Cohen's kappa (Hajek)", [_with_ci(r["weighted"]["cohen_kappa"]) for r in scored]),
         ("macro-F1 (Hajek)", [_with_ci(r["weighted"]["macro_f1"]) for r in scored]),
         ("accuracy (Horvitz-Thompson)", [_fmt_estimate(r["horvitz_thompson"]["accuracy"])[0] for r in scored]),
         ("unweighted accuracy", [_with_ci(r["unweighted"]["accuracy"]) for r in scored])],
    ))
    e = Table(title="Errors found per 100 reviewed segments, by stratum (control = what random sampling finds)")
    e.add_column("rater", overflow="fold")
    for s in wt["strata"]:
        e.add_column(s)
    for r in scored:
        e.add_row(r["rater"], *(f"{x['per_100']['value']:.1f} ({x['errors']}/{x['n']})" if x["per_100"]["value"] is not None else "n/a"
                                for x in r["errors_per_100"].values()))
    console.print(e)


@app.command("agree")
def agree(
    db: DbOption = DEFAULT_DB_PATH,
    lock_timeout: LockTimeoutOption = 10.0,
    annotator: Annotated[list[str] | None, typer.Option("--annotator", "-a", help="Compare these annotators (repeatable). Default: all selected.", rich_help_panel=_SEL)] = None,
    source: Annotated[list[str] | None, typer.Option("--source", help="Only labels from these sources: judge, baseline, human, adjudicated (repeatable).", rich_help_panel=_SEL)] = None,
    study: Annotated[str | None, typer.Option("--study", help="Labels of this review study.", rich_help_panel=_SEL)] = None,
    with_judge: Annotated[bool, typer.Option("--with-judge", help="With --study: also the machine labels (judges, baseline, aggregates, ...) on the study's segments.", rich_help_panel=_SEL)] = False,
    codebook_version: Annotated[str | None, typer.Option("--codebook-version", help="Only labels under this codebook version (hash).", rich_help_panel=_SEL)] = None,
    reference: Annotated[str | None, typer.Option("--reference", help="Reference for per-class figures and confusion matrices: human, adjudicated, majority, none, or an annotator name.")] = "majority",
    from_csv: Annotated[Path | None, typer.Option("--from-csv", help="Long-format CSV (item_id, annotator, label; optional trace_id/group, weight) instead of the store.")] = None,
    categories: Annotated[str | None, typer.Option("--categories", help="With --from-csv: comma-separated category set, or 'auto' (the labels found). Default: the six behaviors.")] = None,
    resamples: Annotated[int, typer.Option("--resamples", min=0, max=RESAMPLES_MAX, help="Trace-level bootstrap resamples (0: no intervals).")] = 1000,
    confidence: Annotated[float, typer.Option("--confidence", min=0.5, max=0.999, help="Confidence level of the intervals.")] = 0.95,
    seed: Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX, help="Bootstrap seed.")] = 0,
    n_bins: Annotated[int, typer.Option("--n-bins", min=1, max=1000, help="Equal-width confidence bins of the calibration error (ECE).")] = 10,
    by: Annotated[str | None, typer.Option("--by", help="Drift: agreement by rater kind per codebook version (codebook) or per week / month of the human labels.")] = None,
    weighted: Annotated[bool, typer.Option("--weighted", help="With --study: inverse-probability-weighted (Horvitz-Thompson / Hajek) estimates of each machine rater vs the humans; needs a study with inclusion probabilities and a control stratum.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON (NaN as null with a reason).", rich_help_panel=_OUT)] = False,
    report: Annotated[Path | None, typer.Option("--report", help="Write agreement.md, agreement.json and PNG figures into this folder.", rich_help_panel=_OUT)] = None,
) -> None:
    """Inter-annotator agreement: percent agreement, Cohen's kappa per pair, Fleiss' kappa, Krippendorff's alpha,
    Gwet's AC1, per-class scores vs a reference, with trace-level bootstrap intervals."""
    from ..agreement import agreement, agreement_summary, ratings_from_csv
    from ..records import BEHAVIORS

    ref = None if reference in (None, "", "none") else reference
    if from_csv is not None:
        if study or with_judge or source or codebook_version or by or weighted:
            raise InputError("--from-csv reads labels from the file: --study, --with-judge, --source, --codebook-version, --by and --weighted apply to the store only")
        cats: Any = BEHAVIORS if categories is None else ("auto" if categories.strip() == "auto" else [c.strip() for c in categories.split(",") if c.strip()])
        ratings = ratings_from_csv(from_csv, categories=cats)
        if annotator:
            unknown = [a for a in annotator if a not in ratings.annotators]
            if unknown:
                raise InputError(f"{from_csv}: no labels from annotator(s) {unknown}; the file has {list(ratings.annotators)}")
            ratings = ratings.subset_annotators(annotator)
        if ref in ("human", "adjudicated"):
            raise InputError(f"--reference {ref} needs label sources from the store; with --from-csv use majority, none or an annotator name")
        result = agreement(ratings, reference=ref, n_resamples=resamples, confidence_level=confidence, seed=seed).to_dict()
        result["selection"] = {"csv": str(from_csv)}
    else:
        if categories is not None:
            raise InputError("--categories applies to --from-csv; labels in the store always use the six behaviors")
        with open_store(db, lock_timeout, must_exist=True, read_only=True) as store:
            result = agreement_summary(
                store, annotators=annotator or None, sources=source or None, study=study, with_judge=with_judge,
                codebook_version=codebook_version, reference=ref, n_resamples=resamples, confidence_level=confidence, seed=seed,
                n_bins=n_bins, by=by, weighted=weighted,
            )
    if report is not None:
        from ..agreement_report import write_report

        path = write_report(result, report)
        png = None
        if result.get("calibration"):
            from ..agreement.reliability import write_reliability_png

            png = write_reliability_png(result["calibration"], report)
        if not as_json:
            console.print(f"report: {path}" + (f", reliability diagram: {png}" if png else ""))
    if as_json:
        typer.echo(json.dumps(result, indent=2, allow_nan=False, ensure_ascii=False))
    else:
        _print_tables(result)
        _print_trust(result)
