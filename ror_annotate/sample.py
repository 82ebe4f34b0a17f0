"""The embedded sample: 40 real, MIT-licensed reasoning traces shipped inside the package.

They let ``ror run`` (no input) run the whole main job on a fresh install without network or
other files. Source, licence and fields: ``ror_annotate/data/README.md`` (the traces come from
interp-reasoning/thought-anchors.com, MIT, "Copyright (c) 2025 interp-reasoning"; the licence
text ``LICENSE-thought-anchors`` sits beside them).
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import ConfigError, InputError

SAMPLE_FILE = "sample_traces.jsonl"
SAMPLE_LICENSE_FILE = "LICENSE-thought-anchors"
SAMPLE_LICENSE = "mit"  # the card's license identifier for a dataset exported from the sample alone
_extracted: Path | None = None


def sample_path() -> Path:
    """Path of the embedded sample, a JSONL file of 40 traces (one JSON object per line).

    The file is read through :mod:`importlib.resources`, so it is found in a checkout, an
    editable install and a wheel. A package imported from a zip archive gets a copy in a
    temporary folder, removed when the process exits.

    Raises
    ------
    InputError
        The package was installed without its data files (a broken or hand-made install).
    """
    global _extracted
    resource = resources.files("ror_annotate") / "data" / SAMPLE_FILE
    if not resource.is_file():
        raise InputError(
            f"the embedded sample ror_annotate/data/{SAMPLE_FILE} is missing from this installation; "
            "reinstall ror_annotate (pip install -e . in a checkout) or pass a traces file"
        )
    if isinstance(resource, Path):
        return resource
    if _extracted is None:  # zipped package: the file has no path of its own
        folder = Path(tempfile.mkdtemp(prefix="ror_sample_"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _extracted = folder / SAMPLE_FILE
        _extracted.write_bytes(resource.read_bytes())
    return _extracted


def sample_records() -> list[dict[str, Any]]:
    """The 40 embedded traces as parsed JSON objects, in file order (fields: ``data/README.md``)."""
    with sample_path().open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def card_license(source: str) -> str:
    """License identifier for the card of a dataset exported from ``source`` alone.

    ``"mit"`` for the embedded sample (its traces' licence), ``"other"`` for anything else: the
    licence of user-supplied traces is theirs to state (``ror export --license``).
    """
    try:
        return SAMPLE_LICENSE if source and Path(source).resolve() == sample_path().resolve() else "other"
    except InputError:
        return "other"


#: The ``source`` the sample's traces are stored under (their ``source_repo``).
SAMPLE_SOURCE = "interp-reasoning/thought-anchors.com"


def source_licenses(source: str) -> dict[str, str]:
    """Known licences of the traces read from ``source``: ``{SAMPLE_SOURCE: "mit"}`` for the embedded
    sample (so its card and manifest say the text may be published), else nothing."""
    return {SAMPLE_SOURCE: SAMPLE_LICENSE} if card_license(source) == SAMPLE_LICENSE else {}


def resolve_source(source: str, preset: str | None, *, sample: bool, default_to_sample: bool) -> str:
    """The input a command reads: ``source``, or the embedded sample's path.

    Parameters
    ----------
    source : str
        The INPUT argument as given ("" when omitted).
    preset : str or None
        ``--preset``; a preset names its own hub dataset, so it counts as an input.
    sample : bool
        ``--sample`` was given.
    default_to_sample : bool
        Read the sample when no input is given at all (``ror run``); when false (``ror ingest``)
        no input is an error.

    Raises
    ------
    ConfigError
        ``--sample`` together with an INPUT or ``--preset``.
    InputError
        No input and ``default_to_sample`` is false.
    """
    if sample:
        if source or preset:
            raise ConfigError(f"--sample reads the embedded sample: give either --sample or {'--preset' if preset else 'an input'}, not both")
        return str(sample_path())
    if source or preset:
        return source
    if default_to_sample:
        return str(sample_path())
    raise InputError("no input: give a traces file or dataset name (ror ingest FILE), --preset NAME, or --sample for the embedded sample")
