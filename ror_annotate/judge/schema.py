"""Structured-output schema of the judge's answer, built from pydantic models.

OpenAI's strict structured outputs (``response_format={"type": "json_schema", "strict": true}``)
accept a subset of JSON Schema: every object needs ``additionalProperties: false`` and must list
*all* its properties in ``required`` (optional values are expressed as ``anyOf [T, null]``), and
keywords such as ``default`` and ``examples`` are rejected with a 400 ("is not permitted";
``shared/pitfalls/LLM-02``). ``openai.lib._pydantic.to_strict_json_schema`` (openai 3.57) still
leaves ``default``/``examples`` in and passes dict-typed fields through, so :func:`strict_json_schema`
post-processes pydantic's schema itself and refuses free-form mappings at build time.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError

#: Keywords pydantic may emit that strict mode rejects; they are dropped everywhere.
_FORBIDDEN_KEYWORDS = ("default", "examples", "example")

BehaviorName = Literal["planning", "execution", "restatement", "fact", "reflection", "conclusion"]


class SegmentLabel(BaseModel):
    """One item of the judge's answer."""

    model_config = ConfigDict(extra="forbid")

    segment_id: int = Field(description="The number shown in «» before the segment.")
    label: BehaviorName = Field(description="One of the six behaviors of the codebook.")
    confidence: float | None = Field(None, description="Probability (0 to 1) that the label is right.")
    rationale: str | None = Field(None, description="At most 15 words: why this label.")


class LabelBatch(BaseModel):
    """The judge's whole answer: one item per requested segment id."""

    model_config = ConfigDict(extra="forbid")

    labels: list[SegmentLabel]


def strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """JSON Schema of ``model`` made acceptable to strict structured outputs.

    Every object gets ``additionalProperties: false`` and ``required`` listing all of its
    properties (in declaration order); ``default``/``examples`` keywords are removed;
    ``$defs``/``$ref`` are kept (strict mode supports them).

    Parameters
    ----------
    model : type[pydantic.BaseModel]
        The answer model.

    Returns
    -------
    dict
        The schema, for ``response_format={"type": "json_schema", "json_schema": {"name": ..., "strict": True, "schema": schema}}``.

    Raises
    ------
    ConfigError
        The model has a free-form mapping field (``dict[str, X]``): strict mode cannot express it.
        Model it as a list of ``{key, value}`` objects instead.
    """
    schema = copy.deepcopy(model.model_json_schema())
    _strictify(schema, path=model.__name__)
    return schema


def _strictify(node: Any, *, path: str) -> None:
    if isinstance(node, list):
        for i, item in enumerate(node):
            _strictify(item, path=f"{path}[{i}]")
        return
    if not isinstance(node, dict):
        return
    for key in _FORBIDDEN_KEYWORDS:
        node.pop(key, None)
    if node.get("type") == "object" or "properties" in node:
        extra = node.get("additionalProperties")
        if extra not in (None, False):
            raise ConfigError(
                f"{path}: a free-form mapping (dict field) cannot be expressed in a strict structured-output schema "
                "(additionalProperties must be false); use a list of {key, value} objects instead"
            )
        node["type"] = "object"
        node["additionalProperties"] = False
        node["required"] = list(node.get("properties", {}))
    for key, value in node.items():
        if key in ("properties", "$defs"):
            for name, sub in value.items():
                _strictify(sub, path=f"{path}.{name}")
        elif isinstance(value, (dict, list)):
            _strictify(value, path=path)


def response_format(model: type[BaseModel] = LabelBatch) -> dict[str, Any]:
    """The ``response_format`` request field for ``model`` (strict JSON schema named after it)."""
    return {"type": "json_schema", "json_schema": {"name": model.__name__, "strict": True, "schema": strict_json_schema(model)}}
