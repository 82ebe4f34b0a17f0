"""The frozen codebook: what each of the six behaviors means, as data.

A codebook is a YAML file ``<name>@v<version>.yaml`` loaded into :class:`Codebook`. Its
version identifier on every label is :attr:`Codebook.sha256`, the sha256 of a canonical JSON
serialization of the parsed model (sorted keys, no insignificant whitespace, UTF-8), so reformatting
the YAML or editing its comments does not change it, and any change of content does.

Codebooks are frozen: :data:`FROZEN_HASHES` pins the hash of every released version, and loading a
released name whose content hash differs raises :class:`~ror_annotate.errors.CodebookError`. A
change is a new file beside the old one (``six-behaviors@v2.yaml``), never an edit in place.

Rendering: :func:`render_markdown` is the one text both the LLM judge (in its prompt) and human
reviewers (in the review interface) see; :func:`summary` is a short form for the review sidebar.

Lookup (spaCy-style registry by versioned name): ``load_codebook("six-behaviors@v1")`` searches the
directories in ``ROR_CODEBOOK_PATH`` (``os.pathsep``-separated), then the released codebooks that
ship inside the package (``ror_annotate/codebooks/``, package data read through
:mod:`importlib.resources`, so every kind of install finds them: wheel, ``--user``, ``--target``,
editable, zip); a path to a ``.yaml`` file also works.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import CodebookError
from .records import BEHAVIORS, sha256_text

if TYPE_CHECKING:  # pragma: no cover
    from importlib.resources.abc import Traversable

#: The codebook used when none is named.
DEFAULT_CODEBOOK = "six-behaviors@v1"

#: sha256 of every released codebook (see :attr:`Codebook.sha256`). A file whose content does not
#: match is refused: the codebook was edited in place.
FROZEN_HASHES: dict[str, str] = {
    "six-behaviors@v1": "de0624a56bae30c53b6fa7203ca5d964e4f4d5445a3ba2db5381eb4462c488c7",
}

_NAME_RE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9_-]*)@v(?P<version>[0-9]+)$")
#: Package-data folder (inside ``ror_annotate``) that holds the released codebooks.
PACKAGE_CODEBOOK_DIR = "codebooks"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Example(_Model):
    """A positive example of a behavior: a segment in the style of a math reasoning trace."""

    text: str = Field(min_length=1)
    why: str = Field(min_length=1)


class NearMiss(_Model):
    """A segment that looks like the behavior but is not, with the label it does get."""

    text: str = Field(min_length=1)
    label: str
    why: str = Field(min_length=1)


class Behavior(_Model):
    """One behavior: definition by functional role, what it includes and excludes, examples."""

    name: str
    definition: str = Field(min_length=1)
    includes: tuple[str, ...] = Field(min_length=1)
    excludes: tuple[str, ...] = Field(min_length=1)
    positive_examples: tuple[Example, ...] = Field(min_length=3)
    near_misses: tuple[NearMiss, ...] = Field(min_length=2)


class DecisionRule(_Model):
    """How to decide a hard boundary between behaviors."""

    boundary: str = Field(min_length=1)
    rule: str = Field(min_length=1)


class Codebook(_Model):
    """A parsed, validated codebook.

    Invariants (checked on load): the behaviors are exactly :data:`~ror_annotate.records.BEHAVIORS`
    in that order; every near miss names another behavior; the tie-break order is a permutation of
    the behaviors.
    """

    name: str
    version: int = Field(ge=1)
    title: str
    purpose: str
    instructions: tuple[str, ...]
    behaviors: tuple[Behavior, ...]
    decision_rules: tuple[DecisionRule, ...] = Field(min_length=1)
    tie_break_order: tuple[str, ...]
    tie_break_note: str

    @field_validator("behaviors")
    @classmethod
    def _six_in_order(cls, value: tuple[Behavior, ...]) -> tuple[Behavior, ...]:
        names = tuple(b.name for b in value)
        if names != BEHAVIORS:
            raise ValueError(f"behaviors must be exactly {list(BEHAVIORS)} in that order, got {list(names)}")
        return value

    @model_validator(mode="after")
    def _check_cross_refs(self) -> "Codebook":
        for b in self.behaviors:
            for nm in b.near_misses:
                if nm.label not in BEHAVIORS or nm.label == b.name:
                    raise ValueError(
                        f"near miss {nm.text!r} of {b.name!r} has label {nm.label!r}; it must be one of the other behaviors"
                    )
        if sorted(self.tie_break_order) != sorted(BEHAVIORS):
            raise ValueError(f"tie_break_order must be a permutation of {list(BEHAVIORS)}, got {list(self.tie_break_order)}")
        return self

    @property
    def versioned_name(self) -> str:
        """``"<name>@v<version>"``, e.g. ``"six-behaviors@v1"``."""
        return f"{self.name}@v{self.version}"

    @property
    def labels(self) -> tuple[str, ...]:
        """Behavior names in ClassLabel order."""
        return tuple(b.name for b in self.behaviors)

    def canonical_json(self) -> str:
        """The canonical serialization hashed into :attr:`sha256`: sorted keys, compact, UTF-8 text."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @property
    def sha256(self) -> str:
        """Hex sha256 of :meth:`canonical_json`: the ``codebook_version`` written on every judge label."""
        return sha256_text(self.canonical_json())

    def behavior(self, name: str) -> Behavior:
        """The behavior called ``name``; raises :class:`CodebookError` if there is none."""
        for b in self.behaviors:
            if b.name == name:
                return b
        raise CodebookError(f"codebook {self.versioned_name} has no behavior {name!r}; behaviors: {', '.join(self.labels)}")


