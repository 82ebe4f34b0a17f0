"""Crosswalks: declared, versioned mappings of another project's label taxonomy onto the six behaviors.

A crosswalk names the taxonomy it reads (``source_taxonomy``), maps each of its categories onto one
of :data:`~ror_annotate.records.BEHAVIORS`, and lists the categories it deliberately leaves
unmapped (``unmapped``): a label in neither list is refused by ``ror labels import`` (E130), so a
typo or a category the crosswalk's author never saw is never guessed. Categories are matched after
``str.strip`` and ``str.casefold`` (``Plan_Generation`` matches ``plan_generation``).

Built-ins live in the :data:`CROSSWALKS` registry under ``<name>@v<version>`` (the bare name finds
the newest version); a user crosswalk is a YAML file with the same fields::

    name: my-project
    version: 1
    source_taxonomy: "my project's step types"
    reference: "where the categories are defined"
    mapping: {plan: planning, compute: execution, check: reflection}
    unmapped: [other]

The built-in mappings follow the table in the project's shared data README (``label_six`` there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ConfigError
from .records import BEHAVIORS, Behavior
from .registry import Registry


def normalize_category(value: str) -> str:
    """The form categories are compared in: stripped and case-folded."""
    return value.strip().casefold()


class Crosswalk(BaseModel):
    """One versioned mapping of a source taxonomy onto the six behaviors.

    Attributes
    ----------
    name : str
        Short name (``thought-anchors``).
    version : int
        Version (>= 1); a changed mapping is a new version, never an edit in place.
    source_taxonomy : str
        What taxonomy the mapping reads.
    reference : str
        Where that taxonomy is defined.
    mapping : dict of str to Behavior
        Source category -> behavior.
    unmapped : list of str
        Source categories that exist but have no behavior (their labels are counted, never stored).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    version: int = Field(ge=1)
    source_taxonomy: str = Field(min_length=1)
    reference: str = ""
    mapping: dict[str, Behavior]
    unmapped: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> "Crosswalk":
        keys = [normalize_category(k) for k in self.mapping]
        if len(set(keys)) != len(keys):
            raise ValueError(f"crosswalk {self.name}: two mapping keys differ only in case or spaces")
        clash = sorted(set(keys) & {normalize_category(u) for u in self.unmapped})
        if clash:
            raise ValueError(f"crosswalk {self.name}: {', '.join(clash)} is both mapped and listed as unmapped")
        return self

    @property
    def id(self) -> str:
        """``<name>@v<version>``: the name recorded with every imported label."""
        return f"{self.name}@v{self.version}"

    def lookup(self, category: str) -> Behavior | None:
        """The behavior of ``category``; None when the crosswalk lists it as unmapped.

        Raises
        ------
        KeyError
            The crosswalk declares ``category`` neither as mapped nor as unmapped.
        """
        key = normalize_category(category)
        table = self._table()
        if key in table:
            return table[key]
        raise KeyError(category)

    def _table(self) -> dict[str, Behavior | None]:
        table: dict[str, Behavior | None] = {normalize_category(u): None for u in self.unmapped}
        table.update({normalize_category(k): v for k, v in self.mapping.items()})
        return table

    def declared(self) -> list[str]:
        """Every category the crosswalk declares (mapped, then unmapped), for error messages."""
        return [*self.mapping, *self.unmapped]


#: Built-in crosswalks by ``<name>@v<version>``.
CROSSWALKS: Registry[Crosswalk] = Registry("crosswalks")


def _builtin(**fields: Any) -> Crosswalk:
    cw = Crosswalk(**fields)
    CROSSWALKS.register(cw.id, cw)
    return cw


SIX_BEHAVIORS = _builtin(
    name="six-behaviors", version=1, source_taxonomy="ror_annotate's own six behaviors (identity)",
    reference="ror_annotate/codebooks/six-behaviors@v1.yaml", mapping={b: b for b in BEHAVIORS},
)

