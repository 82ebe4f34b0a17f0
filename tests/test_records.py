"""Records: validation of spans, stable label ids, and JSON Schemas kept in sync with the models."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from ror_annotate.records import BEHAVIORS, RECORDS, Label, Segment, write_json_schemas

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def test_schemas_in_sync_with_models(tmp_path: Path) -> None:
    write_json_schemas(tmp_path)
    for name in RECORDS:
        committed = SCHEMAS / f"{name}.schema.json"
        assert committed.exists(), f"{committed} missing: run python -m ror_annotate.records schemas"
        assert json.loads(committed.read_text()) == json.loads((tmp_path / committed.name).read_text()), (
            f"{committed} is stale: run python -m ror_annotate.records schemas"
        )


def test_schema_validates_a_record_and_rejects_unknown_label() -> None:
    schema = json.loads((SCHEMAS / "label.schema.json").read_text())
    good = Label(trace_id="t", segment_index=0, label="fact", source="judge", annotator="a", codebook_version="c")
    jsonschema.validate(json.loads(good.model_dump_json()), schema)
    bad = dict(json.loads(good.model_dump_json()), label="musing")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_segment_span_must_match_text() -> None:
    Segment(trace_id="t", segment_index=0, char_start=2, char_end=4, text="🙂答", n_tokens=2)
    with pytest.raises(ValidationError, match="span length"):
        Segment(trace_id="t", segment_index=0, char_start=0, char_end=3, text="ab", n_tokens=1)
    with pytest.raises(ValidationError):
        Segment(trace_id="t", segment_index=0, char_start=3, char_end=3, text="", n_tokens=0)


def test_label_id_is_deterministic_and_distinguishes_annotators() -> None:
    kw = dict(trace_id="t", segment_index=1, label="fact", source="human", codebook_version="c", study="s")
    a1 = Label(annotator="h-1", **kw)
    assert a1.label_id == Label(annotator="h-1", **{**kw, "label": "planning"}).label_id
    assert a1.label_id != Label(annotator="h-2", **kw).label_id
    assert BEHAVIORS == ("planning", "execution", "restatement", "fact", "reflection", "conclusion")