# ---------------------------------------------------------------------------------------- lookup
def packaged_codebooks() -> "Traversable":
    """The released codebooks shipped as package data (``ror_annotate/codebooks/``)."""
    return resources.files(__package__) / PACKAGE_CODEBOOK_DIR


def codebook_dirs() -> "list[Path | Traversable]":
    """Places searched for ``<name>@v<version>.yaml``, in order.

    ``ROR_CODEBOOK_PATH`` (os.pathsep-separated directories) first, then :func:`packaged_codebooks`.
    The packaged one is a :class:`pathlib.Path` for installs on disk and an
    ``importlib.resources`` traversable otherwise (a zip).
    """
    extra: list[Path | Traversable] = [Path(p) for p in os.environ.get("ROR_CODEBOOK_PATH", "").split(os.pathsep) if p]
    return [*extra, packaged_codebooks()]


def _stem(entry: "Path | Traversable") -> str:
    return Path(entry.name).stem


def available_codebooks() -> list[str]:
    """Versioned names of every codebook file found in :func:`codebook_dirs`, sorted."""
    names = set()
    for d in codebook_dirs():
        if d.is_dir():
            names |= {_stem(p) for p in d.iterdir() if p.name.endswith(".yaml") and _NAME_RE.match(_stem(p))}
    return sorted(names)


def _find(name: str) -> "Path | Traversable":
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate
    if not _NAME_RE.match(name):
        raise CodebookError(
            f"{name!r} is not a codebook name: use '<name>@v<version>' such as {DEFAULT_CODEBOOK!r}, or a path to a .yaml file. "
            f"Available: {', '.join(available_codebooks()) or 'none'}"
        )
    for d in codebook_dirs():
        path = d / f"{name}.yaml"
        if path.is_file():
            return path
    raise CodebookError(
        f"unknown codebook {name!r}; searched {', '.join(str(d) for d in codebook_dirs())}. "
        f"Available: {', '.join(available_codebooks()) or 'none'} (or set ROR_CODEBOOK_PATH)"
    )


