"""The dataset card (``README.md``) of an export, written through ``huggingface_hub.DatasetCard``.

The YAML header is produced by ``DatasetCardData`` plus ``datasets``' own writers for ``configs:``
(``MetadataConfigs``) and ``dataset_info:`` (``DatasetInfosDict``), so it is the header the hub
expects: license, task categories, one config per exported configuration pointing at its parquet
files, features with the ``ClassLabel`` names in id order, and split sizes.

The body is generated from the export summary: configurations and every column, source traces and
models, which sources' licences allow publishing the text, the token counter behind ``n_tokens``
and the segment length profile, label distribution, label provenance (codebook version, judge
model, prompt template hash), agreement figures from any review study, alignment rule and trace
analytics, and known limitations.

:func:`build_card` is pure: it writes no file. The agreement figures come from
:func:`agreement_section` (which reads the store) and the export writes their full reports.
"""

from __future__ import annotations

from collections import Counter

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import RorError
from .records import BEHAVIORS

if TYPE_CHECKING:  # pragma: no cover
    from huggingface_hub import DatasetCard

    from .export import ExportSummary
    from .store import Store

NO_STUDY = "No human review study in this store: the labels of this dataset have no human agreement figures yet."


def _size_category(n: int) -> str:
    for bound, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < bound:
            return name
    return "1M<n<10M"


