"""Fast, clear failure of Hugging Face hub look-ups on a machine that cannot reach the hub.

Without this, ``datasets``/``huggingface_hub`` retry each request five times with back-off: an
offline ``ror run --preset ...`` printed 24 s of retry noise before failing. One short probe per
process (a HEAD request to the hub endpoint, through the same proxy settings ``httpx`` reads from
the environment) decides instead. ``HF_HUB_OFFLINE=1`` skips the probe: the libraries then go
straight to the local cache, and a miss fails within a second.
"""

from __future__ import annotations

import os

from .errors import InputError

PROBE_TIMEOUT_S = 5.0
OFFLINE_HINT = (
    "without the hub, run `ror run` with no input (the embedded sample) or pass a local .jsonl/.json/.parquet file; "
    "datasets already in the local Hugging Face cache load with HF_HUB_OFFLINE=1"
)
_probed: dict[str, str | None] = {}  # endpoint -> None (reachable) or why not


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set to a true value (1, true, yes, on; huggingface_hub's reading)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "TRUE", "YES", "ON"}


def hub_endpoint() -> str:
    """The hub URL the Hugging Face libraries use (``HF_ENDPOINT`` or their default)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def unreachable_reason(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """``None`` when ``endpoint`` answers an HTTP request within ``timeout`` seconds, else why not.

    Any HTTP answer counts as reachable (even 4xx/5xx: the libraries then report the real error).
    The result is cached per endpoint for the life of the process.
    """
    if endpoint not in _probed:
        import httpx

        try:
            httpx.head(endpoint, timeout=timeout)
            _probed[endpoint] = None
        except httpx.TransportError as exc:  # DNS failure, refused connection, timeout, proxy error
            _probed[endpoint] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return _probed[endpoint]


def check_hub(what: str) -> None:
    """Raise at once when the hub cannot be reached, instead of letting the libraries retry.

    Parameters
    ----------
    what : str
        The dataset or model looked up, named in the message.

    Raises
    ------
    InputError
        The hub endpoint did not answer (``HF_HUB_OFFLINE`` unset); the message says what to do offline.
    """
    if hub_offline():
        return
    endpoint = hub_endpoint()
    reason = unreachable_reason(endpoint)
    if reason is not None:
        raise InputError(f"{what}: the Hugging Face hub ({endpoint}) cannot be reached ({reason}); {OFFLINE_HINT}")
