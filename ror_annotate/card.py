"""The dataset card (``README.md``) of an export, rendered through ``huggingface_hub.DatasetCard``.

The YAML header (:func:`card_data`) is produced by ``DatasetCardData`` plus ``datasets``' own writers
for ``configs:`` (``MetadataConfigs``) and ``dataset_info:`` (``DatasetInfosDict``), so it is the
header the hub expects: license, task categories, tags, size category, one config per exported
configuration pointing at its parquet files, features with the ``ClassLabel`` names in id order, and
split sizes.

The body is the Jinja template ``ror_annotate/templates/dataset_card.md`` (:data:`TEMPLATE`),
rendered by ``DatasetCard.from_template`` with the values of :func:`card_context`: configurations and
every column (from :data:`ror_annotate.export.columns.COLUMNS`), source traces and models, which
sources' licences allow publishing the text, the token counter behind ``n_tokens`` and the segment
length profile, label distribution, label provenance, the raters, the aggregate's ensemble, the
share of human-verified labels, the calibration of every machine rater with a confidence against
the human reference, agreement figures from any review study, alignment rule, trace analytics and
known limitations.

:func:`build_card` is pure: it computes no figure and writes no file. The figures from review
studies come from :func:`card_figures` (which reads the store: :func:`agreement_figures` and
``ror_annotate.agreement.calibration_summary``), and the export writes their full reports.
"""

from __future__ import annotations

from collections import Counter

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import RorError
from .records import BEHAVIORS

if TYPE_CHECKING:  # pragma: no cover
    from huggingface_hub import DatasetCard, DatasetCardData

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


def agreement_figures(store: "Store") -> tuple[bool, dict[str, Any], list[str]]:
    """The agreement figures the card states: whether human labels exist, figures per comparison, notes.

    Calls ``ror_annotate.agreement.agreement_summary`` between the human annotators, and, per review
    study, between the humans plus the LLM judge(s) on that study's segments when judge labels
    exist. A comparison the agreement stage refuses with one of its coded errors (e.g. a single
    annotator) becomes a note (``"- NAME: no figures (REASON)"``); any other exception is a bug and
    propagates. Example texts of disagreements are never copied into the card.

    Returns
    -------
    (bool, dict, list of str)
        Human labels exist; ``{comparison name: agreement_summary dict}`` (the store's path reduced to
        its name); the notes.
    """
    humans = store.labels(source="human")
    if not humans:
        return False, {}, []
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
    human_names = sorted({lab.annotator for lab in humans})
    if len(human_names) == 1:  # the agreement stage's refusal speaks of judges and selections: say it for a card reader
        del pools["humans"]
        notes.append(f"- humans: no figures (one human annotator, {human_names[0]}: agreement between humans needs a second "
                     "annotator on the same segments, e.g. a review study with two: `ror review start NAME -a A -a B`)")
    for name, selection in pools.items():
        try:
            fig = agreement_summary(store, n_resamples=200, **selection)
        except RorError as exc:  # the agreement stage's own refusals (coded) must not block an export
            notes.append(f"- {name}: no figures ({exc})")
            continue
        if isinstance(fig.get("selection"), dict) and fig["selection"].get("store"):
            fig["selection"]["store"] = Path(fig["selection"]["store"]).name  # published: no local path
        figures[name] = fig
    return True, figures, notes


@dataclass(frozen=True)
class CardFigures:
    """Figures from the store's review studies that the card states (computed before the card is built).

    Attributes
    ----------
    human_labels : bool
        The store holds human labels (else the card says there is no review study).
    agreement : dict
        ``{comparison name: agreement_summary dict}`` (:func:`agreement_figures`); the export writes
        each one's full report next to the card.
    notes : list of str
        Comparisons that gave no figures, and why.
    calibration : dict or None
        :func:`ror_annotate.agreement.calibration_summary` with ``ror agree``'s defaults (10 bins,
        1,000 trace resamples, 95%, seed 0): the same numbers as ``ror agree --json``'s ``calibration``.
        None leaves the calibration section out.
    """

    human_labels: bool = False
    agreement: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    calibration: dict[str, Any] | None = None


