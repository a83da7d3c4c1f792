"""What a sandbox may ask of the model, decided at the proxy (the server's side of the boundary).

- `ModelPolicy`: the operator's settings (extra allowed models, the max_tokens ceiling, the request
  rate per session, budgets per session and per tenant, the price table).
- `SessionModels`: what one session may call, from the model precedence (computed when the session
  claims its sandbox): the default model of its turns, plus the models its subagents name and the
  agent's `allowedModels` (`.agent/settings.json` of the deployed agent folder, never the workspace
  copy, which the sandbox can rewrite).
- `Refusal`: an Anthropic-shaped error the proxy answers instead of forwarding.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from ashd.model_names import DEFAULT_MODEL, subagent_model
from ashd.pricing import PriceTable, parse_prices

log = logging.getLogger(__name__)

KeyProvider = Callable[[], "str | Awaitable[str | None] | None"]
REFUSAL_HEADER = "x-ashd-refusal"  # marks an answer of the proxy itself, not of the model API
DEFAULT_MAX_TOKENS_CEILING = 32_000


@dataclass(frozen=True)
class Refusal:
    status: int
    error_type: str  # the Anthropic error type: invalid_request_error, permission_error, ...
    reason: str  # ours, stable: also the audit `reason` and the metrics label
    message: str
    retry_after: float | None = None

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.error_type, "message": self.message}}

    def headers(self) -> dict[str, str]:
        out = {REFUSAL_HEADER: self.reason}
        if self.retry_after is not None:
            out["retry-after"] = str(max(1, int(self.retry_after + 0.999)))
        return out


def _patterns(raw: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (raw or "").split(",") if p.strip())


def parse_tenant_budgets(raw: str) -> dict[str, float]:
    """`tenant=usd,tenant=usd`; ValueError says what is wrong."""
    out: dict[str, float] = {}
    for part in raw.split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        try:
            usd = float(value)
        except ValueError:
            usd = -1.0
        if not sep or not name.strip() or not usd > 0 or usd == float("inf"):
            raise ValueError(f"{part.strip()!r} is not tenant=usd with usd > 0")
        out[name.strip()] = usd
    return out


@dataclass(frozen=True)
class ModelPolicy:
    allow: tuple[str, ...] = ()  # models (or globs) every session may call besides its own
    max_tokens: int | None = DEFAULT_MAX_TOKENS_CEILING
    rate_per_minute: float | None = 120.0
    rate_burst: int = 30
    session_budget_usd: float | None = None
    tenant_budget_usd: float | None = None
    tenant_budgets: Mapping[str, float] = field(default_factory=dict)
    prices: PriceTable = field(default_factory=PriceTable)

    @classmethod
    def from_settings(cls, settings: Any) -> ModelPolicy:
        return cls(
            allow=_patterns(settings.model_allow),
            max_tokens=settings.model_max_tokens,
            rate_per_minute=settings.model_rate_per_minute,
            rate_burst=settings.model_rate_burst,
            session_budget_usd=settings.model_session_budget_usd,
            tenant_budget_usd=settings.model_tenant_budget_usd,
            tenant_budgets=parse_tenant_budgets(settings.model_tenant_budgets or ""),
            prices=PriceTable(parse_prices(settings.model_prices) if settings.model_prices else ()),
        )

    @classmethod
    def open(cls) -> ModelPolicy:
        """No limits at all (tests of other parts that drive a bridge directly)."""
        return cls(allow=("*",), max_tokens=None, rate_per_minute=None)

    def tenant_budget(self, tenant: str) -> float | None:
        return self.tenant_budgets.get(tenant, self.tenant_budget_usd)

    @property
    def needs_tenant_spend(self) -> bool:
        return self.tenant_budget_usd is not None or bool(self.tenant_budgets)


@dataclass(frozen=True)
class SessionModels:
    default: str  # the model of a turn that names none: session > agent record > settings.json > engine
    allowed: tuple[str, ...] = ()  # more models (or globs) the session's own configuration may call

    def permits(self, model: str, turn_model: str, policy: ModelPolicy) -> bool:
        if model == turn_model:
            return True
        return any(fnmatchcase(model, p) for p in (*self.allowed, *policy.allow))


@dataclass(frozen=True)
class ModelBinding:
    """Who pays for a sandbox's model calls: set when a session claims the sandbox."""

    session_id: str
    tenant: str
    agent_name: str
    models: SessionModels
    key: KeyProvider | None = None  # None: the server's ANTHROPIC_API_KEY


def agent_model_settings(agent_path: str | None) -> tuple[str | None, tuple[str, ...]]:
    """`model` and `allowedModels` of the deployed agent folder's `.agent/settings.json`."""
    if not agent_path:
        return None, ()
    path = Path(agent_path) / ".agent" / "settings.json"
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return None, ()
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return None, ()
    if not isinstance(value, dict):
        return None, ()
    model = value.get("model") if isinstance(value.get("model"), str) and value.get("model") else None
    allowed = value.get("allowedModels")
    names = tuple(str(m) for m in allowed if isinstance(m, str) and m) if isinstance(allowed, list) else ()
    return model, names


def session_models(session_model: str | None, agent_model: str | None, agent_path: str | None,
                   config: Mapping[str, Any]) -> SessionModels:
    """The model precedence of a session's turns (the message's `model` is applied per turn)."""
    settings_model, agent_allowed = agent_model_settings(agent_path)
    subagents = config.get("subagents")
    named = [subagent_model(d.get("model")) for d in subagents.values() if isinstance(d, dict)] \
        if isinstance(subagents, dict) else []
    default = session_model or agent_model or settings_model or DEFAULT_MODEL
    allowed = tuple(dict.fromkeys([*(m for m in named if m), *agent_allowed]))
    return SessionModels(default, allowed)


class TokenBucket:
    """`rate` tokens per minute, at most `burst` saved up."""

    def __init__(self, rate_per_minute: float, burst: int) -> None:
        self.rate = rate_per_minute / 60.0
        self.burst = float(max(1, burst))
        self.tokens = self.burst
        self.at = time.monotonic()

    def take(self) -> float | None:
        """None when a token was taken, else the seconds until one is available."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return (1.0 - self.tokens) / self.rate


def usd(value: float) -> str:
    return f"${value:,.4f}".rstrip("0").rstrip(".") if value < 1 else f"${value:,.2f}"
