"""Traces in: JSONL, JSON arrays, parquet and Hugging Face datasets, to :class:`~ror_annotate.records.Trace`.

Every input goes through the same steps: read rows (with file and line numbers; LF, CRLF or lone
CR line endings, an optional UTF-8 BOM), map columns (a :class:`ColumnMap`, from the user, a
preset, or the default candidate names), extract the reasoning and the answer with the format
adapters of :mod:`ror_annotate.formats` (``<think>`` tags and variants, Harmony, Mistral, Seed,
Kimi, OpenAI-compatible response objects, chat transcripts; auto-detected or forced), refuse a
known control token or thinking marker left in the result, give each trace a stable id, and
validate. Stored texts always have LF line endings (see :func:`ror_annotate.formats.normalize_newlines`).
Bad rows raise :class:`~ror_annotate.errors.InputError` naming the file and line, or are counted
and reported with ``skip_invalid=True``. Nothing is written anywhere here;
ingestion into the store happens only after the whole input has been read and validated.
"""

from __future__ import annotations

import json
import sys
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import ConfigError, InputError
from .formats import (
    AUTO, EOS_TOKENS, FORMATS, MARKER_HINTS, HarmonyFormat, PlainFormat, StructuredFormat, TagFormat, detect_structured, extract,
    extract_text, find_marker, line_col, markers_in, normalize_newlines,
)
from .hub import OFFLINE_HINT, check_hub
from .records import Trace, sha256_text
from .registry import Registry

# Default candidate column names, tried in order when no mapping is given.
_CANDIDATES: dict[str, tuple[str, ...]] = {
    "text": ("trace", "reasoning", "reasoning_content", "thinking", "thinking_trajectory", "cot", "response", "generation", "completion", "output", "text"),
    "trace_id": ("trace_id", "id", "uuid", "idx"),
    "problem": ("problem", "question", "prompt", "input"),
    "answer": ("answer", "final_answer", "attempt", "solution_text"),
    "gold_answer": ("gold_answer", "reference_answer", "ground_truth", "gt_answer"),
    "correct": ("correct", "is_correct", "correctness"),
    "model": ("model", "model_name", "generator"),
    "source": ("source_repo", "source"),
    "dataset": ("dataset", "benchmark", "subset", "domain"),
}


class ColumnMap(BaseModel):
    """Which input column holds which trace field. ``None`` means "try the default candidates".

    ``text`` may name a list-valued column (several generations per problem); each element
    then becomes its own trace, with ``correct`` taken from the same position of a list-valued
    ``correct`` column.
    """

    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    trace_id: str | None = None
    problem: str | None = None
    answer: str | None = None
    gold_answer: str | None = None
    correct: str | None = None
    model: str | None = None
    source: str | None = None
    dataset: str | None = None
    #: Fixed values for fields with no column (e.g. the model that wrote a preset's traces).
    constants: dict[str, Any] = {}
    #: Tag pair that wraps the reasoning when it is not ``<think>``/``</think>``.
    think_tags: tuple[str, str] | None = None


@dataclass(frozen=True)
class Preset:
    """Column mapping of a popular public trace dataset, taken from its dataset card."""

    name: str
    hub_id: str
    description: str
    columns: ColumnMap
    config: str | None = None
    default_split: str = "train"


#: Column mappings of public trace datasets (the one registry mechanism, :mod:`ror_annotate.registry`;
#: plug-ins through the ``ror_annotate.presets`` entry-point group, each entry a :class:`Preset`).
PRESET_REGISTRY: Registry[Preset] = Registry("presets", what="preset")
for _preset in (
        Preset(
            name="openr1-math",
            hub_id="open-r1/OpenR1-Math-220k",
            description="DeepSeek-R1 solutions to NuminaMath 1.5 problems; several generations per problem, each with <think> tags.",
            columns=ColumnMap(
                text="generations", trace_id="uuid", problem="problem", gold_answer="answer",
                correct="correctness_math_verify", dataset="source", constants={"model": "deepseek-ai/DeepSeek-R1"},
            ),
            config="default",
        ),
        Preset(
            name="s1k-1.1",
            hub_id="simplescaling/s1K-1.1",
            description="s1K-1.1: 1,000 hard problems with DeepSeek-R1 thinking trajectories and attempts.",
            columns=ColumnMap(
                text="deepseek_thinking_trajectory", problem="question", answer="deepseek_attempt",
                gold_answer="solution", dataset="source_type", constants={"model": "deepseek-ai/DeepSeek-R1"},
            ),
        ),
        Preset(
            name="s1k",
            hub_id="simplescaling/s1K",
            description="s1K: 1,000 problems with Gemini Flash Thinking trajectories (list column) and attempts.",
            columns=ColumnMap(
                text="thinking_trajectories", problem="question", answer="attempt", gold_answer="solution",
                dataset="source_type", constants={"model": "gemini-2.0-flash-thinking-exp"},
            ),
        ),
        Preset(
            name="openthoughts",
            hub_id="open-thoughts/OpenThoughts-114k",
            description="OpenThoughts-114k 'metadata' config: DeepSeek-R1 reasoning and solutions for math, code, science and puzzles.",
            columns=ColumnMap(
                text="deepseek_reasoning", problem="problem", answer="deepseek_solution",
                gold_answer="ground_truth_solution", dataset="domain", constants={"model": "deepseek-ai/DeepSeek-R1"},
            ),
            config="metadata",
        ),
):
    PRESET_REGISTRY.register(_preset.name, _preset)
