"""Fast, clear failure of Hugging Face hub look-ups on a machine that cannot reach the hub.

Without this, ``datasets``/``huggingface_hub`` retry each request five times with back-off: an
offline ``ror run --preset ...`` printed 24 s of retry noise before failing, and ``transformers``
retried a tokenizer name for 24-48 s. One short probe per endpoint and process (a HEAD request to
the hub endpoint, through the same proxy settings ``httpx`` reads from the environment, waiting at
most :data:`HUB_PROBE_SECONDS`) decides instead, for datasets (``ror ingest ORG/NAME``) and
tokenizers (:func:`ror_annotate.tokenizer.load_tokenizer`) alike; an unreachable hub is one error,
:class:`~ror_annotate.errors.HubUnreachableError` (``E210``). ``HF_HUB_OFFLINE=1`` skips the probe:
the libraries then go straight to the local cache, and a miss fails within a second.
"""

from __future__ import annotations

import os

from .errors import HubUnreachableError

#: Seconds the hub probe waits for an HTTP answer before calling the hub unreachable.
HUB_PROBE_SECONDS = 5.0
OFFLINE_HINT = (
    "without the hub, run `ror run` with no input (the embedded sample) or pass a local .jsonl/.json/.parquet file; "
    "datasets already in the local Hugging Face cache load with HF_HUB_OFFLINE=1"
)
_probed: dict[str, str | None] = {}  # endpoint -> None (reachable) or why not


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set to a true value (1, true, yes, on; huggingface_hub's reading)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "TRUE", "YES", "ON"}


def hub_endpoint() -> str:
    """The hub URL the Hugging Face libraries use: ``HF_ENDPOINT`` (read now), else their default."""
    endpoint = os.environ.get("HF_ENDPOINT", "").strip()
    if endpoint:
        return endpoint.rstrip("/")
    from huggingface_hub import constants

    return constants.ENDPOINT


def unreachable_reason(endpoint: str, timeout: float = HUB_PROBE_SECONDS) -> str | None:
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


def check_hub(what: str, hint: str = OFFLINE_HINT) -> None:
    """Raise at once when the hub cannot be reached, instead of letting the libraries retry.

    Parameters
    ----------
    what : str
        What is looked up (a dataset, ``cannot load tokenizer 'ORG/NAME'``), the message's start.
    hint : str, default :data:`OFFLINE_HINT`
        What to do without the hub, the message's end.

    Raises
    ------
    HubUnreachableError
        ``E210``: the hub endpoint did not answer within :data:`HUB_PROBE_SECONDS` (``HF_HUB_OFFLINE``
        unset); the message names the endpoint and the reason, and says what to do offline.
    """
    if hub_offline():
        return
    endpoint = hub_endpoint()
    reason = unreachable_reason(endpoint)
    if reason is not None:
        raise HubUnreachableError(f"{what}: the Hugging Face hub ({endpoint}) cannot be reached ({reason}); {hint}")