def report_slug(name: str) -> str:
    """Folder name (under ``agreement/``) of one comparison's full report."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name.replace(" + ", "_")).strip("_")


def agreement_section(store: "Store") -> tuple[str, dict[str, Any] | None]:
    """Markdown for the agreement section, and the raw figures (None without figures).

    Calls ``ror_annotate.agreement.agreement_summary`` between the human annotators, and, per review
    study, between the humans plus the LLM judge(s) on that study's segments when judge labels
    exist. A comparison the agreement stage refuses with one of its coded errors (e.g. a single
    annotator) becomes a note in the section; any other exception is a bug and propagates. Example
    texts of disagreements are never copied into the card.
    """
    humans = store.labels(source="human")
    if not humans:
        return NO_STUDY, None
    from .agreement import agreement_summary

    pools: dict[str, dict[str, Any]] = {"humans": {"sources": ["human"]}}
    notes: list[str] = []
    if store.labels(source="judge"):
        # Only on the segments humans reviewed (a study's segments): a store-wide pool would count every
        # segment only the judge labeled as an item.
        studies = sorted({lab.study for lab in humans if lab.study})
        for st in studies:
            name = "humans + LLM judge" + (f" ({st})" if len(studies) > 1 else "")
            pools[name] = {"study": st, "with_judge": True, "sources": ["human", "judge"]}
        if not studies:
            notes.append("- humans + LLM judge: no figures (the human labels belong to no review study)")
    figures: dict[str, Any] = {}
    for name, selection in pools.items():
        try:
            fig = agreement_summary(store, n_resamples=200, **selection)
        except RorError as exc:  # the agreement stage's own refusals (coded) must not block an export
            notes.append(f"- {name}: no figures ({exc})")
            continue
        if isinstance(fig.get("selection"), dict) and fig["selection"].get("store"):
            fig["selection"]["store"] = Path(fig["selection"]["store"]).name  # published: no local path
        figures[name] = fig
    if not figures:
        return "Human labels are present, but no agreement figures could be computed:\n" + "\n".join(notes), None
    lines = []
    for name, fig in figures.items():
        lines.append(
            f"- {name}: {fig.get('n_items')} segments in {fig.get('n_traces')} traces, annotators "
            + ", ".join(f"`{a}`" for a in fig.get("annotators") or [])
        )
    lines += notes + ["", "| statistic | " + " | ".join(figures) + " |", "|---|" + "---|" * len(figures)]
    stats = [k for k, v in next(iter(figures.values())).items() if isinstance(v, dict) and "value" in v and "ci_low" in v]
    for key in stats:
        cells = []
        for fig in figures.values():
            est = fig.get(key) or {}
            if est.get("value") is None:
                cells.append(f"undefined ({est.get('reason')})")
            else:
                ci = f" [{_fmt(est.get('ci_low'))}, {_fmt(est.get('ci_high'))}]" if est.get("ci_low") is not None else ""
                cells.append(_fmt(est.get("value")) + ci)
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines += ["", "Values with 95% trace-level bootstrap intervals; `ror agree` gives the full report."]
    return "\n".join(lines), figures


@dataclass(frozen=True)
class CardFigures:
    """Figures from the store's review studies that the card states (computed before the card is built).

    Attributes
    ----------
    agreement : str
        Markdown of the agreement section (:func:`agreement_section`).
    agreement_figures : dict or None
        ``{comparison name: agreement_summary dict}``: the full reports written next to the card.
    calibration : dict
        :func:`ror_annotate.agreement.calibration_summary` with ``ror agree``'s defaults (10 bins,
        1,000 trace resamples, 95%, seed 0): the same numbers as ``ror agree --json``'s ``calibration``.
    """

    agreement: str
    agreement_figures: dict[str, Any] | None
    calibration: dict[str, Any]


def card_figures(store: "Store") -> CardFigures:
    """Compute the agreement and calibration figures the card states (reads the store; writes nothing).

    Returns
    -------
    CardFigures

    Raises
    ------
    Whatever the agreement stage raises that is not one of its coded refusals (a bug propagates).
    """
    from .agreement import calibration_summary

    text, figures = agreement_section(store)
    return CardFigures(agreement=text, agreement_figures=figures, calibration=calibration_summary(store))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "" if v is None else str(v)


def _source_formats(s: "ExportSummary") -> tuple[dict[str, int], str]:
    """Traces per ``source_format`` (from the export summary) and the table's title; empty when no
    trace recorded one (a store written before formats were recorded: nothing to say)."""
    counts = dict(s.trace_sources.get("source_formats") or {})
    if set(counts) <= {"(unknown)"}:
        return {}, ""
    return counts, "source format"


def _counts_table(title: str, counts: Mapping[str, int], total: int | None = None) -> list[str]:
    total = total if total is not None else sum(counts.values())
    lines = [f"| {title} | count | share |", "|---|---:|---:|"]
    for k, v in counts.items():
        lines.append(f"| {k or '(unknown)'} | {v} | {v / total:.1%} |" if total else f"| {k} | {v} | |")
    return lines


def build_card(
    summary: "ExportSummary",
    *,
    data_files: Mapping[str, Mapping[str, list[str]]],
    infos: Mapping[str, tuple[Any, Mapping[str, tuple[int, int]]]],
    agreement: str = NO_STUDY,
    reports: Mapping[str, str] | None = None,
    calibration: Mapping[str, Any] | None = None,
) -> "DatasetCard":
    """Build the dataset card of an export (pure: reads nothing, writes nothing).

    Parameters
    ----------
    summary : ExportSummary
        Counts, analytics, provenance, sources and parameters of the export.
    data_files : mapping
        ``{config: {split: [relative parquet glob]}}``.
    infos : mapping
        ``{config: (datasets.Features, {split: (n_rows, n_bytes)})}``.
    agreement : str
        Markdown of the agreement section (:func:`agreement_section`).
    reports : mapping, optional
        ``{comparison name: relative path of its full report}``, linked from the agreement section.

    Returns
    -------
    huggingface_hub.DatasetCard
    """
    from datasets import DatasetInfo, SplitDict, SplitInfo
    from datasets.info import DatasetInfosDict
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCard, DatasetCardData

    card_data = DatasetCardData(
        license=summary.parameters.get("license") or "other",
        language=["en"],
        pretty_name=summary.name,
        task_categories=["token-classification", "text-classification"],
        tags=["reasoning", "reasoning-traces", "chain-of-thought", "interpretability", "mixture-of-experts", "ror_annotate"],
        size_categories=[_size_category(summary.n_segments)],
    )
    MetadataConfigs(
        {
            config: {"data_files": [{"split": s, "path": paths} for s, paths in splits.items()],
                     **({"default": True} if config == "segments" else {})}
            for config, splits in data_files.items()
        }
    ).to_dataset_card_data(card_data)
    dataset_infos = {}
    for config, (features, splits) in infos.items():
        split_dict = SplitDict()
        for s, (n, nbytes) in splits.items():
            split_dict.add(SplitInfo(name=s, num_bytes=nbytes, num_examples=n))
        dataset_infos[config] = DatasetInfo(
            features=features, splits=split_dict, config_name=config, dataset_size=sum(b for _, b in splits.values())
        )
    DatasetInfosDict(dataset_infos).to_dataset_card_data(card_data)

    body = _body(summary, data_files, agreement, dict(reports or {}))
    return DatasetCard(f"---\n{card_data.to_yaml()}\n---\n\n{body}")


def _columns(config: str) -> list[str]:
    from .export.features import COLUMN_DOCS

    return [f"- `{col}`: {doc}" for col, doc in COLUMN_DOCS[config].items()]


def _uncertainty_lines(u: Mapping[str, Any]) -> list[str]:
    """The card's "Raters and label uncertainty" section (empty for a summary without those figures)."""
    if not u:
        return []
    lines = ["## Raters and label uncertainty", ""]
    raters = u.get("raters") or []
    if raters:
        lines += ["| rater | kind | source | model | crosswalk | labels in store |", "|---|---|---|---|---|---:|"]
        lines += [
            f"| {r['annotator']} | {r['kind']} | {r['source']} | {r.get('model') or ''} | {r.get('crosswalk') or ''} | {r['n_labels']} |"
            for r in raters
        ]
        kinds = Counter(r["kind"] for r in raters)
        lines += ["", f"Raters: {kinds.get('machine', 0)} machine, {kinds.get('human', 0)} human.", ""]
    agg = u.get("aggregate")
    lines.append(
        f"- aggregation: `{agg}` (method {u.get('aggregation_method')}); its `label_confidence` is the posterior of the chosen class"
        if agg else "- aggregation: none read by this export (no aggregate rater, or a label source that does not use one)"
    )
    n = u.get("n_labelled") or 0
    share = u.get("human_verified_share")
    lines.append(
        f"- human-verified labels: {u.get('n_human_verified', 0)} of {n} labelled segments"
        + (f" ({100 * share:.1f}%)" if share is not None else "")
        + ": a human reference (latest adjudication, else the humans' unanimous or single label) equals the exported label"
    )
    mean = u.get("mean_label_confidence")
    lines.append(
        f"- label confidence: given for {u.get('n_with_confidence', 0)} of {n} labelled segments"
        + (f", mean {mean:.3f}" if mean is not None else "")
        + " (`label_confidence`, `label_distribution`; every rater's label is in `raters`)"
    )
    lines.append("")
    return lines


