"""Provenance helpers: the tool version and the versions of the libraries a run used."""

from __future__ import annotations

from functools import lru_cache
from importlib import metadata

from . import __version__

#: Libraries whose versions are recorded with every run.
TRACKED_PACKAGES = (
    "ror_annotate", "duckdb", "spacy", "pydantic", "datasets", "pyarrow", "numpy",
    "openai", "tokenizers", "transformers", "torch", "label-studio-sdk",
)


def tool_version() -> str:
    """``"ror_annotate <version>"``: the provenance string written on every exported row."""
    return f"ror_annotate {__version__}"


@lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    """Installed versions of :data:`TRACKED_PACKAGES` (absent packages are omitted)."""
    versions: dict[str, str] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions
