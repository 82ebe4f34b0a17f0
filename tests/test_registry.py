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


#: What each built-in registry holds at least (a plug-in adds to these, never removes).
BUILTINS = {
    "judges": {"baseline", "openai"},
    "formats": {"plain", "think", "harmony", "openai-response", "chat", "mistral", "seed", "kimi", "thought"},
    "presets": {"openr1-math", "s1k-1.1", "s1k", "openthoughts"},
    "engines": {"hf", "vllm"},
    "families": {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss", "qwen3_5_moe", "qwen3_next", "gemma4"},
    "strategies": {"random", "stratified", "disagreement", "trace", "uncertainty"},
    "aggregators": {"majority-vote", "dawid-skene", "one-coin-dawid-skene", "glad", "mace"},
    "crosswalks": {"six-behaviors@v1", "thought-anchors@v1", "reasoningflow@v1", "venhoff@v1"},
}


def test_every_kind_of_plug_in_has_one_registry() -> None:
    from ror_annotate.registry import REGISTRY_MODULES, _import_builtin_registries

    _import_builtin_registries()
    assert set(BUILTINS) <= set(REGISTRIES), f"registries missing: {set(BUILTINS) - set(REGISTRIES)} ({REGISTRY_MODULES})"


@pytest.mark.parametrize("kind", sorted(BUILTINS))
def test_registry_contents(kind: str) -> None:
    assert BUILTINS[kind] <= set(registry(kind).names())


def test_every_builtin_judge_passes_the_judge_checks() -> None:
    from ror_annotate.testing import check_judge

    check_judge(registry("judges").get("baseline"))


def test_every_registered_format_passes_the_format_checks() -> None:
    from ror_annotate.testing import check_format

    for name, adapter in registry("formats").items():
        check_format(adapter), name


def test_every_registered_family_passes_the_family_checks() -> None:
    from ror_annotate.testing import check_family

    for _name, spec in registry("families").items():
        check_family(spec)


def test_a_broken_judge_fails_the_judge_checks() -> None:
    from ror_annotate.judge.baseline import BaselineJudge  # noqa: F401  (the real one, to subclass)
    from ror_annotate.testing import check_judge

    class Lazy(BaselineJudge):
        def label(self, store, trace_ids, *, run, progress=None):  # type: ignore[no-untyped-def]
            report = super().label(store, trace_ids[:1], run=run, progress=progress)
            return report

    with pytest.raises(AssertionError, match="labelled .* of .* segments"):
        check_judge(lambda model, **kw: Lazy())