#: Read-only live view of the registered presets.
PRESETS = PRESET_REGISTRY.loaded()


@dataclass
class SkippedRecord:
    """A record left out with ``skip_invalid=True``: where it was and why."""

    where: str
    reason: str


#: Counted in :attr:`LoadResult.notes` for each trace stored with a marker under ``allow_markers``.
NOTE_MARKERS = "control token or thinking marker left in the stored text (--allow-markers)"


@dataclass
class LoadResult:
    """The traces read from one input, plus what was skipped (only with ``skip_invalid``).

    ``notes`` counts traces per remark worth reporting (text between reasoning blocks kept in
    ``meta.gaps``, markers stored under ``allow_markers``, line endings normalized, ...);
    ``formats`` counts traces per ``source_format``.
    """

    traces: list[Trace]
    skipped: list[SkippedRecord] = field(default_factory=list)
    source: str = ""
    notes: Counter[str] = field(default_factory=Counter)
    formats: Counter[str] = field(default_factory=Counter)
    #: Ids of every trace read, in input order (also when the traces went to ``on_batch``).
    trace_ids: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- reasoning extraction
_BOXED = re.compile(r"\\boxed\{")


def split_reasoning(text: str, tags: tuple[str, str] | None = None) -> tuple[str, str | None, bool]:
    """Split one model output string into ``(reasoning, final answer, had_markers)``.

    A thin wrapper over :func:`ror_annotate.formats.extract_text` with auto-detection (every
    format of :data:`ror_annotate.formats.FORMATS` that reads a string): ``<think>R</think>A``, a
    missing opening tag, a truncated block, several blocks, Harmony channels, Mistral, Seed and
    Kimi markers. Text without markers is all reasoning. Both strings are stripped; the answer is
    None when empty.

    Raises
    ------
    InputError
        Nested or unbalanced tags (see :class:`ror_annotate.formats.TagFormat`).
    """
    got = extract_text(text, "text", tags=tags)
    return got.reasoning, got.answer, got.format != "plain"


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` in ``text`` (balanced braces), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i = starts[-1]
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i : j - 1] if depth == 0 else None


# --------------------------------------------------------------------------- readers
def _lines(fh: Any) -> Iterator[bytes]:
    """Lines of a binary file ended by LF, CRLF or a lone CR (classic Mac), without their endings.

    Splitting on CR is safe for JSON Lines: JSON forbids a raw CR inside a string, and bytes (unlike
    ``str.splitlines``) never split on U+2028 or other Unicode separators a JSON string may hold.
    """
    for chunk in fh:
        chunk = chunk[:-2] if chunk.endswith(b"\r\n") else chunk[:-1] if chunk.endswith(b"\n") else chunk
        yield from chunk.split(b"\r") if b"\r" in chunk else (chunk,)


#: Code of a record nested too deeply for the JSON reader (a recursion limit, not a crash).
NESTED_JSON = "E111"


def _too_nested(where: str) -> InputError:
    return InputError(
        f"{where}: the JSON is nested too deeply to read (more levels than Python's recursion limit of "
        f"{sys.getrecursionlimit()}); flatten the record, or pass --skip-invalid to leave it out",
        code=NESTED_JSON,
    )


def _iter_jsonl(path: Path) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    with path.open("rb") as fh:
        for lineno, raw in enumerate(_lines(fh), start=1):
            where = f"{path}:{lineno}"
            if not raw.strip():
                continue
            try:
                # utf-8-sig on the first line: Windows tools (Notepad, PowerShell) start files with a BOM.
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                yield where, InputError(f"{where}: byte {exc.start} is not valid UTF-8 ({raw[exc.start:exc.start + 1]!r}); re-encode the file as UTF-8")
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                yield where, InputError(f"{where}: malformed JSON at column {exc.colno}: {exc.msg}")
                continue
            except RecursionError:
                yield where, _too_nested(where)
                continue
            if not isinstance(obj, dict):
                yield where, InputError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
                continue
            yield where, obj


def _iter_json_array(path: Path) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: byte {exc.start} is not valid UTF-8; re-encode the file as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: malformed JSON at column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise _too_nested(str(path)) from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise InputError(f"{path}: expected a JSON array of trace objects (or an object holding exactly one such array)")
        data = lists[0]
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON array of trace objects, got {type(data).__name__}")
    for i, obj in enumerate(data):
        where = f"{path}[{i}]"
        yield where, obj if isinstance(obj, dict) else InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")


def _iter_parquet(path: Path) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise InputError(f"{path}: not a readable parquet file ({exc})") from None
    row = 0
    for batch in pf.iter_batches(batch_size=2048):
        for obj in batch.to_pylist():
            yield f"{path} row {row}", obj
            row += 1


def _iter_hf(name: str, split: str | None, config: str | None, streaming: bool = False) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    import datasets

    if not Path(name).exists():
        check_hub(name)  # fail in seconds with a hint, not after the libraries' retries
    try:
        local = Path(name)
        if local.is_dir() and ((local / "dataset_info.json").exists() or (local / "dataset_dict.json").exists()):
            ds = datasets.load_from_disk(name)
        else:
            # Streaming when only the first rows are wanted: OpenR1-Math is gigabytes.
            ds = datasets.load_dataset(name, config, split=split or "train", streaming=streaming)
    except FileNotFoundError as exc:
        raise InputError(f"{name}: no such file, directory or Hugging Face dataset ({exc})") from None
    except Exception as exc:  # network errors, missing configs, gated datasets...
        hint = ("A local directory must be written by save_to_disk or hold .jsonl/.json/.parquet files"
                if Path(name).is_dir() else OFFLINE_HINT[0].upper() + OFFLINE_HINT[1:])
        raise InputError(
            f"{name}: could not load it with datasets.load_dataset (split={split!r}, config={config!r}): {exc}. {hint}."
        ) from None
    if isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if split is None:
            raise InputError(f"{name}: has splits {list(ds)}; choose one with --split")
        ds = ds[split]
    for i, obj in enumerate(ds):
        yield f"{name}[{split or 'train'}] row {i}", obj


_FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".gz", ".csv", ".tsv", ".txt")


def iter_records(
    source: str | Path, *, split: str | None = None, config: str | None = None, streaming: bool = False
) -> Iterator[tuple[str, dict[str, Any] | Exception]]:
    """Yield ``(where, record_or_error)`` from a file or a Hugging Face dataset name.

    ``where`` names the file and line (or row) for error messages. Format by extension:
    ``.jsonl``/``.ndjson``, ``.json`` (array), ``.parquet``; a directory written by
    ``save_to_disk``; anything else that is not a file is a Hugging Face dataset name.
    """
    path = Path(source)
    if path.is_file():
        suffix = "".join(path.suffixes[-2:]).lower() if path.suffix.lower() == ".gz" else path.suffix.lower()
        if suffix in (".jsonl", ".ndjson"):
            return _iter_jsonl(path)
        if suffix == ".json":
            with path.open("rb") as fh:  # sniff the first megabyte only: .json files can be gigabytes
                head = fh.read(1_000_000)
            start = head.removeprefix(b"\xef\xbb\xbf").lstrip()
            return _iter_jsonl(path) if start.startswith(b"{") and b"\n{" in head else _iter_json_array(path)
        if suffix == ".parquet":
            return _iter_parquet(path)
        raise InputError(f"{path}: unknown trace file type {path.suffix!r}; use .jsonl, .json or .parquet")
    if path.exists() and path.is_dir() and not any(path.iterdir()):
        raise InputError(f"{path}: empty directory")
    # a missing local file would otherwise be tried as a hub dataset name (a network wait, then a hub error)
    looks_local = str(source).startswith((".", "/", "~")) or path.suffix.lower() in _FILE_SUFFIXES
    if looks_local and not path.exists():
        raise InputError(f"{source}: no such file (relative to {Path.cwd()}); check the path")
    return _iter_hf(str(source), split, config, streaming)


# --------------------------------------------------------------------------- mapping
def _mapped_columns(mapping: ColumnMap) -> set[str]:
    return {c for f in _CANDIDATES if (c := getattr(mapping, f)) is not None}


#: Record keys any built-in structured adapter looks at (:func:`ror_annotate.formats.detect_structured`):
#: a dict record with none of them is no response, Ollama message, assistant message or transcript.
_STRUCTURED_KEYS = frozenset(("choices", "response", "message", "role", "messages", "conversations", "conversation"))
_BUILTIN_DETECTS = {name: FORMATS[name].detect for name in ("openai-response", "ollama-chat", "assistant-message", "chat")}  # type: ignore[union-attr]


class _Plan:
    """What is the same for every record of one load: the mapping's taken and used columns, and the
    shortcuts that skip format detection where it provably finds nothing (issue 26).

    Built once per :func:`load_traces` call from the registered formats at that time; every
    shortcut is guarded by a check that implies the slow path's result, so a record that does not
    fit (a ``<`` in its text, a ``messages`` key, a plug-in format) takes the per-record detection
    exactly as before.

    ``plain_leads``: the first characters of every marker a text adapter detects (and of the
    end-of-sequence tokens); a string with none of them reads as ``plain`` under auto-detection.
    None when a registered text adapter is of a kind whose detection is not stated by its markers.
    ``skip_structured``: only the built-in structured adapters are registered, so a dict record
    without any of :data:`_STRUCTURED_KEYS` is not structured.
    """

    __slots__ = ("taken", "used", "plain_leads", "skip_structured", "_fields")

    def __init__(self, mapping: ColumnMap) -> None:
        self.taken = _mapped_columns(mapping)
        self.used = self.taken | {c for f in _CANDIDATES for c in _CANDIDATES[f]}
        # per field, what :func:`_pick` does: (mapped column or None, has a constant, the constant, candidate columns)
        self._fields: dict[str, tuple[str | None, bool, Any, tuple[str, ...]]] = {
            f: (getattr(mapping, f), f in mapping.constants, mapping.constants.get(f), tuple(c for c in cands if c not in self.taken))
            for f, cands in _CANDIDATES.items()
        }
        leads: set[str] | None = {t[0] for t in EOS_TOKENS}
        structured: dict[str, Any] = {}
        for name, adapter in FORMATS.items():
            if isinstance(adapter, StructuredFormat):
                structured[name] = adapter.detect
            elif isinstance(adapter, (TagFormat, HarmonyFormat)) and leads is not None and all(adapter.markers):
                leads.update(m[0] for m in adapter.markers)
            elif not isinstance(adapter, PlainFormat):
                leads = None  # a plug-in text adapter: its detection is its own
        self.plain_leads: tuple[str, ...] | None = tuple(sorted(leads)) if leads is not None else None
        self.skip_structured = structured == _BUILTIN_DETECTS

    def pick(self, record: dict[str, Any], field_name: str) -> Any:
        """``_pick(record, field_name, mapping)`` with the mapping's lookups done once per load."""
        column, has_constant, constant, candidates = self._fields[field_name]
        if column is not None:
            return record.get(column)
        if has_constant:
            return constant
        for cand in candidates:
            value = record.get(cand)
            if value is not None:
                return value
        return None

    def plain(self, value: Any, mapping: ColumnMap, format: str) -> bool:
        """Whether auto-detection provably reads ``value`` as plain text (see the class docstring)."""
        return (
            self.plain_leads is not None and format == AUTO and mapping.think_tags is None and isinstance(value, str)
            and not any(c in value for c in self.plain_leads)
            and value.lstrip("\ufeff \t\r\n")[:1] != "{"  # '[' is a lead (Mistral's [THINK]); '{' may be a JSON response
        )


def _pick(record: dict[str, Any], field_name: str, mapping: ColumnMap, taken: set[str] | None = None) -> Any:
    column = getattr(mapping, field_name)
    if column is not None:
        return record.get(column)
    if field_name in mapping.constants:
        return mapping.constants[field_name]
    # A column explicitly mapped to another field is never reused by candidate lookup
    # (OpenR1's "answer" column is the gold answer, not the model's). ``taken``: the caller's
    # _mapped_columns(mapping), computed once per record instead of once per field.
    taken = _mapped_columns(mapping) if taken is None else taken
    for cand in _CANDIDATES[field_name]:
        if cand not in taken and record.get(cand) is not None:
            return record[cand]
    return None


def _user_trace_id(record: dict[str, Any], mapping: ColumnMap) -> str | None:
    """The record's own trace id candidates other than ``id`` (which a response object uses for itself)."""
    taken = _mapped_columns(mapping)
    for cand in _CANDIDATES["trace_id"]:
        if cand != "id" and cand not in taken and record.get(cand) is not None:
            return _as_str(record[cand])
    return None


def _as_str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)
    return json.dumps(value, ensure_ascii=False, default=str)


def _as_bool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    return None


def content_trace_id(problem: str | None, text: str) -> str:
    """Stable id from content: ``"sha256:" + first 16 hex chars of sha256(problem NUL text)``."""
    return "sha256:" + sha256_text(f"{problem or ''}\x00{text}")[:16]


def _mapped_or_given(record: dict[str, Any], field_name: str, mapping: ColumnMap, found: Any, taken: set[str] | None = None) -> Any:
    """A field from an explicitly mapped column or constant, else a candidate column, else ``found``
    (what the format adapter read from the structure: a response's model, a transcript's user turn)."""
    value = _pick(record, field_name, mapping, taken)
    return value if value is not None else found


def _or(value: Any, found: Any) -> Any:
    """``value`` unless it is None, else ``found`` (:func:`_mapped_or_given` on a picked value)."""
    return value if value is not None else found


def _clean_text(value: Any) -> str | None:
    text = _as_str(value)
    return normalize_newlines(text)[0] if text is not None else None


def _reasoning_values(record: dict[str, Any], where: str, mapping: ColumnMap, format: str, plan: _Plan | None = None) -> list[Any]:
    """The values to extract reasoning from: the whole record when it is a response object or a
    transcript, else the text column (a string, a list of generations, or a nested object)."""
    if mapping.text is None and (
        isinstance(FORMATS.get(format), StructuredFormat)
        or (not (plan is not None and plan.skip_structured and record.keys().isdisjoint(_STRUCTURED_KEYS))
            and detect_structured(record) is not None)
    ):
        return [record]
    raw = plan.pick(record, "text") if plan is not None else _pick(record, "text", mapping)
    if raw is None:
        looked = mapping.text or ", ".join(_CANDIDATES["text"])
        raise InputError(
            f"{where}: record has no reasoning text (looked for: {looked}, a chat-completion response or a messages list); "
            "name the column with --text-field"
        )
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return list(raw)
    if isinstance(raw, (str, dict, list)):
        return [raw]
    raise InputError(f"{where}: reasoning text must be a string, got {type(raw).__name__}")


def records_to_traces(
    record: dict[str, Any],
    where: str,
    mapping: ColumnMap,
    source_name: str,
    *,
    format: str = AUTO,
    allow_markers: bool = False,
    notes: Counter[str] | None = None,
    _plan: _Plan | None = None,
) -> list[Trace]:
    """Turn one input record into one or more traces (several for list-valued text columns or
    responses with several choices, ids suffixed ``/g<i>``).

    The record's format is detected (or forced with ``format``) by :mod:`ror_annotate.formats`;
    the trace's ``source_format`` names the adapter used. Text between reasoning blocks, tool
    calls and line-ending changes are kept in ``meta`` and counted in ``notes``.

    Raises
    ------
    InputError
        Naming ``where``: a missing or empty text field, a format violation (nested or unbalanced
        tags ...), or a known control token or thinking marker left in the reasoning or answer
        (unless ``allow_markers``: then stored, listed in ``meta["markers_left"]`` and counted).
    """
    notes = notes if notes is not None else Counter()
    # ``_plan`` (private): the per-load constants of :func:`load_traces`; built here for a lone call.
    plan = _plan if _plan is not None else _Plan(mapping)
    extractions = []
    corrects = plan.pick(record, "correct")
    values = _reasoning_values(record, where, mapping, format, plan)
    corrects = corrects if isinstance(corrects, list) else [corrects] * len(values)
    for i, value in enumerate(values):
        # Text with no character a marker starts with is plain under auto-detection: read it as
        # forced plain (the same extraction, newline and EOS handling) without trying every format.
        got_all = [extract_text(value, where, format="plain")] if plan.plain(value, mapping, format) else (
            extract(value, where, format=format, tags=mapping.think_tags))
        for got in got_all:
            extractions.append((got, corrects[i] if i < len(corrects) else None))
    given_id = _as_str(plan.pick(record, "trace_id")) if mapping.trace_id is not None else None
    answer_col = _clean_text(plan.pick(record, "answer"))
    used = plan.used
    # NaN/inf (pandas' missing values) are left out: they are not JSON and would break readers of meta.
    base_meta = {
        k: v for k, v in record.items()
        if k not in used and isinstance(v, (str, int, float, bool)) and not (isinstance(v, float) and not math.isfinite(v))
    }
    traces = []
    for i, (got, correct) in enumerate(extractions):
        if not got.reasoning:
            raise InputError(f"{where}: empty reasoning trace (nothing but whitespace or tags)")
        problem = _clean_text(_or(plan.pick(record, "problem"), got.problem))
        answer = answer_col or got.answer or last_boxed(got.reasoning)
        meta = {**base_meta, **got.meta}
        if got.gaps:
            meta["gaps"] = list(got.gaps)
        meta.update({k: v for k, v in got.side.items() if v})
        left = [(name, hit) for name, text in (("reasoning", got.reasoning), ("answer", answer)) if (hit := find_marker(text, mapping.think_tags or ()))]
        if left:
            name, (marker, index) = left[0]
            if not allow_markers:
                text = got.reasoning if name == "reasoning" else answer
                hint = MARKER_HINTS.get(marker.lower()) or (
                    f"an unrecognised reasoning transcript? Force the right one with --format ({', '.join(FORMATS)})"
                )
                raise InputError(
                    f"{where}: the {name} still holds {marker!r} at {line_col(text or '', index)} after reading the record as "
                    f"{got.format!r}: {hint}; or store it as is with --allow-markers"
                )
            meta["markers_left"] = sorted({m for text in (got.reasoning, answer) for m in markers_in(text, mapping.think_tags or ())})
            notes[NOTE_MARKERS] += 1
        for note in got.notes:
            notes[note] += 1
        suffix = f"/g{i}" if len(extractions) > 1 else ""
        # The structure's own id (a response id, a Batch line's custom_id) names the trace when the
        # structure is the whole record; nested in a column, the row's id column comes first.
        # A user-given id (a mapped column, or the record's own trace_id/uuid/idx) always wins over the
        # structure's: a response's ``id`` names the provider's response, not the user's trace (it is kept
        # in meta["response_id"]).
        whole = values[0] is record
        user_id = given_id or (_user_trace_id(record, mapping) if whole else None)
        base_id = user_id or (got.trace_id if whole else None) or _as_str(plan.pick(record, "trace_id")) or got.trace_id
        trace_id = (base_id + suffix) if base_id else content_trace_id(problem, got.reasoning)
        try:
            traces.append(
                Trace(
                    trace_id=trace_id, text=got.reasoning, problem=problem, answer=answer,
                    gold_answer=_clean_text(plan.pick(record, "gold_answer")),
                    correct=_as_bool(correct),
                    model=_as_str(_or(plan.pick(record, "model"), got.model)),
                    source=_as_str(plan.pick(record, "source")) or source_name,
                    dataset=_as_str(plan.pick(record, "dataset")),
                    source_format=got.format if mapping.think_tags is None else "custom",
                    meta=meta,
                )
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InputError(f"{where}: invalid trace field {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return traces


def load_traces(  # noqa: C901  (one branch per input kind (file, folder, hub, preset))
    source: str | Path,
    *,
    columns: ColumnMap | None = None,
    preset: str | None = None,
    split: str | None = None,
    skip_invalid: bool = False,
    limit: int | None = None,
    format: str = AUTO,
    allow_markers: bool = False,
    progress: Callable[[int, int | None], None] | None = None,
    on_batch: Callable[[list[Trace]], None] | None = None,
    batch_size: int = 500,
) -> LoadResult:
    """Read and validate every trace of ``source`` (file path or Hugging Face dataset name).

    Parameters
    ----------
    source : str or Path
        A ``.jsonl``/``.json``/``.parquet`` file, a ``save_to_disk`` folder, or a hub dataset name.
    columns : ColumnMap, optional
        Column mapping; overrides the preset's.
    preset : str, optional
        One of :data:`PRESETS` (``openr1-math``, ``s1k-1.1``, ``s1k``, ``openthoughts``): its column
        mapping and, when ``source`` is empty or the preset name, its hub id.
    split : str, optional
        Split of a Hugging Face dataset.
    skip_invalid : bool
        Skip bad records (counted in :attr:`LoadResult.skipped`) instead of raising.
    limit : int, optional
        Stop after this many traces.
    format : str
        ``"auto"`` (detect per record) or a name of :data:`ror_annotate.formats.FORMATS` to force.
    allow_markers : bool
        Store a trace whose reasoning or answer still holds a known control token or thinking
        marker (counted in :attr:`LoadResult.notes`) instead of refusing it.
    progress : callable, optional
        Called as ``progress(records_read, limit)`` after each record (a progress bar).
    on_batch : callable, optional
        Streaming: called with each batch of up to ``batch_size`` validated traces, which are then
        dropped from memory (``LoadResult.traces`` ends empty; ``trace_ids`` keeps every id). The
        caller makes "nothing stored unless the whole input validates" hold by validating in a
        first pass that writes nothing, as :func:`ror_annotate.pipeline.ingest` does.
    batch_size : int
        Traces per ``on_batch`` call.

    Raises
    ------
    InputError
        A bad record (file and line named), unreadable input, duplicate trace ids, a format
        violation, a leftover control token or marker, or no traces.
    ConfigError
        Unknown preset or format.
    """
    if format != AUTO and format not in FORMATS:
        raise ConfigError(f"unknown format {format!r}. Available formats: {AUTO}, {', '.join(FORMATS)}")
    config = None
    if preset is not None:
        if PRESET_REGISTRY.find(preset) is None:
            raise ConfigError(f"unknown preset {preset!r}. Available presets: {', '.join(sorted(PRESETS))}")
        p = PRESETS[preset]
        columns = columns or p.columns
        config = p.config
        if not str(source) or str(source) == preset:
            source, split = p.hub_id, split or p.default_split
    mapping = columns or ColumnMap()
    result = LoadResult(traces=[], source=str(source))
    # A file's name, not its path: local directories must not leak into exports and cards.
    source_name = Path(source).name if Path(source).is_file() else str(source)
    seen: dict[str, str] = {}
    plan = _Plan(mapping)  # per-load constants and detection shortcuts, from the formats registered now
    # A source's known licence (the embedded sample's MIT) travels with its stored traces, so an
    # export of the store knows it without being told again.
    from .sample import source_licenses

    known_licenses = source_licenses(str(source))

    def flush(force: bool) -> None:
        if on_batch is not None and result.traces and (force or len(result.traces) >= batch_size):
            on_batch(result.traces)
            result.traces = []

    for n_read, (where, rec) in enumerate(iter_records(source, split=split, config=config, streaming=limit is not None), 1):
        if progress is not None:
            progress(n_read, limit)
        try:
            if isinstance(rec, Exception):
                raise rec
            notes: Counter[str] = Counter()  # (cheap; only added to the result when the record had notes)
            try:
                traces = records_to_traces(rec, where, mapping, source_name=source_name, format=format, allow_markers=allow_markers,
                                           notes=notes, _plan=plan)
            except RecursionError:  # a deeply nested value read from parquet or the hub
                raise _too_nested(where) from None
            for t in traces:
                if t.trace_id in seen:
                    raise InputError(f"{where}: duplicate trace id {t.trace_id!r} (first seen at {seen[t.trace_id]})")
        except InputError as exc:
            if not skip_invalid:
                raise
            result.skipped.append(SkippedRecord(where=where, reason=exc.message))
            continue
        if notes:
            result.notes.update(notes)
        for t in traces[: None if limit is None else limit - len(result.trace_ids)]:
            if t.source in known_licenses and not (t.meta.get("license") or t.meta.get("licence")):
                t.meta["license"] = known_licenses[t.source]
            seen[t.trace_id] = where
            result.traces.append(t)
            result.trace_ids.append(t.trace_id)
            result.formats[t.source_format or "unknown"] += 1
        flush(force=False)
        if limit is not None and len(result.trace_ids) >= limit:
            break
    flush(force=True)
    if not result.trace_ids:
        detail = f" ({len(result.skipped)} records skipped as invalid)" if result.skipped else ""
        raise InputError(f"{source}: no traces found{detail}")
    return result