def _body(s: "ExportSummary", data_files: Mapping[str, Mapping[str, list[str]]], agreement: str, reports: Mapping[str, str]) -> str:  # noqa: C901  (one branch per optional card section)
    p = s.parameters
    prov = s.provenance
    tc = s.token_counter or {}
    lines: list[str] = [f"# {s.name}", ""]
    lines += [
        "Reasoning traces written by language models, split into sentence/clause segments and labeled with six "
        "reasoning behaviors (the functional role of each segment), exported by "
        f"`{prov.get('tool_version', 'ror_annotate')}`. The `traces` configuration holds the reasoning text every "
        "segment offset points into, so the dataset can be re-segmented or re-aligned without the original store. "
        + (
            f"Labels are projected onto the tokens of `{p.get('tokenizer')}` ({p.get('rendering')} rendering), so they line "
            "up with per-token model states (router logits, residual stream)."
            if p.get("tokenizer")
            else "No tokenizer was given, so there is no token-level configuration."
        ),
        "",
        "## Labels",
        "",
        "Class ids (`ClassLabel` order, identical in every configuration):",
        "",
    ]
    lines += [f"- {i}: `{b}`" for i, b in enumerate(BEHAVIORS)]
    lines += [
        "",
        "Every value stored in a `ClassLabel` column decodes with `int2str`. In `segments`, `label` is **null** for a "
        "segment the chosen source did not label (or a tied vote). In `tokens`, `labels` is the model-ready integer form "
        "used for token classification: the class id of each token, **-100** for tokens to ignore (special tokens, "
        "chat-template text, whitespace-only tokens, tokens outside every labeled segment), the value "
        "`torch.nn.CrossEntropyLoss` ignores and `DataCollatorForTokenClassification` pads with; the typed form is the "
        "pair `labeled_positions` (token indices) / `labeled_classes` (their `ClassLabel`), which lists labelled tokens only.",
        "",
        f"Label source: **{p.get('label_source')}** "
        "(auto = adjudicated, else human plurality, else the latest aggregate, else LLM judge, else the offline cue-phrase baseline).",
        "",
    ]
    lines += _counts_table("label", s.label_counts, s.n_segments) + [""]
    lines += _counts_table("chosen source", s.label_source_counts, s.n_segments) + [""]
    if s.label_source_counts.get("baseline"):
        lines += [
            f"**{s.label_source_counts['baseline']} segments carry labels of the offline cue-phrase baseline**, a transparent "
            "rule set, not an LLM judge and not a human; treat them as weak labels.",
            "",
        ]

    lines += ["## Configurations and loading", ""]
    for config, splits in data_files.items():
        counts = s.n_rows.get(config, {})
        lines.append(f"- `{config}`: " + ", ".join(f"{sp} {counts.get(sp, 0)} rows" for sp in splits))
    lines += [
        "",
        "```python",
        "import datasets",
        'traces = datasets.load_dataset("<this repo or directory>", "traces")',
        'segments = datasets.load_dataset("<this repo or directory>", "segments")'
        + ("\ntokens = datasets.load_dataset(\"<this repo or directory>\", \"tokens\")" if "tokens" in data_files else ""),
        "# a segment's text is its trace's text at its offsets:",
        "# trace['text'][seg['char_start']:seg['char_end']] == seg['text']",
        "```",
        "",
    ]
    for config in ("traces", "segments", "tokens"):
        if config not in data_files:
            continue
        what = {"traces": "one row per trace", "segments": "one row per segment", "tokens": "one row per trace, one entry per token"}[config]
        lines += [f"### `{config}` ({what})", ""] + _columns(config) + [""]
    if "tokens" in data_files:
        lines += [
            "### Token alignment rule",
            "",
            "A token takes the label of the segment that contains its **first non-whitespace character**. Tokens without a "
            "non-whitespace character (whitespace, zero-width byte-level pieces), special tokens and chat-template text get "
            "-100. A token whose characters fall in two segments (it *straddles* the boundary, e.g. `.So` merged across "
            "a clause break) is labeled by its first character's segment and listed in both segments' token ranges. "
            f"This export has **{s.n_straddling}** straddling tokens out of {s.n_tokens}. Every trace was verified: the "
            "characters covered by each segment's tokens include every non-whitespace character of that segment. "
            f"Tokenizer vocabulary sha256: `{p.get('tokenizer_vocab_sha256')}` (check it matches the model you run).",
            "",
        ]

    lines += ["## Source traces", ""]
    lines += [f"{s.n_traces} traces, {s.n_segments} segments" + (f", {s.n_tokens} tokens." if s.n_tokens else "."), ""]
    for key in ("models", "datasets"):
        counts = s.trace_sources.get(key) or {}
        if counts and set(counts) != {"(unknown)"}:
            lines += _counts_table(key[:-1], dict(list(counts.items())[:30]), s.n_traces) + [""]
    formats, title = _source_formats(s)
    if formats:
        lines += _counts_table(title, formats, sum(formats.values())) + [
            "",
            "The source format is the reader that split each model output into reasoning and answer (`ror ingest "
            "--format`); stored texts have LF line endings.",
            "",
        ]
    lines += [
        "### Licences of the sources",
        "",
        "The traces were written by the models above, not by this project, and this dataset ships their text. Only "
        "sources whose licence is known and allows redistribution may be published; `ror publish` refuses the others "
        "unless told `--allow-unknown-license`.",
        "",
        "| source | licence | text may be published | traces |",
        "|---|---|---|---:|",
    ]
    for src in s.sources[:50]:
        lines.append(
            f"| {src.get('source') or '(unknown)'} | {src.get('license') or 'unknown'} | "
            f"{'yes' if src.get('publishable') else '**no** (licence unknown or restrictive)'} | {src.get('n_traces')} |"
        )
    if len(s.sources) > 50:
        lines.append(f"| ... {len(s.sources) - 50} more sources, see `ror_export.json` | | | |")
    lines += [
        "",
        f"This card's licence field (`{p.get('license') or 'other'}`) was set by whoever ran the export.",
        "",
        "## Token counts and segment length profile",
        "",
    ]
    kind = tc.get("kind") or ("subject tokenizer" if p.get("tokenizer") else "token counter")
    lines.append(
        f"`n_tokens` and the profile below are counted with **`{tc.get('name')}`** ({kind})"
        + (": the tokens of the `tokens` configuration that each segment spans." if p.get("tokenizer") else
           (": the built-in regex approximation of a BPE tokenizer, not the subject model's tokenizer; export with "
            "`--tokenizer` for exact counts." if kind == "approximation" else ", as recorded when the traces were segmented."))
    )
    lines.append("")
    lp = s.segment_length
    if lp:
        from .segment import METHOD_LENGTH_PROFILE as ref

        lines += [
            f"In {lp.get('unit')}: median {_fmt(lp.get('median'))}, 5th percentile {_fmt(lp.get('p5'))}, 95th percentile "
            f"{_fmt(lp.get('p95'))}, max {lp.get('max')} (the Routes-of-Reasoning corpus: median {ref['median']:g}, "
            f"p5 {ref['p5']:g}, p95 {ref['p95']:g}, cap {ref['max']:g}).",
            "",
        ]

    lines += ["## Provenance", ""]
    for key, title in (
        ("codebook_versions", "codebook version"),
        ("judge_models", "judge model"),
        ("prompt_template_hashes", "prompt template hash"),
    ):
        counts = prov.get(key) or {}
        lines.append(f"- {title}: " + (", ".join(f"`{k}` ({v} segments)" for k, v in counts.items()) or "none"))
    lines += [
        f"- tool version: `{prov.get('tool_version')}`",
        f"- splits: by trace (a trace is never split), seed {p.get('seed')}, fractions {p.get('split_fractions')}"
        + (f", stratified by {p.get('stratify_by')}" if p.get("stratify_by") else ""),
        "",
    ]
    annotators = prov.get("annotators") or []
    if annotators:
        lines += ["| source | annotator | labels in store |", "|---|---|---:|"]
        lines += [f"| {a[0]} | {a[1]} | {a[2]} |" for a in annotators]
        lines.append("")

    lines += _uncertainty_lines(s.uncertainty)
    lines += ["## Agreement", "", agreement, ""]
    if reports:
        for name, rel in reports.items():
            lines.append(f"Full report ({name}): [{rel}]({rel})")
        lines.append("")

    a = s.analytics
    lines += ["## Trace analytics", ""]
    fa = a.get("first_answer_fraction", {})
    rr = a.get("recheck_rounds_after_first_answer", {})
    flip = a.get("flip", {})
    lines += [
        f"- first answer (first conclusion that states an answer) found in {a.get('first_answer_found')} of "
        f"{a.get('n_traces')} traces; median position {_fmt(fa.get('median'))} of the trace's tokens",
        f"- tokens after the first answer: {_fmt(a.get('token_share_after_first_answer'))} of all tokens",
        f"- re-checking rounds after the first answer: mean {_fmt(rr.get('mean'))}, median {_fmt(rr.get('median'))}",
        f"- flip rate (first answer right, final wrong): {_fmt(flip.get('flip_rate'))} over {flip.get('n_evaluable')} "
        "traces with a reference answer",
        "- token share per behavior: "
        + ", ".join(f"{k} {_fmt(v)}" for k, v in (a.get("token_share_per_behavior") or {}).items() if v),
        "",
        "Per-trace values are in `analytics.json` next to this card.",
        "",
        "## Known limitations",
        "",
        "- A label is a segment's functional role as judged under one frozen codebook version; other codebooks cut "
        "behaviors differently.",
        "- LLM-judge labels are only as trustworthy as the agreement figures above; without a review study they are "
        "unmeasured.",
        "- Segment boundaries come from rules (sentences and discourse clauses); a token straddling a boundary carries "
        "one label.",
        "- Answer extraction for the analytics is heuristic (last `\\boxed{}`, number or option letter).",
    ]
    if s.label_counts.get("unlabeled"):
        lines.append(f"- {s.label_counts['unlabeled']} segments have no label (null) under the chosen label source.")
    if s.n_ties:
        lines.append(f"- {s.n_ties} of them are tied votes between annotators.")
    lines.append("")
    return "\n".join(lines)