THOUGHT_ANCHORS = _builtin(
    name="thought-anchors", version=1,
    source_taxonomy="thought-anchors sentence function tags (DAG_PROMPT)",
    reference="Bogdan et al. 2025, Thought Anchors; interp-reasoning/thought-anchors.com",
    mapping={
        "problem_setup": "restatement", "plan_generation": "planning", "fact_retrieval": "fact",
        "active_computation": "execution", "uncertainty_management": "reflection", "self_checking": "reflection",
        "result_consolidation": "conclusion", "final_answer_emission": "conclusion",
    },
    unmapped=["unknown"],
)

REASONINGFLOW = _builtin(
    name="reasoningflow", version=1, source_taxonomy="ReasoningFlow node types",
    reference="jinulee-v/reasoningflow",
    mapping={
        "planning": "planning", "reasoning": "execution", "example": "execution", "assumption": "execution",
        "restatement": "restatement", "fact": "fact", "reflection": "reflection", "conclusion": "conclusion",
    },
)

VENHOFF = _builtin(
    name="venhoff", version=1,
    source_taxonomy="Venhoff et al. reasoning behaviors (steering-thinking-llms); no planning or conclusion category",
    reference="Venhoff et al. 2025, Understanding Reasoning in Thinking Language Models via Steering Vectors; cvenhoff/steering-thinking-llms",
    mapping={
        "initializing": "restatement", "deduction": "execution", "example-testing": "execution",
        "adding-knowledge": "fact", "uncertainty-estimation": "reflection", "backtracking": "reflection",
    },
)


def _read_yaml(path: Path) -> Any:
    """The YAML document of ``path`` (UTF-8, a byte-order mark dropped), refusing a key that appears
    twice in one mapping (PyYAML keeps the last silently: ``{a: planning, a: fact}`` would map ``a`` to
    fact without a word).

    Raises
    ------
    OSError, UnicodeDecodeError, RecursionError
        Unreadable, not UTF-8, nested past the parser's depth.
    ValueError
        Not YAML (a ``yaml.YAMLError``, re-raised as ValueError) or a repeated key.
    """
    import yaml

    class _UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    repeated = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: construct_mapping refuses it below
                    continue
                if repeated:
                    raise ValueError(f"key {str(key)[:80]!r} appears twice in one mapping (line {key_node.start_mark.line + 1}); keep one")
            return super().construct_mapping(node, deep=deep)

    from .configfile import read_config_text

    text = read_config_text(path)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from None


def load_crosswalk(name_or_path: str | Path) -> Crosswalk:
    """A built-in crosswalk by ``name@vN`` or bare name (newest version), or one read from a YAML file.

    Raises
    ------
    ConfigError
        Unknown name (with the available ones), unreadable file, or a file that is not a valid
        crosswalk (the field named).
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise ConfigError(f"crosswalk file {path} does not exist; give a built-in name ({', '.join(CROSSWALKS.names())}) or a YAML file")
        try:
            data = _read_yaml(path)
        except UnicodeDecodeError as exc:
            raise ConfigError(f"crosswalk file {path}: byte {exc.object[exc.start:exc.start + 1]!r} is not valid UTF-8; save it as UTF-8") from None
        except RecursionError:
            raise ConfigError(f"crosswalk file {path} is nested too deeply to read; a crosswalk is a flat mapping") from None
        except (OSError, ValueError) as exc:  # yaml.YAMLError is a ValueError here (_read_yaml), so is a repeated key
            raise ConfigError(f"crosswalk file {path} cannot be read as YAML: {' '.join(str(exc).split())[:300]}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"crosswalk file {path} must hold a mapping with name, version, source_taxonomy, mapping, unmapped")
        try:
            return Crosswalk.model_validate(data)  # not Crosswalk(**data): a non-string top-level key is a TypeError there
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "crosswalk"
            raise ConfigError(f"crosswalk file {path}: {where}: {err['msg']} (behaviors: {', '.join(BEHAVIORS)})") from exc
    if "@" not in text:
        versions = sorted((CROSSWALKS.get(n) for n in CROSSWALKS.names() if n.split("@", 1)[0] == text), key=lambda c: c.version)
        if versions:
            return versions[-1]
    return CROSSWALKS.get(text)


__all__ = ["CROSSWALKS", "Crosswalk", "load_crosswalk", "normalize_category"]
