"""Conformance checks a plug-in runs on itself (in the spirit of scikit-learn's ``check_estimator``).

Every built-in entry of every registry passes these checks (``tests/test_registry.py``), and a
third-party judge, trace format or MoE family can call the same function in its own tests::

    from ror_annotate.testing import check_judge
    check_judge(my_judge_factory)

Each check raises :class:`AssertionError` naming what the plug-in did wrong.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .records import BEHAVIORS

#: Two short traces every judge must label (one non-ASCII, one with CRLF-origin text).
_CHECK_TRACES = (
    {"trace_id": "check-1", "text": "Let me compute 6*7 first. 6*7 = 42. Wait, is that right? Yes. So the answer is 42."},
    {"trace_id": "check-2", "text": "Recall that π ≈ 3.14159. The area is π r². With r = 2 the area is 4π. Hmm, let me check. 答案是 4π."},
)


def check_judge(factory: Callable[..., Any], model: str | None = None, **options: Any) -> None:
    """Check a judge factory: labels every segment once, only valid behaviors, idempotent re-run.

    Parameters
    ----------
    factory : callable
        ``factory(model, **options) -> Judge`` as registered in ``ror_annotate.judge.JUDGES``.
    model, **options
        Passed to the factory (an LLM judge needs a reachable endpoint: point ``base_url`` at a
        local test server).

    Raises
    ------
    AssertionError
        A segment left unlabelled or labelled twice by one annotator, a label outside the six
        behaviors, a missing annotator or codebook version, or a re-run that changed the labels.
    """
    from .pipeline import ingest, label, segment
    from .store import Store

    judge = factory(model, **options)
    assert getattr(judge, "annotator", None), f"{factory!r}: the judge has no annotator id"
    assert getattr(judge, "codebook_version", None), f"{judge.annotator}: the judge has no codebook_version"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "traces.jsonl"
        src.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in _CHECK_TRACES), encoding="utf-8")
        with Store(Path(tmp) / "check.duckdb") as store:
            ingest(store, src)
            segment(store, workers=1)
            label(store, judge=judge)
            first = {(lab.trace_id, lab.segment_index, lab.annotator): lab for lab in store.labels()}
            segments = store.segments()
            own = [k for k in first if k[2].split("@")[0] == judge.annotator]
            assert own, f"{judge.annotator}: wrote no labels"
            for key in own:
                lab = first[key]
                assert lab.label in BEHAVIORS, f"{judge.annotator}: label {lab.label!r} is not one of the six behaviors"
                assert lab.codebook_version, f"{judge.annotator}: a label without a codebook version"
            labelled = {(t, i) for t, i, a in own if a == judge.annotator}
            assert labelled == {(s.trace_id, s.segment_index) for s in segments}, (
                f"{judge.annotator}: labelled {len(labelled)} of {len(segments)} segments"
            )
            label(store, judge=factory(model, **options))
            second = {(lab.trace_id, lab.segment_index, lab.annotator): lab.label for lab in store.labels()}
            assert second == {k: v.label for k, v in first.items()}, f"{judge.annotator}: a re-run changed the stored labels"


def check_format(adapter: Any) -> None:
    """Check a trace format adapter: its own example is read into non-empty reasoning with no markers left.

    Raises
    ------
    AssertionError
        The example does not parse, gives empty reasoning, or leaves one of the format's markers in
        the reasoning or the answer.
    """
    from .formats import StructuredFormat, extract

    example = adapter.example
    value: Any = json.loads(example) if isinstance(adapter, StructuredFormat) else example
    found = extract(value, f"<{adapter.name} example>", format=adapter.name)
    assert found, f"format {adapter.name!r}: its example gave no output"
    for ex in found:
        assert ex.reasoning.strip(), f"format {adapter.name!r}: its example gave empty reasoning"
        markers = getattr(adapter, "markers", ()) or ()
        for m in markers:
            assert m not in ex.reasoning and m not in (ex.answer or ""), f"format {adapter.name!r}: marker {m!r} left in the output"


def check_family(spec: Any) -> None:
    """Check an MoE family entry is well formed (names, router classes, renormalisation rule).

    Raises
    ------
    AssertionError
        An empty name, no router class, or a router class claimed by another family.
    """
    from .steer.families import family_for_router_class

    assert spec.name, "a family needs a name"
    assert spec.router_classes, f"family {spec.name!r}: no router class"
    for cls in spec.router_classes:
        owner = family_for_router_class(cls)
        assert owner is None or owner.name == spec.name, f"family {spec.name!r}: router class {cls} belongs to {owner.name!r}"


__all__ = ["check_family", "check_format", "check_judge"]
