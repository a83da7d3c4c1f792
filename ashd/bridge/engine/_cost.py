"""Estimated cost in USD from token usage.

An ESTIMATE from public list prices per million tokens at the time of writing; the service bills
nothing by it. Cache writes cost 1.25x input, cache reads 0.1x input. Unknown models are priced
as Sonnet.
"""

from __future__ import annotations

from typing import Any

# (family substring, input $/Mtok, output $/Mtok); first match wins, so specific names go first.
_PRICES: tuple[tuple[str, float, float], ...] = (
    ("opus-4-5", 5.0, 25.0),
    ("opus", 15.0, 75.0),
    ("sonnet", 3.0, 15.0),
    ("haiku-4", 1.0, 5.0),
    ("3-5-haiku", 0.8, 4.0),
    ("haiku", 0.25, 1.25),
)
_DEFAULT = (3.0, 15.0)


def estimate_cost(model: str, usage: dict[str, Any]) -> float:
    price_in, price_out = next(((i, o) for name, i, o in _PRICES if name in model), _DEFAULT)
    tokens_in = int(usage.get("input_tokens") or 0)
    tokens_out = int(usage.get("output_tokens") or 0)
    cache_write = int(usage.get("cache_creation_input_tokens") or 0)
    cache_read = int(usage.get("cache_read_input_tokens") or 0)
    total = tokens_in * price_in + tokens_out * price_out + cache_write * price_in * 1.25 + cache_read * price_in * 0.1
    return round(total / 1_000_000, 8)
