"""Label Studio labeling configs and task payloads for review studies.

Three interfaces, all with the six behaviors as single choice on hotkeys 1-6, a short codebook
summary, an optional note, and Label Studio's skip button (set on the project):

* segment mode (:func:`segment_config`): the segment highlighted (``<mark>``) inside a window of its
  trace, HTML-escaped by us, then the segment itself as plain text; the choice is on the segment;
* span mode (:func:`span_config`): the whole trace as one text, the study's segments as pre-made
  regions, one behavior per region (``perRegion`` choices);
* adjudication (:func:`adjudication_config`): segment mode plus the labels already given (humans by
  pseudonym, the judge marked as such).

The generated XML is deterministic for a study, so its sha256 detects a config edited by hand in
the Label Studio UI (see :mod:`ror_annotate.review.sync`).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from xml.sax.saxutils import quoteattr

from ..records import BEHAVIORS, Segment, Trace, sha256_text

#: ``from_name`` / ``to_name`` used in every result item we write or read.
CHOICE_FROM = "behavior"
NOTE_FROM = "note"
SEGMENT_TO = "segment"
TRACE_TO = "trace"
REGION_FROM = "region"
REGION_LABEL = "segment"

_STYLE = (
    "<Style>.ror-ctx{white-space:pre-wrap;line-height:1.55;max-height:420px;overflow-y:auto;"
    "border:1px solid #ddd;padding:8px;font-size:14px} .ror-ctx mark{background:#ffe58f;padding:0 2px} "
    ".ror-problem{white-space:pre-wrap;color:#555;font-size:13px;margin-bottom:6px} "
    ".ror-labels{white-space:pre-wrap;font-size:14px}</Style>"
)


def _attr(value: str) -> str:
    # Label Studio substitutes "$name" inside attribute values with task data: keep static text literal.
    return quoteattr(value.replace("$", "\uff04"))


def _choices(to_name: str, *, per_region: bool = False) -> list[str]:
    region = ' perRegion="true"' if per_region else ""
    lines = [f'  <Choices name="{CHOICE_FROM}" toName="{to_name}" choice="single-radio" required="true" showInline="true"{region}>']
    lines += [f'    <Choice value="{b}" hotkey="{i}"/>' for i, b in enumerate(BEHAVIORS, start=1)]
    lines.append("  </Choices>")
    return lines


def _codebook_panel(codebook_summary: str) -> list[str]:
    head, *rest = codebook_summary.splitlines() or ["codebook"]
    lines = ["  <Collapse>", f"    <Panel value={_attr('Codebook ' + head)}>", "      <View>"]
    lines += [f'        <Header value={_attr(line)} size="6"/>' for line in rest if line.strip()]
    lines += ["      </View>", "    </Panel>", "  </Collapse>"]
    return lines


def _note(to_name: str) -> str:
    return (f'  <TextArea name="{NOTE_FROM}" toName="{to_name}" maxSubmissions="1" editable="true" '
            'placeholder="Optional note (why, or what was unclear)"/>')


def segment_config(codebook_summary: str) -> str:
    """Labeling config of a segment-at-a-time study (one task per segment).

    Task data keys used: ``problem_html``, ``context_html`` (HTML we escaped), ``segment`` (plain text).
    """
    return _segment_view("Which behavior is the highlighted segment? (keys 1-6; skip if unreadable)", [], codebook_summary)


def adjudication_config(codebook_summary: str) -> str:
    """Labeling config of an adjudication project: segment mode plus ``$labels_html`` (labels given)."""
    return _segment_view(
        "Adjudicate: annotators disagreed. Pick the reference behavior (keys 1-6).",
        ['  <HyperText name="labels" value="$labels_html" inline="true"/>'],
        codebook_summary,
    )


def _segment_view(header: str, before_problem: list[str], codebook_summary: str) -> str:
    # One layout for annotation and adjudication so both show the segment the same way.
    lines = ["<View>", "  " + _STYLE, f'  <Header value="{header}" size="5"/>', *before_problem,
             '  <HyperText name="problem" value="$problem_html" inline="true"/>',
             '  <HyperText name="context" value="$context_html" inline="true"/>',
             '  <Header value="Segment" size="6"/>',
             f'  <Text name="{SEGMENT_TO}" value="$segment"/>']
    lines += _choices(SEGMENT_TO)
    lines.append(_note(SEGMENT_TO))
    lines += _codebook_panel(codebook_summary)
    lines.append("</View>")
    return "\n".join(lines)


def span_config(codebook_summary: str) -> str:
    """Labeling config of a whole-trace span study: regions over ``$trace``, one behavior per region.

    Offsets of ``<Text granularity="symbol">`` regions are code points in Label Studio 1.23 (see
    shared/notes/label-studio.md); :func:`ror_annotate.review.labelstudio.anchor_span` still checks them.
    """
    lines = ["<View>", "  " + _STYLE,
             '  <Header value="Select each highlighted segment and pick its behavior (keys 1-6)." size="5"/>',
             '  <HyperText name="problem" value="$problem_html" inline="true"/>',
             f'  <Labels name="{REGION_FROM}" toName="{TRACE_TO}">',
             f'    <Label value="{REGION_LABEL}" background="#ffe58f"/>',
             "  </Labels>",
             f'  <Text name="{TRACE_TO}" value="$trace" granularity="symbol"/>']
    lines += _choices(TRACE_TO, per_region=True)
    lines.append(_note(TRACE_TO))
    lines += _codebook_panel(codebook_summary)
    lines.append("</View>")
    return "\n".join(lines)


def config_sha256(xml: str) -> str:
    """sha256 of a labeling config, ignoring leading/trailing whitespace (Label Studio strips it)."""
    return sha256_text(xml.strip())


# ------------------------------------------------------------------------------------ task payloads
def problem_html(trace: Trace, *, max_chars: int = 1500) -> str:
    """The trace's problem statement, escaped, cut to ``max_chars`` characters ("" when unknown)."""
    if not trace.problem:
        return ""
    text = trace.problem if len(trace.problem) <= max_chars else trace.problem[:max_chars] + " …"
    return f'<div class="ror-problem"><b>Problem:</b> {html.escape(text)}</div>'


