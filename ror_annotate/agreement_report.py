"""The agreement report: a markdown file with PNG figures, written next to a dataset.

``write_report(result, out_dir)`` takes an :class:`~ror_annotate.agreement.AgreementResult` or its
JSON form (``agreement_summary(store, ...)`` / ``ror agree --json``) and writes

- ``agreement.md``: statistics with bootstrap intervals (segment- and token-weighted), Cohen's
  kappa per pair, per-class scores against the reference, the most frequent disagreement pairs with
  example segments, and the meaning of every "undefined" reason;
- ``confusion.png``: one confusion-matrix heat map per annotator (rows: reference);
- ``per_class.png``: per-class F1 per annotator with bootstrap intervals.

The markdown is self-contained apart from the two PNGs (relative links), so the export stage can
paste it into a dataset card. :func:`confusion_figure` and :func:`per_class_figure` return the
``matplotlib.figure.Figure`` objects themselves (for a notebook). Neither importing this module
nor writing a report touches matplotlib's global state (no ``matplotlib.use``, no pyplot).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import AgreementError, ExportError

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

REPORT_NAME = "agreement.md"
CONFUSION_PNG = "confusion.png"
PER_CLASS_PNG = "per_class.png"

_STATS = (
    ("percent_agreement", "Percent agreement"),
    ("fleiss_kappa", "Fleiss' kappa"),
    ("krippendorff_alpha", "Krippendorff's alpha (nominal)"),
    ("gwet_ac1", "Gwet's AC1"),
)


def _as_dict(result: Any) -> dict[str, Any]:
    if isinstance(result, dict):
        return result
    to_dict = getattr(result, "to_dict", None)
    if to_dict is None:
        raise AgreementError(f"write_report needs an AgreementResult or its dict form, got {type(result).__name__}")
    return to_dict()


def _fmt(x: Any, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _cell(est: dict[str, Any] | None) -> tuple[str, str]:
    """(value, interval) cells; an undefined value shows its reason."""
    if not est:
        return "–", ""
    if est.get("value") is None:
        return f"undefined ({est.get('reason')})", ""
    ci = f"[{_fmt(est['ci_low'])}, {_fmt(est['ci_high'])}]" if est.get("ci_low") is not None else ""
    return _fmt(est["value"]), ci


def _md_text(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("|", "\\|")


def _summary_rows(d: dict[str, Any]) -> list[str]:
    token = d.get("token_weighted") or {}
    head = "| statistic | segment-weighted | 95% CI | token-weighted | 95% CI |"
    if d.get("bootstrap", {}).get("confidence_level") not in (None, 0.95):
        level = round(100 * d["bootstrap"]["confidence_level"], 1)
        head = head.replace("95%", f"{level:g}%")
    rows = [head, "|---|---|---|---|---|"]
    for key, name in _STATS:
        seg_v, seg_ci = _cell(d.get(key))
        tok_v, tok_ci = _cell(token.get(key)) if token else ("–", "")
        rows.append(f"| {name} | {seg_v} | {seg_ci} | {tok_v} | {tok_ci} |")
    return rows


def _kappa_rows(d: dict[str, Any]) -> list[str]:
    token = {(k["annotator_a"], k["annotator_b"]): k for k in (d.get("token_weighted") or {}).get("cohen_kappa", [])}
    rows = ["| annotator A | annotator B | items | kappa | 95% CI | token-weighted | 95% CI |", "|---|---|---|---|---|---|---|"]
    for k in d.get("cohen_kappa", []):
        v, ci = _cell(k)
        tv, tci = _cell(token.get((k["annotator_a"], k["annotator_b"])))
        rows.append(f"| {k['annotator_a']} | {k['annotator_b']} | {k.get('n_items', 0)} | {v} | {ci} | {tv} | {tci} |")
    return rows


def _per_class_section(d: dict[str, Any]) -> list[str]:
    pc = d.get("per_class")
    if not pc or not pc.get("annotators"):
        return ["No reference was chosen, so there are no per-class figures (pass a reference: majority, human, adjudicated or an annotator)."]
    lines = [f"Reference: **{pc['reference']}** (confusion rows are the reference, columns the annotator).", ""]
    for ann, entry in pc["annotators"].items():
        mv, mci = _cell(entry.get("macro_f1"))
        av, aci = _cell(entry.get("accuracy"))
        lines += [f"### {ann}", "", f"macro-F1 {mv} {mci}; accuracy {av} {aci}", ""]
        lines += ["| class | support | precision | recall | F1 | 95% CI | kappa (one-vs-rest) |", "|---|---|---|---|---|---|---|"]
        for cls, s in entry["classes"].items():
            p, _ = _cell(s["precision"])
            r, _ = _cell(s["recall"])
            f, fci = _cell(s["f1"])
            k, _ = _cell(s["kappa"])
            lines.append(f"| {cls} | {s['support']:g} | {p} | {r} | {f} | {fci} | {k} |")
        lines.append("")
    return lines


def _disagreement_rows(d: dict[str, Any]) -> list[str]:
    pairs = d.get("disagreements") or []
    if not pairs:
        return ["No two annotators disagreed on any item."]
    rows = ["| labels | count | example segments |", "|---|---|---|"]
    for p in pairs:
        texts = p.get("example_texts") or []
        examples = [
            f"`{_md_text(i, 60)}`" + (f" {_md_text(texts[n])}" if n < len(texts) and texts[n] else "")
            for n, i in enumerate(p.get("examples", []))
        ]
        rows.append(f"| {p['labels'][0]} / {p['labels'][1]} | {p['count']} | {'<br>'.join(examples)} |")
    return rows


def _figure(width: float, height: float) -> "Figure":
    """A matplotlib Figure with its own Agg canvas: no pyplot, no global backend switch, no figure registry.

    ``matplotlib.figure.Figure`` objects built directly are not tracked by pyplot, so nothing
    leaks between reports and the caller's backend (a notebook's inline one) stays as it was.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def confusion_figure(d: dict[str, Any]) -> "Figure | None":
    """One confusion-matrix heat map per annotator (rows: reference, colour: share of the row); None without per-class figures.

    ``d`` is the dict form of an :class:`~ror_annotate.agreement.AgreementResult`.
    """
    pc = (d.get("per_class") or {}).get("annotators") or {}
    if not pc:
        return None
    import numpy as np

    cats = d["categories"]
    n = len(pc)
    # constrained layout keeps each panel's tick labels clear of its neighbour's
    fig = _figure(4.6 * n + 1.2, 4.8)
    fig.set_layout_engine("constrained")
    axes = fig.subplots(1, n, squeeze=False)
    images = []
    for ax, (ann, entry) in zip(axes[0], pc.items()):
        counts = np.asarray(entry["confusion_matrix"], dtype=float)
        rows = counts.sum(1, keepdims=True)
        share = np.divide(counts, rows, out=np.zeros_like(counts), where=rows > 0)
        images.append(ax.imshow(share, vmin=0, vmax=1, cmap="Blues"))
        for i in range(len(cats)):
            for j in range(len(cats)):
                ax.text(j, i, f"{counts[i, j]:g}", ha="center", va="center", fontsize=7,
                        color="white" if share[i, j] > 0.6 else "black")
        ax.set_xticks(range(len(cats)), cats, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(cats)), cats, fontsize=8)
        ax.set_title(ann, fontsize=9)
        ax.set_xlabel("rater's label")
        ax.set_ylabel(f"reference label ({_reference_name(d)})")
    fig.colorbar(images[-1], ax=axes[0].tolist(), shrink=0.8, label="share of reference row")
    fig.suptitle(f"Confusion matrices vs {_reference_name(d)} (numbers: segments; colour: share of the reference row)", fontsize=10)
    return fig


