"""Token prices for usage accounting, in USD per 1M tokens.

Prices change often and differ by provider and contract: :data:`DEFAULT_PRICES` is only a
convenience default (list prices of a few OpenAI models as published in mid-2025) and every figure
it yields is an estimate. Pass ``--prices FILE`` (JSON or YAML, same shape) to use your own; a model
absent from the table costs 0 and the run's counts say ``"price": "unknown"``. Local servers
(vLLM, Ollama) cost nothing per token; give them a zero row or leave them out.

File shape::

    gpt-4.1-mini: {input: 0.40, cached_input: 0.10, output: 1.60}
    my-vllm-model: {input: 0, cached_input: 0, output: 0}

Batch API requests are billed at half the interactive price by OpenAI; :func:`cost_usd` takes a
``discount`` factor for that.

A response whose usage is unknown (none reported, or invalid counts; see
:func:`~ror_annotate.judge.client.read_usage`) is never priced as 0 tokens: its cost is stored as
``NULL`` and counted in ``usage_unknown_requests``, and the run's ``cost_usd`` is then a lower bound.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError


class Price(BaseModel):
    """USD per 1M tokens: uncached input, cached input, output."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0)
    cached_input: float = Field(ge=0)
    output: float = Field(ge=0)


#: Default price table (USD per 1M tokens; list prices, mid-2025; prices change, override with --prices).
DEFAULT_PRICES: dict[str, Price] = {
    "gpt-4.1": Price(input=2.00, cached_input=0.50, output=8.00),
    "gpt-4.1-mini": Price(input=0.40, cached_input=0.10, output=1.60),
    "gpt-4.1-nano": Price(input=0.10, cached_input=0.025, output=0.40),
    "gpt-4o": Price(input=2.50, cached_input=1.25, output=10.00),
    "gpt-4o-mini": Price(input=0.15, cached_input=0.075, output=0.60),
    "o4-mini": Price(input=1.10, cached_input=0.275, output=4.40),
}

#: Batch API discount factor applied to all three prices.
BATCH_DISCOUNT = 0.5


def load_prices(path: str | Path | None) -> dict[str, Price]:
    """The default table updated with the rows of ``path`` (JSON or YAML), if given.

    Raises
    ------
    ConfigError
        The file cannot be read, is not a mapping of model -> {input, cached_input, output}, or has a
        negative or missing price (the message names the model).
    """
    prices = dict(DEFAULT_PRICES)
    if path is None:
        return prices
    path = Path(path)
    try:
        from ..configfile import read_config_text

        text = read_config_text(path)
        raw: Any = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the price table {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"price table {path} must map model names to {{input, cached_input, output}} (USD per 1M tokens)")
    for model, row in raw.items():
        try:
            prices[str(model)] = Price.model_validate(row)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ConfigError(
                f"price table {path}, model {model!r}: {'.'.join(map(str, err['loc'])) or 'row'}: {err['msg']} "
                "(expected {input, cached_input, output} in USD per 1M tokens)"
            ) from exc
    return prices


def cost_usd(price: Price | None, *, input_tokens: int, cached_input_tokens: int, output_tokens: int, discount: float = 1.0) -> float:
    """Cost in USD of one usage record: ``((in - cached) * p_in + cached * p_cached + out * p_out) / 1e6 * discount``.

    ``input_tokens`` includes the cached ones, as in the OpenAI ``usage`` object
    (``prompt_tokens`` and ``prompt_tokens_details.cached_tokens``). Unknown price: 0.0.
    """
    if price is None:
        return 0.0
    uncached = max(input_tokens - cached_input_tokens, 0)
    return (uncached * price.input + cached_input_tokens * price.cached_input + output_tokens * price.output) / 1e6 * discount
