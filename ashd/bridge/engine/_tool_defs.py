"""The tools part of a request, built, encoded and measured once per set of tools.

Every model call sends the definitions of the tools the engine offers (name, description, input
schema; the last one marked for prompt caching), and the compaction check estimates their size.
Both are the same from call to call while the set of tools is, and on a session's first message
they cost more than the rest of the request: 0.25 ms for the estimate's walk and encoding, and
the encoding again in the request (measured in process, the built-in tools). The fork server's
warm-up fills the cache for the built-in tools, so each sandbox's bridge inherits it.

A set of tools is known by each tool's name, description and input schema object. The built-in
tools' schemas are constants of their classes; a schema made anew for each query (an MCP tool's)
is simply not found again. The cache holds the schemas it was built from, so an id it keys on
cannot be reused by another object while the entry lives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ashd.bridge.engine._cache import cached_tools
from ashd.bridge.engine._compact import estimate_tokens
from ashd.bridge.engine._model_client import EncodedList, encoded_list
from ashd.bridge.engine.tools import Tool

_KEEP = 16  # sets of tools kept (a session's main thread and its subagents' subsets)


@dataclass(frozen=True)
class ToolDefs:
    request: EncodedList  # the request's `tools`, the last one marked for the prompt cache
    tokens: int  # their estimated size (the compaction check's fixed part)


_cache: OrderedDict[tuple[tuple[str, str, int], ...], tuple[ToolDefs, list[dict[str, Any]]]] = OrderedDict()


def tool_defs(tools: Iterable[Tool]) -> ToolDefs:
    items = list(tools)
    key = tuple((t.name, t.description, id(t.input_schema)) for t in items)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return hit[0]
    definitions = [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in items]
    defs = ToolDefs(encoded_list(cached_tools(definitions)),
                    estimate_tokens([[t.description, t.input_schema] for t in items]))
    _cache[key] = (defs, [t.input_schema for t in items])
    while len(_cache) > _KEEP:
        _cache.popitem(last=False)
    return defs
