"""The one price table: USD per million tokens per model family, and the cost of a call's usage.

The model proxy prices every call with it (budgets, the audit list, `cost_usd` usage events); the
engine inside the sandbox uses the default table for the `total_cost_usd` estimate it shows the
client. Prices are public list prices at the time of writing; `SERVICE_MODEL_PRICES` overrides or
extends them. A model that matches no entry is priced as the most expensive entry, so that a new or
misspelt model name can never make a budget look less spent than it is.

Keys match a model name as a substring (`opus` matches `claude-opus-4-1`) or, when they contain
`*`, `?` or `[`, as a glob; the first match wins and overrides are tried before the defaults.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

TOKENS_PER_UNIT = 1_000_000


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_write: float
    cache_read: float

    @classmethod
    def of(cls, input_: float, output: float) -> Price:
        # Cache writes (5-minute TTL) cost 1.25x input, cache reads 0.1x input.
        return cls(input_, output, input_ * 1.25, input_ * 0.1)


# First match wins, so specific names go first.
DEFAULT_PRICES: tuple[tuple[str, Price], ...] = (
    ("opus-4-5", Price.of(5.0, 25.0)),
    ("opus", Price.of(15.0, 75.0)),
    ("sonnet", Price.of(3.0, 15.0)),
    ("haiku-4", Price.of(1.0, 5.0)),
    ("3-5-haiku", Price.of(0.8, 4.0)),
    ("haiku", Price.of(0.25, 1.25)),
)


def _matches(key: str, model: str) -> bool:
    return fnmatchcase(model, key) if any(c in key for c in "*?[") else key in model


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0


class PriceTable:
    def __init__(self, overrides: Sequence[tuple[str, Price]] = ()) -> None:
        self.entries: tuple[tuple[str, Price], ...] = (*overrides, *DEFAULT_PRICES)
        self.fallback = max((p for _, p in self.entries), key=lambda p: (p.output, p.input))

    def match(self, model: str) -> tuple[str, Price] | None:
        return next(((k, p) for k, p in self.entries if _matches(k, model)), None)

    def price(self, model: str) -> Price:
        found = self.match(model)
        return found[1] if found is not None else self.fallback

    def cost(self, model: str, usage: Mapping[str, Any]) -> float:
        """Cost in USD of one call's usage (Messages API field names)."""
        p = self.price(model)
        total = (_int(usage.get("input_tokens")) * p.input + _int(usage.get("output_tokens")) * p.output
                 + _int(usage.get("cache_creation_input_tokens")) * p.cache_write
                 + _int(usage.get("cache_read_input_tokens")) * p.cache_read)
        return round(total / TOKENS_PER_UNIT, 8)

    def worst_case(self, model: str, input_tokens: int, max_tokens: int) -> float:
        """The most a call can cost: every input token written to the cache, all of max_tokens used."""
        p = self.price(model)
        return (input_tokens * max(p.input, p.cache_write) + max_tokens * p.output) / TOKENS_PER_UNIT


DEFAULT_TABLE = PriceTable()


def estimate_cost(model: str, usage: Mapping[str, Any]) -> float:
    return DEFAULT_TABLE.cost(model, usage)


def parse_prices(raw: str) -> tuple[tuple[str, Price], ...]:
    """`SERVICE_MODEL_PRICES`: a JSON object, or the path of a file holding one, mapping a model name
    or pattern to `{input, output, cacheWrite?, cacheRead?}` in USD per million tokens. ValueError
    says what is wrong."""
    text = raw.strip()
    if not text.startswith("{"):
        try:
            text = Path(text).expanduser().read_text()
        except OSError as exc:
            raise ValueError(f"cannot read the price file {text!r}: {exc.strerror}") from exc
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"prices are not valid JSON: {exc}") from exc
    if not isinstance(value, dict) or not value:
        raise ValueError("prices must be a non-empty JSON object of model name -> {input, output}")
    out: list[tuple[str, Price]] = []
    for key, spec in value.items():
        if not isinstance(spec, dict):
            raise ValueError(f"price of {key!r} must be an object {{input, output, cacheWrite?, cacheRead?}}")
        nums = {}
        for name in ("input", "output", "cacheWrite", "cacheRead"):
            v = spec.get(name)
            if v is None and name in ("cacheWrite", "cacheRead"):
                continue
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"price of {key!r}: `{name}` must be a number >= 0 (USD per million tokens)")
            nums[name] = float(v)
        base = Price.of(nums["input"], nums["output"])
        out.append((str(key), Price(base.input, base.output, nums.get("cacheWrite", base.cache_write),
                                    nums.get("cacheRead", base.cache_read))))
    return tuple(out)