def load_codebook_file(path: "str | Path | Traversable") -> Codebook:
    """Parse and validate one codebook YAML file, checking it against :data:`FROZEN_HASHES`.

    ``path`` is a file path or an :mod:`importlib.resources` traversable (package data).

    Raises
    ------
    CodebookError
        The file is unreadable or not valid YAML, fails validation (the message names the field),
        its file name disagrees with its ``name``/``version``, or it is a released codebook whose
        content hash differs from the pinned one (edited in place).
    """
    if isinstance(path, str):
        path = Path(path)
    try:
        from .configfile import read_config_text

        raw: Any = yaml.safe_load(read_config_text(path))
    except OSError as exc:
        raise CodebookError(f"cannot read codebook {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise CodebookError(f"codebook {path}: byte {exc.object[exc.start:exc.start + 1]!r} is not valid UTF-8; save it as UTF-8") from None
    except yaml.YAMLError as exc:
        raise CodebookError(f"codebook {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise CodebookError(f"codebook {path} must be a YAML mapping with name, version, behaviors, ...")
    try:
        book = Codebook.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise CodebookError(f"codebook {path}: {where}: {first['msg']} ({exc.error_count()} problem(s) in total)") from exc
    if _NAME_RE.match(_stem(path)) and _stem(path) != book.versioned_name:
        raise CodebookError(f"codebook {path} declares {book.versioned_name!r}; the file must be named {book.versioned_name}.yaml")
    pinned = FROZEN_HASHES.get(book.versioned_name)
    if pinned is not None and pinned != book.sha256:
        raise CodebookError(
            f"codebook {path} ({book.versioned_name}) was edited in place: its sha256 is {book.sha256}, the released one is "
            f"{pinned}. Restore the file and put changes in a new version ({book.name}@v{book.version + 1}.yaml)"
        )
    return book


@lru_cache(maxsize=32)
def _load_cached(path: str, mtime_ns: int) -> Codebook:
    return load_codebook_file(path)


@lru_cache(maxsize=32)
def _load_packaged(name: str) -> Codebook:
    # package data outside the file system (a zip) cannot change while the process runs
    return load_codebook_file(packaged_codebooks() / f"{name}.yaml")


def load_codebook(name: str = DEFAULT_CODEBOOK) -> Codebook:
    """Load a codebook by versioned name (``"six-behaviors@v1"``) or by path to a ``.yaml`` file.

    Raises
    ------
    CodebookError
        Unknown name (the message lists the available ones) or an invalid / edited file.
    """
    found = _find(name)
    if not isinstance(found, Path):
        return _load_packaged(name)
    path = found.resolve()
    return _load_cached(str(path), path.stat().st_mtime_ns)


# ---------------------------------------------------------------------------------------- render
def render_markdown(codebook: Codebook) -> str:
    """Render the full codebook as Markdown: the text the judge's prompt and the review UI show.

    Deterministic (a function of the codebook's content only), so the judge's prompt prefix is
    byte-identical across requests and provider prompt caches apply.
    """
    out = [f"# Codebook {codebook.versioned_name}: {codebook.title}", "", codebook.purpose, "", "## How to label", ""]
    out += [f"- {line}" for line in codebook.instructions]
    out += ["", "## Behaviors", ""]
    for b in codebook.behaviors:
        out += [f"### {b.name}", "", b.definition, "", "Includes:"]
        out += [f"- {x}" for x in b.includes]
        out += ["", "Excludes:"]
        out += [f"- {x}" for x in b.excludes]
        out += ["", "Examples:"]
        out += [f'- "{e.text}" -> {b.name}. {e.why}' for e in b.positive_examples]
        out += ["", "Near misses (not this behavior):"]
        out += [f'- "{e.text}" -> {e.label}. {e.why}' for e in b.near_misses]
        out.append("")
    out += ["## Decision rules for hard boundaries", ""]
    out += [f"- **{r.boundary}**: {r.rule}" for r in codebook.decision_rules]
    out += ["", "## Tie-break order", "", " > ".join(codebook.tie_break_order), "", codebook.tie_break_note, ""]
    return "\n".join(out)


def summary(codebook: Codebook) -> str:
    """A short plain-text summary (one line per behavior plus the tie-break order) for a review sidebar."""
    lines = [f"{codebook.versioned_name} ({codebook.sha256[:12]})"]
    lines += [f"{b.name}: {b.definition}" for b in codebook.behaviors]
    lines.append("Tie-break: " + " > ".join(codebook.tie_break_order))
    return "\n".join(lines)
