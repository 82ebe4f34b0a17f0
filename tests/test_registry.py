"""The one registry mechanism (ror_annotate.registry): lookup, duplicate policy, entry points, contents."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from ror_annotate.errors import ConfigError
from ror_annotate.registry import REGISTRIES, Registry, registry


def _fresh(kind: str, **kw: object) -> Registry:
    REGISTRIES.pop(kind, None)
    return Registry(kind, **kw)  # type: ignore[arg-type]


def test_register_get_and_did_you_mean() -> None:
    reg = _fresh("test-colours")

    @reg.register("red")
    def red() -> str:
        return "#f00"

    assert reg.get("red") is red
    assert "red" in reg and "blue" not in reg
    with pytest.raises(ConfigError, match=r"unknown test-colour 'rde'\. Did you mean 'red'\? Available: red"):
        reg.get("rde")
    REGISTRIES.pop("test-colours")


def test_duplicate_name_is_refused_unless_replaced() -> None:
    reg = _fresh("test-dups")
    reg.register("a", 1)
    reg.register("a", 1)  # the same object again (a re-import) is harmless
    with pytest.raises(ConfigError, match="'a' is already registered; pass replace=True"):
        reg.register("a", 2)
    reg.register("a", 2, replace=True)
    assert reg.get("a") == 2
    with pytest.raises(ConfigError, match="non-empty name"):
        reg.register("", 3)
    with pytest.raises(ConfigError, match="already exists"):
        Registry("test-dups")
    REGISTRIES.pop("test-dups")


def test_entry_points_are_loaded_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = _fresh("test-plugins")
    ep = EntryPoint(name="plugged", value="json:dumps", group="ror_annotate.test-plugins")
    seen: list[str] = []

    def fake_entry_points(group: str) -> list[EntryPoint]:
        seen.append(group)
        return [ep] if group == "ror_annotate.test-plugins" else []

    monkeypatch.setattr("ror_annotate.registry.entry_points", fake_entry_points)
    import json

    assert reg.get("plugged") is json.dumps
    assert seen == ["ror_annotate.test-plugins"]
    assert reg.names() == ["plugged"]
    REGISTRIES.pop("test-plugins")


def test_builtin_judges_are_in_the_judges_registry() -> None:
    judges = registry("judges")
    assert {"baseline", "openai"} <= set(judges.names())
    factory = judges.get("baseline")
    judge = factory(None)
    assert judge.annotator.startswith("baseline:")
    with pytest.raises(ConfigError, match="no registry of 'nope'"):
        registry("nope")