def card_figures(store: "Store") -> CardFigures:
    """Compute the agreement and calibration figures the card states (reads the store; writes nothing).

    Returns
    -------
    CardFigures

    Raises
    ------
    Exception
        Whatever the agreement stage raises that is not one of its coded refusals (a bug propagates).
    """
    from .agreement import calibration_summary

    human_labels, figures, notes = agreement_figures(store)
    return CardFigures(human_labels=human_labels, agreement=figures, notes=notes, calibration=calibration_summary(store))


def _md(value: Any) -> str:
    """A data string (a rater, model, dataset, source or licence name) as literal Markdown text in a
    table cell or a line of the card.

    ``&``, ``<`` and ``>`` become entities (a renderer that passes HTML through would otherwise run a
    ``<script>`` or an ``<img onerror>`` from a model name, and one that sanitises would hide it),
    ``|`` is escaped (it would split the cell) and line breaks become spaces (they would end the row).
    """
    text = "" if value is None else str(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return " ".join(text.splitlines())


def _code(value: Any) -> str:
    """A data string as an inline code span on one line that no backtick inside it closes early
    (CommonMark: a fence longer than the longest run of backticks inside, padded with spaces)."""
    text = " ".join(str(value).splitlines())
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return f"{'`' * (run + 1)} {text} {'`' * (run + 1)}" if run else f"`{text}`"


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


#: The card's Jinja template (package data), rendered by ``huggingface_hub.DatasetCard.from_template``.
TEMPLATE = Path(__file__).parent / "templates" / "dataset_card.md"

#: What each ``--labels`` choice exports (:mod:`ror_annotate.export.labels`), as the card states it.
LABEL_RULES = {
    "auto": "auto = adjudicated, else human plurality, else the latest aggregate, else LLM judge, else the offline cue-phrase baseline",
    "adjudicated": "the review reference: the latest adjudication, else the humans' label when they all agree",
    "human": "plurality of the human annotators' latest labels; a tie leaves the segment unlabeled",
    "judge": "plurality of the LLM judges' latest labels; a tie leaves the segment unlabeled",
    "baseline": "the offline cue-phrase baseline",
    "majority": "plurality over every human and LLM-judge annotator; a tie leaves the segment unlabeled",
    "aggregate": "the newest aggregate rater's label, from `ror aggregate`, with its posterior as `label_confidence`",
    "import": "plurality over the raters imported from other projects (`ror labels import`); a tie leaves the segment unlabeled",
}

_WHAT = {"traces": "one row per trace", "segments": "one row per segment", "tokens": "one row per trace, one entry per token"}


def build_card(
    summary: "ExportSummary",
    *,
    data_files: Mapping[str, Mapping[str, list[str]]],
    infos: Mapping[str, tuple[Any, Mapping[str, tuple[int, int]]]],
    figures: CardFigures | None = None,
    reports: Mapping[str, str] | None = None,
) -> "DatasetCard":
    """Build the dataset card of an export (pure: reads nothing but its template, writes nothing).

    The YAML header is :func:`card_data`; the body is :data:`TEMPLATE` rendered through
    ``huggingface_hub.DatasetCard.from_template`` with :func:`card_context`.

    Parameters
    ----------
    summary : ExportSummary
        Counts, analytics, provenance, sources, parameters and rater figures of the export.
    data_files : mapping
        ``{config: {split: [relative parquet glob]}}``.
    infos : mapping
        ``{config: (datasets.Features, {split: (n_rows, n_bytes)})}``.
    figures : CardFigures, optional
        Agreement and calibration figures (:func:`card_figures`); default none (no review study).
    reports : mapping, optional
        ``{comparison name: relative path of its full report}``, linked from the agreement section.

    Returns
    -------
    huggingface_hub.DatasetCard

    Raises
    ------
    ImportError
        ``jinja2`` is not installed (a core dependency).
    """
    from huggingface_hub import DatasetCard

    context = card_context(summary, data_files=data_files, figures=figures, reports=reports)
    return DatasetCard.from_template(card_data(summary, data_files, infos), template_path=str(TEMPLATE), **context)


def card_data(
    summary: "ExportSummary",
    data_files: Mapping[str, Mapping[str, list[str]]],
    infos: Mapping[str, tuple[Any, Mapping[str, tuple[int, int]]]],
) -> "DatasetCardData":
    """The card's YAML metadata: licence, language, task categories, tags, size category, ``configs``
    (``datasets``' ``MetadataConfigs``) and ``dataset_info`` (``DatasetInfosDict``)."""
    from datasets import DatasetInfo, SplitDict, SplitInfo
    from datasets.info import DatasetInfosDict
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCardData

    data = DatasetCardData(
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
    ).to_dataset_card_data(data)
    dataset_infos = {}
    for config, (features, splits) in infos.items():
        split_dict = SplitDict()
        for s, (n, nbytes) in splits.items():
            split_dict.add(SplitInfo(name=s, num_bytes=nbytes, num_examples=n))
        dataset_infos[config] = DatasetInfo(
            features=features, splits=split_dict, config_name=config, dataset_size=sum(b for _, b in splits.values())
        )
    DatasetInfosDict(dataset_infos).to_dataset_card_data(data)
    return data


def _known(counts: Mapping[str, int] | None, limit: int = 30) -> dict[str, int]:
    """The first ``limit`` entries of a count table, or nothing when every value is unknown."""
    if not counts or set(counts) == {"(unknown)"}:
        return {}
    return dict(list(counts.items())[:limit])


def _agreement_stats(figures: Mapping[str, Any]) -> list[str]:
    """The statistics (keys with a value and an interval) of the first comparison, in its order."""
    if not figures:
        return []
    first = next(iter(figures.values()))
    return [k for k, v in first.items() if isinstance(v, dict) and "value" in v and "ci_low" in v]


def card_context(
    s: "ExportSummary",
    *,
    data_files: Mapping[str, Mapping[str, list[str]]],
    figures: CardFigures | None = None,
    reports: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The values :data:`TEMPLATE` renders (pure): the summary and the figures, picked and named for the template."""
    from .export.features import COLUMN_DOCS
    from .segment import METHOD_LENGTH_PROFILE

    f = figures or CardFigures()
    calibration = f.calibration
    tc = s.token_counter or {}
    u = dict(s.uncertainty or {})
    u.pop("calibration", None)  # stated from ``calibration``
    ensemble = (u.get("ensemble") or {}).get("raters") or []
    kinds = Counter(r["kind"] for r in u.get("raters") or [])
    n_aggregate = s.label_source_counts.get("aggregate", 0)
    exported = u.get("aggregate") if n_aggregate else None
    n_labelled = u.get("n_labelled") or 0
    exported_what = "the exported labels" if n_aggregate == n_labelled else f"the exported label of {n_aggregate} of {n_labelled} labelled segments"
    return {
        "s": s, "p": s.parameters, "prov": s.provenance, "tc": tc, "u": u, "a": s.analytics,
        "label_rule": LABEL_RULES.get(str(s.parameters.get("label_source")), "see `ror export --help`"),
        "name": s.name, "tool_version": s.provenance.get("tool_version", "ror_annotate"), "behaviors": list(BEHAVIORS),
        "data_files": data_files,
        "configurations": [(c, _WHAT[c], COLUMN_DOCS[c]) for c in ("traces", "segments", "tokens") if c in data_files],
        "trace_tables": [(key[:-1], _known(s.trace_sources.get(key))) for key in ("models", "datasets") if _known(s.trace_sources.get(key))],
        "source_formats": _source_formats(s)[0],
        "tc_kind": tc.get("kind") or ("subject tokenizer" if s.parameters.get("tokenizer") else "token counter"),
        "lp": s.segment_length, "ref": METHOD_LENGTH_PROFILE,
        "provenance": [(title, s.provenance.get(key) or {}) for key, title in (
            ("codebook_versions", "codebook version"), ("judge_models", "judge model"), ("prompt_template_hashes", "prompt template hash"))],
        "n_machine": kinds.get("machine", 0), "n_human": kinds.get("human", 0), "ensemble": ensemble,
        "calibration": calibration, "exported_rater": exported, "exported_what": exported_what,
        "calibrated": {r["annotator"] for r in (calibration or {}).get("raters") or []},
        "human_labels": f.human_labels, "agreement": f.agreement, "agreement_notes": f.notes, "no_study": NO_STUDY,
        "agreement_stats": _agreement_stats(f.agreement), "reports": dict(reports or {}),
        "fa": s.analytics.get("first_answer_fraction", {}), "rr": s.analytics.get("recheck_rounds_after_first_answer", {}),
        "flip": s.analytics.get("flip", {}),
        "token_share": [(k, v) for k, v in (s.analytics.get("token_share_per_behavior") or {}).items() if v],
        "fmt": _fmt, "md": _md, "code": _code,
    }