def context_window(segments: Sequence[Segment], index: int, context_chars: int) -> tuple[int, int]:
    """Character window ``[start, end)`` around ``segments[index]``, snapped to whole segments.

    Whole neighbouring segments are added on each side while the context on that side stays within
    ``context_chars`` characters, so a window never cuts a segment in half.

    Parameters
    ----------
    segments : sequence of Segment, shape (n_segments,)
        All segments of one trace, ordered by ``segment_index``.
    index : int
        Position of the target segment in ``segments``.
    context_chars : int
        Budget per side, in characters (code points).
    """
    seg = segments[index]
    start, end = seg.char_start, seg.char_end
    for prev in reversed(segments[:index]):
        if seg.char_start - prev.char_start > context_chars:
            break
        start = prev.char_start
    for nxt in segments[index + 1:]:
        if nxt.char_end - seg.char_end > context_chars:
            break
        end = nxt.char_end
    return start, end


def context_html(trace: Trace, segments: Sequence[Segment], index: int, context_chars: int) -> str:
    """The segment wrapped in ``<mark>`` inside its context window; all trace text HTML-escaped.

    Text before the first and after the last segment of the window is included up to the window
    edges; an ellipsis marks a cut. Newlines are kept (``white-space: pre-wrap``).
    """
    seg = segments[index]
    start, end = context_window(segments, index, context_chars)
    if start == segments[0].char_start:
        start = 0
    if end == segments[-1].char_end:
        end = len(trace.text)
    text = trace.text
    body = (
        ("… " if start > 0 else "")
        + html.escape(text[start:seg.char_start])
        + "<mark>" + html.escape(text[seg.char_start:seg.char_end]) + "</mark>"
        + html.escape(text[seg.char_end:end])
        + (" …" if end < len(text) else "")
    )
    return f'<div class="ror-ctx">{body}</div>'


def labels_html(given: Sequence[tuple[str, str]]) -> str:
    """HTML list of the labels an adjudicator sees: ``[(who, behavior), ...]``, escaped."""
    items = "".join(f"<li><b>{html.escape(who)}</b>: {html.escape(label)}</li>" for who, label in given)
    return f'<div class="ror-labels">Labels given:<ul>{items}</ul></div>'


def choice_result(label: str, *, to_name: str = SEGMENT_TO) -> dict:
    """A Label Studio ``choices`` result item for ``label``."""
    return {"from_name": CHOICE_FROM, "to_name": to_name, "type": "choices", "value": {"choices": [label]}}


def region_results(segment: Segment, label: str | None) -> list[dict]:
    """Result items of one pre-made span region (and its per-region behavior when ``label`` is given).

    Offsets are Python code points into the trace (what Label Studio 1.23's ``Text`` uses).
    """
    rid = f"s{segment.segment_index}"
    value = {"start": segment.char_start, "end": segment.char_end, "text": segment.text}
    out = [{"id": rid, "from_name": REGION_FROM, "to_name": TRACE_TO, "type": "labels",
            "value": {**value, "labels": [REGION_LABEL]}}]
    if label is not None:
        out.append({"id": rid, "from_name": CHOICE_FROM, "to_name": TRACE_TO, "type": "choices",
                    "value": {**value, "choices": [label]}})
    return out