def _reference_name(d: dict[str, Any]) -> str:
    """The per-class reference as a reader says it: "majority" is the majority of the *other* annotators."""
    ref = d["per_class"]["reference"]
    return "majority of the other annotators" if ref == "majority" else ref


def per_class_figure(d: dict[str, Any]) -> "Figure | None":
    """Per-class F1 per annotator with bootstrap intervals as error bars; None without per-class figures."""
    pc = (d.get("per_class") or {}).get("annotators") or {}
    if not pc:
        return None
    import numpy as np

    from matplotlib.patches import Patch

    cats = d["categories"]
    width = 0.8 / len(pc)
    fig = _figure(max(6, 1.3 * len(cats)), 3.8)
    ax = fig.add_subplot()
    x = np.arange(len(cats))
    for n, entry in enumerate(pc.values()):
        f1 = [entry["classes"][c]["f1"] for c in cats]
        vals = np.array([e["value"] if e["value"] is not None else np.nan for e in f1], dtype=float)
        lo = np.array([e["ci_low"] if e["ci_low"] is not None else np.nan for e in f1], dtype=float)
        hi = np.array([e["ci_high"] if e["ci_high"] is not None else np.nan for e in f1], dtype=float)
        # a percentile interval need not contain the estimate on tiny data; matplotlib wants yerr >= 0
        err = np.clip(np.vstack([np.nan_to_num(vals - lo), np.nan_to_num(hi - vals)]), 0, None)
        # an undefined F1 (class absent from the reference and never predicted) is no bar and an "n/a" mark,
        # never a bar of height 0 (that reads as F1 = 0)
        ok = ~np.isnan(vals)
        pos = x + n * width - 0.4 + width / 2
        colour = f"C{n % 10}"
        if ok.any():
            # yerr as two lists: a (2, 1) array makes matplotlib call math.isfinite on an array (NumPy deprecation)
            ax.bar(pos[ok], vals[ok], width, yerr=[list(e) for e in err[:, ok]], capsize=2, color=colour)
        for p in pos[~ok]:
            ax.text(p, 0.01, "n/a", rotation=90, ha="center", va="bottom", fontsize=7, color=colour)

    ax.set_xticks(x, cats, rotation=30, ha="right")
    ax.set_xlim(-0.5, len(cats) - 0.5)  # the "n/a" marks do not widen the axis as bars do
    ax.set_ylim(0, 1.05)
    undefined = any(t.get_text() == "n/a" for t in ax.texts)
    ax.set_xlabel("behavior" + (" (n/a: F1 undefined, the class is absent from the reference and never labelled)" if undefined else ""))
    ax.set_ylabel("F1")
    level = (d.get("bootstrap") or {}).get("confidence_level") or 0.95
    ax.set_title(f"Per-class F1 vs {_reference_name(d)} (error bars: {level:.0%} trace-bootstrap interval)", fontsize=9)
    # outside the axes, right of the bars: inside it covered the bars of the first classes
    # one entry per rater, also for a rater whose every F1 is undefined (no bar to take the entry from)
    handles = [Patch(facecolor=f"C{n % 10}", label=ann) for n, ann in enumerate(pc)]
    ax.legend(handles=handles, fontsize=8, title="rater", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def _save(fig: "Figure | None", path: Path) -> bool:
    if fig is None:
        return False
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return True


def write_report(result: Any, out_dir: str | Path, *, title: str = "Agreement report") -> Path:
    """Write ``agreement.md``, ``agreement.json`` and the PNG figures into ``out_dir``.

    Parameters
    ----------
    result : AgreementResult or dict
        The figures (the dict form is what ``agreement_summary`` returns).
    out_dir : str or Path
        Created if missing; files of the same names are overwritten.
    title : str
        First heading of the markdown.

    Returns
    -------
    Path
        The markdown file.

    Raises
    ------
    ExportError
        ``out_dir`` cannot be created or written (a file in the way, no permission, disk full).
    """
    d = _as_dict(result)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        return _write_files(d, out, title)
    except OSError as exc:
        raise ExportError(f"cannot write the agreement report into {out}: {exc.strerror or exc}; choose another --report folder") from None


def _write_files(d: dict[str, Any], out: Path, title: str) -> Path:
    boot = d.get("bootstrap", {})
    lines = [
        f"# {title}",
        "",
        f"{d['n_items']} items (segments) in {d.get('n_traces', '?')} traces, labeled by {d['n_annotators']} annotators "
        f"({', '.join(d.get('annotators', []))}); categories: {', '.join(d.get('categories', []))}.",
        "",
        f"Intervals: {boot.get('method', 'percentile')} bootstrap over whole traces (segments of one trace are not "
        f"independent), {boot.get('n_resamples', 0)} resamples, seed {boot.get('seed')}. Token-weighted figures weight "
        "each segment by its token count.",
        "",
        "## Agreement",
        "",
        *_summary_rows(d),
        "",
        "## Cohen's kappa per pair",
        "",
        *_kappa_rows(d),
        "",
        "## Per-class agreement",
        "",
        *_per_class_section(d),
    ]
    if _save(confusion_figure(d), out / CONFUSION_PNG):
        lines += [f"![Confusion matrices]({CONFUSION_PNG})", ""]
    if _save(per_class_figure(d), out / PER_CLASS_PNG):
        lines += [f"![Per-class F1]({PER_CLASS_PNG})", ""]
    lines += ["## Most frequent disagreements", "", *_disagreement_rows(d), ""]
    used = _reasons_used(d)
    if used:
        lines += ["## Undefined values", ""]
        reasons = d.get("reasons", {})
        lines += [f"- `{r}`: {reasons.get(r, '')}" for r in sorted(used)]
        lines.append("")
    path = out / REPORT_NAME
    path.write_text("\n".join(lines), encoding="utf-8")
    (out / "agreement.json").write_text(json.dumps(d, indent=2, allow_nan=False, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def _reasons_used(obj: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(obj, dict):
        if obj.get("reason") and obj.get("value") is None:
            found.add(obj["reason"])
        for k, v in obj.items():
            if k != "reasons":
                found |= _reasons_used(v)
    elif isinstance(obj, list):
        for v in obj:
            found |= _reasons_used(v)
    return found
