"""The agent loop: call the model, run the tools it asks for, repeat until it ends its turn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ashd.bridge.engine import _messages as m
from ashd.bridge.engine._cache import cached_messages, cached_system, cached_tools
from ashd.bridge.engine._compact import (
    KEEP_SHARE,
    SUMMARY_MAX_TOKENS,
    Measure,
    estimate_tokens,
    needs_compaction,
    summary_request,
    summary_text,
    tool_use_ids,
)
from ashd.bridge.engine._compact import plan as plan_compaction
from ashd.bridge.engine._config import EngineConfig
from ashd.bridge.engine._mcp import LogFn, McpManager
from ashd.bridge.engine._message_json import MessageTexts
from ashd.bridge.engine._model import CallResult, ModelClient, ModelError, PromptTooLong, call_model, make_client
from ashd.bridge.engine._options import EFFORT_BETA, STRUCTURED_OUTPUT_TOOL, QueryOptions, apply_live_config
from ashd.bridge.engine._permissions import Permissions
from ashd.bridge.engine._skills import expand_skill
from ashd.bridge.engine._structured import SYSTEM_NOTE, StructuredOutput
from ashd.bridge.engine._tool_defs import tool_defs
from ashd.bridge.engine.tools import Tool, ToolContext, ToolResult, builtin_tools
from ashd.bridge.engine.tools._task import TaskTool
from ashd.bridge.history import close_unanswered_turn, summary_message
from ashd.model_names import context_window, subagent_model, thinking_max_tokens
from ashd.pricing import estimate_cost

log = logging.getLogger(__name__)

Emit = Callable[[dict[str, Any]], Awaitable[None]]
# Asks the server which sandbox limits were hit: [{limit, message}] (docs/protocol.md, v2).
CheckLimits = Callable[[], Awaitable[list[dict[str, Any]]]]

# After an engine's start, its first model call's connection to the model proxy is opened this
# much later (`start`): the server then answers the create, not the connection.
PRECONNECT_AFTER_START_S = 0.003


class EngineError(Exception):
    """A query failed; the message is meant for a person."""


@dataclass
class RunStats:
    usage: dict[str, int] = field(default_factory=m.empty_usage)
    api_ms: float = 0.0
    num_turns: int = 0
    tool_calls: int = 0
    cost_usd: float = 0.0


@dataclass
class Profile:
    system: str | None
    tools: dict[str, Tool]
    model: str


@dataclass
class _Query:
    emit: Emit
    include_partial: bool
    stats: RunStats
    model: str
    check_limits: CheckLimits | None = None
    options: QueryOptions = field(default_factory=QueryOptions)
    structured: StructuredOutput | None = None  # with outputFormat: the main thread's final answer


class Engine:
    def __init__(self, config: EngineConfig, log_fn: LogFn, client: ModelClient | None = None) -> None:
        self.config = config
        self.session_id = config.session_id or m.new_uuid()
        self.messages: list[dict[str, Any]] = [dict(x) for x in config.history]
        self.permissions = self._permissions()
        self.mcp = McpManager(config.workspace, config.tool_env(), log_fn)
        self._client: ModelClient | None = client  # None: made at the first model call
        self._preconnect: asyncio.TimerHandle | None = None
        self._query: _Query | None = None
        # The main conversation's last measured size (compaction); subagents measure their own.
        self._measure = Measure()
        self._texts = MessageTexts()  # the main conversation's messages as JSON, kept between calls

    def _permissions(self) -> Permissions:
        c = self.config
        return Permissions(c.permission_mode, c.allow_rules(), c.deny_rules(), c.allowed_tools, c.disallowed_tools)

    async def start(self) -> None:
        # The MCP servers start in the background: `init` answers without them, and a query waits
        # for those still starting before its first model call, which offers their tools.
        self.mcp.begin()
        if self.config.model_socket:
            # The first turn's model call finds its connection open; opened once the server has
            # had the init's answer, so that its accept is not on the server's path to the create's.
            self._preconnect = asyncio.get_running_loop().call_later(PRECONNECT_AFTER_START_S, self.client.preconnect)

    def reconfigure(self, changes: dict[str, Any]) -> None:
        """The session's live config changed (PATCH .../config): it applies from this query on."""
        if self._query is not None:
            raise EngineError("a query is already running in this session")
        if apply_live_config(self.config, changes):
            self.permissions = self._permissions()

    async def close(self) -> None:
        if self._preconnect is not None:
            self._preconnect.cancel()
        await self.mcp.stop()
        if self._client is not None:
            await self._client.close()

    @property
    def client(self) -> ModelClient:
        if self._client is None:
            self._client = make_client(self.config.model_socket)
        return self._client

    # -- tools and profiles ------------------------------------------------------------------
    def _available(self) -> dict[str, Tool]:
        tools: list[Tool] = [
            *builtin_tools(),
            TaskTool(self._run_task, self.config.subagents),
            *self.mcp.tools(),
        ]
        return {t.name: t for t in tools if self.permissions.offered(t.name)}

    def _profile(self, query_model: str | None) -> Profile:
        tools = self._available()
        system = self.config.system_prompt
        agent_model: str | None = None
        name = self.config.initial_agent
        if name and name in self.config.subagents:
            agent = self.config.subagents[name]
            system = str(agent.get("prompt") or system or "")
            tools = _subset(tools, agent.get("tools"))
            agent_model = subagent_model(agent.get("model"))
        model = query_model or self.config.model or agent_model or self.config.default_model()
        return Profile(system, tools, model)

    # -- queries -----------------------------------------------------------------------------
    def checkpoint(self) -> Callable[[], None]:
        """Taken before a query: what puts the conversation back as it was, for a query the server
        withdraws (its prompt could not be stored). Such a query made no model call (the server's
        model proxy admits none for it), so no tool ran: its prompt, and the note that closed it,
        are all it added, each a new item (`append_user`, `close_unanswered_turn` replace, never
        change one in place)."""
        saved = list(self.messages)

        def restore() -> None:
            self.messages[:] = saved

        return restore

    async def query(
        self,
        prompt: str | list[dict[str, Any]],
        *,
        emit: Emit,
        model: str | None = None,
        include_partial: bool = False,
        check_limits: CheckLimits | None = None,
        options: QueryOptions | None = None,
    ) -> dict[str, Any]:
        """Run one user turn to completion; emits SDK messages and returns the result message."""
        if self._query is not None:
            raise EngineError("a query is already running in this session")
        started = time.monotonic()
        stats = RunStats()
        options = options or QueryOptions()
        structured = StructuredOutput(options.output_schema) if options.output_schema is not None else None
        # Running from here: a second query or a reconfigure is refused, also while MCP servers start.
        query = self._query = _Query(emit, include_partial, stats, "", check_limits, options, structured)
        max_turns = options.max_turns or self.config.max_turns
        content = (expand_skill(self.config.workspace, prompt) if isinstance(prompt, str) else None) or prompt
        m.append_user(self.messages, content)
        # A turn that does not finish is closed in the conversation (history.close_unanswered_turn),
        # so the next prompt is never merged into its unanswered one and asked again.
        try:
            await self.mcp.ready()  # the tools of servers still starting are offered from the first call
            profile = self._profile(model)
            query.model = profile.model
            subtype, text = await self._loop(self.messages, profile, None, max_turns, self._measure, self._texts)
        except ModelError as exc:
            close_unanswered_turn(self.messages, f"the model call failed: {str(exc)[:300]}")
            # The message's maxBudgetUsd spent: the Agent SDK's own subtype for it.
            subtype = "error_max_budget_usd" if exc.refusal == "turn_budget" else "error_during_execution"
            await emit(self._result(stats, started, subtype, str(exc)))
            raise EngineError(str(exc)) from exc
        except asyncio.CancelledError:
            close_unanswered_turn(self.messages, "interrupted by the user", "interrupted by the user")
            raise
        except Exception as exc:
            close_unanswered_turn(self.messages, "engine failure", f"engine failure: {exc}")
            log.exception("engine failure")
            raise EngineError(f"agent engine failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._query = None
        result = self._result(stats, started, subtype, text)
        if structured is not None and structured.done:
            result["structured_output"] = structured.value
        await emit(result)
        return result

    def _result(self, stats: RunStats, started: float, subtype: str, text: str) -> dict[str, Any]:
        return {
            "type": "result",
            "subtype": subtype,
            "duration_ms": int((time.monotonic() - started) * 1000),
            "duration_api_ms": int(stats.api_ms),
            "is_error": subtype != "success",
            "num_turns": stats.num_turns,
            "result": text,
            "session_id": self.session_id,
            "total_cost_usd": round(stats.cost_usd, 8),
            "usage": dict(stats.usage),
            "tool_calls": stats.tool_calls,
            "uuid": m.new_uuid(),
        }

    async def _loop(
        self,
        messages: list[dict[str, Any]],
        profile: Profile,
        parent: str | None,
        max_turns: int,
        measure: Measure,
        texts: MessageTexts,
    ) -> tuple[str, str]:
        q = self._query
        assert q is not None
        turns = 0
        while True:
            if turns >= max_turns:
                return "error_max_turns", f"stopped after reaching the maximum of {max_turns} turns"
            compacted = await self._compact_if_full(messages, profile, parent, measure)

            async def on_event(event: dict[str, Any]) -> None:
                await q.emit(m.stream_event(event, self.session_id, parent))

            structured = q.structured if parent is None else None
            try:
                call = await call_model(
                    self.client,
                    self._turn_request(profile, messages, structured, texts),
                    betas=self._betas(),
                    on_event=on_event if q.include_partial else None,
                )
            except PromptTooLong:
                # The API counts better than our estimate: compact and ask again, once per call.
                if compacted or not await self._compact(messages, profile, parent, measure, "prompt_too_long"):
                    raise
                continue
            turns += 1
            q.stats.num_turns += 1
            msg = self._account(call)
            messages.append({"role": "assistant", "content": msg.get("content") or []})
            measure.record(messages, msg.get("usage"))
            await q.emit(m.assistant(msg, self.session_id, parent))
            uses = [b for b in msg.get("content") or [] if b.get("type") == "tool_use"]
            if msg.get("stop_reason") != "tool_use" or not uses:
                if structured is None:
                    return "success", m.text_of(msg)
                if structured.exhausted:
                    return "error_max_structured_output_retries", _NO_STRUCTURED_OUTPUT
                # The answer must come through the tool: ask for it (stored like any user message).
                note = [{"type": "text", "text": structured.remind()}]
                messages.append({"role": "user", "content": note})
                await q.emit(m.user_tool_results(note, self.session_id, parent))
                continue
            results = [structured.answer(b) if structured is not None and b.get("name") == STRUCTURED_OUTPUT_TOOL
                       else await self._run_tool(b, profile.tools) for b in uses]
            messages.append({"role": "user", "content": results})
            await q.emit(m.user_tool_results(results, self.session_id, parent))
            if structured is not None and structured.done:
                return "success", structured.result_text(m.text_of(msg))
            if structured is not None and structured.exhausted:
                return "error_max_structured_output_retries", _NO_STRUCTURED_OUTPUT

    def _account(self, call: CallResult) -> dict[str, Any]:
        """Add a model call's time, usage and cost to the query's; returns its message."""
        q = self._query
        assert q is not None
        q.stats.api_ms += call.api_ms
        msg = call.message
        m.add_usage(q.stats.usage, msg.get("usage"))
        q.stats.cost_usd += estimate_cost(str(msg.get("model") or q.model), msg.get("usage") or {})
        return msg

    def _window(self, model: str) -> int:
        return context_window(model, self.config.betas, self.config.context_window)

    async def _compact_if_full(
        self, messages: list[dict[str, Any]], profile: Profile, parent: str | None, measure: Measure
    ) -> bool:
        fixed = estimate_tokens(profile.system) + tool_defs(profile.tools.values()).tokens
        estimate = measure.estimate(messages, fixed)
        if not needs_compaction(estimate, self.config.max_tokens, self._window(profile.model)):
            return False
        return await self._compact(messages, profile, parent, measure, "auto", estimate)

    async def _compact(
        self,
        messages: list[dict[str, Any]],
        profile: Profile,
        parent: str | None,
        measure: Measure,
        trigger: str,
        pre_tokens: int | None = None,
    ) -> bool:
        """Replace the older part of `messages` by the model's summary of it (see _compact)."""
        q = self._query
        assert q is not None
        window = self._window(profile.model)
        plan = plan_compaction(messages, int(window * KEEP_SHARE))
        if plan is None:
            return False
        older, kept = messages[: plan.cut], messages[plan.cut :]
        if pre_tokens is None:
            pre_tokens = measure.estimate(messages, 0)
        # Same model, system and tools as the conversation: the summary call reads its cached prefix.
        params = self._request(profile, summary_request(older))
        params["max_tokens"] = min(self.config.max_tokens, SUMMARY_MAX_TOKENS)
        params["tool_choice"] = {"type": "none"}
        call = await call_model(self.client, params, betas=self.config.betas, on_event=None)
        summary = m.text_of(self._account(call)).strip() or "(the model wrote no summary)"
        text = summary_text(summary, len(older), plan.request)
        messages[:] = [summary_message(text), *kept]
        measure.reset()
        compaction = {
            "summary": text,
            "summarisedMessages": len(older),
            "keptMessages": len(kept),
            "keptToolUseIds": tool_use_ids(kept),
            "postTokens": estimate_tokens(messages),
        }
        log.info("compacted the conversation (%s): %d messages summarised, %d kept, ~%d -> ~%d tokens",
                 trigger, len(older), len(kept), pre_tokens, compaction["postTokens"])
        await q.emit(m.compact_boundary(self.session_id, parent, trigger, pre_tokens, compaction))
        return True

    def _betas(self) -> list[str]:
        q = self._query
        if q is not None and q.options.effort and EFFORT_BETA not in self.config.betas:
            return [*self.config.betas, EFFORT_BETA]
        return self.config.betas

    def _turn_request(self, profile: Profile, messages: list[dict[str, Any]],
                      structured: StructuredOutput | None, texts: MessageTexts) -> dict[str, Any]:
        """A call of the agent loop: the conversation's request plus the query's options (thinking,
        effort, and for the main thread the StructuredOutput tool)."""
        q = self._query
        assert q is not None
        params = self._request(profile, messages, structured, texts)
        options = q.options
        if options.thinking is not None:
            params["thinking"] = dict(options.thinking)
            if options.thinking_budget is not None:
                params["max_tokens"] = thinking_max_tokens(options.thinking_budget, self.config.max_tokens)
        if options.effort:
            params["output_config"] = {"effort": options.effort}
        if structured is not None and structured.force_next and options.thinking_budget is None \
                and (options.thinking or {}).get("type") != "adaptive":
            params["tool_choice"] = {"type": "tool", "name": STRUCTURED_OUTPUT_TOOL}
        return params

    def _request(self, profile: Profile, messages: list[dict[str, Any]],
                 structured: StructuredOutput | None = None, texts: MessageTexts | None = None) -> dict[str, Any]:
        """The Messages API request for the conversation so far, with its cache breakpoints; with
        `texts`, its messages encoded from the conversation's kept texts."""
        marked = cached_messages(messages)
        params: dict[str, Any] = {
            "model": profile.model,
            "max_tokens": self.config.max_tokens,
            "messages": texts.encoded(marked) if texts is not None else marked,
        }
        prompt = profile.system
        if structured is not None:
            prompt = f"{prompt}\n\n{SYSTEM_NOTE}" if prompt else SYSTEM_NOTE
        system = cached_system(prompt)
        if system:
            params["system"] = system
        if structured is None:
            if profile.tools:  # the same definitions on every call: built and encoded once
                params["tools"] = tool_defs(profile.tools.values()).request
            return params
        tools = [{"name": t.name, "description": t.description, "input_schema": t.input_schema}
                 for t in profile.tools.values()]
        tools.append(structured.tool())
        params["tools"] = cached_tools(tools)
        return params

    async def _run_tool(self, block: dict[str, Any], tools: dict[str, Tool]) -> dict[str, Any]:
        assert self._query is not None
        self._query.stats.tool_calls += 1
        name = str(block.get("name"))
        raw_args = block.get("input")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        refusal = self.permissions.check(name, args)
        tool = tools.get(name)
        if refusal is None and tool is None:
            refusal = f"No such tool available: {name}"
        if refusal is not None or tool is None:
            result = ToolResult(refusal or f"No such tool available: {name}", is_error=True)
        else:
            ctx = ToolContext(self.config.workspace, self.config.tool_env(), str(block.get("id")))
            try:
                result = await tool.run(args, ctx)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failing tool is reported to the model
                result = ToolResult(f"Error: {exc}", is_error=True)
            if self._query.check_limits is not None:
                result = await with_limit_notices(result, await self._query.check_limits(), ctx.process_groups)
        out: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": block.get("id"),
            "content": result.content,
        }
        if result.is_error:
            out["is_error"] = True
        return out

    async def _run_task(self, agent: str, prompt: str, tool_use_id: str) -> ToolResult:
        q = self._query
        assert q is not None
        main = self._profile(q.model)
        definition = self.config.subagents.get(agent)
        if definition is None and agent != "general-purpose":
            known = ", ".join(sorted(self.config.subagents)) or "none"
            return ToolResult(f"Unknown subagent_type '{agent}'. Available: {known}", is_error=True)
        definition = definition or {}
        tools = {k: v for k, v in self._available().items() if k != "Task"}
        profile = Profile(
            system=str(definition.get("prompt") or main.system or ""),
            tools=_subset(tools, definition.get("tools")),
            model=subagent_model(definition.get("model")) or main.model,
        )
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        subtype, text = await self._loop(messages, profile, tool_use_id, self.config.max_turns, Measure(),
                                         MessageTexts())
        return ToolResult(text or "(the subagent returned no text)", is_error=subtype != "success")


async def with_limit_notices(result: ToolResult, notices: list[dict[str, Any]], groups: list[int]) -> ToolResult:
    """The tool result the model reads, told which sandbox limit the call ran into (the server's
    words). A call that hit the process limit has its leftover processes stopped: they hold the
    processes every later command would need."""
    lines = [str(n.get("message")) for n in notices if n.get("message")]
    if not lines:
        return result
    if any(n.get("limit") == "pids" for n in notices) and groups:
        await _stop_groups(groups)
        lines.append("The processes this command left running were stopped.")
    note = "\n".join(f"[sandbox limit] {line}" for line in lines)
    content = result.content
    if isinstance(content, str):
        content = f"{content}\n\n{note}" if content else note
    else:
        content = [*content, {"type": "text", "text": note}]
    return ToolResult(content, is_error=True)


async def _stop_groups(groups: list[int], timeout: float = 5.0) -> None:
    """SIGKILL the process groups and wait until they are gone (reaped by the sandbox's pid 1), so
    their pids are free again when the model's next command starts."""
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    for pgid in groups:
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)  # succeeds while any member exists, zombies included
            except (ProcessLookupError, PermissionError):
                break
            await asyncio.sleep(0.005)


_NO_STRUCTURED_OUTPUT = (f"stopped: the model did not give a final answer matching the outputFormat schema through "
                         f"the {STRUCTURED_OUTPUT_TOOL} tool after repeated requests")


def _subset(tools: dict[str, Tool], names: Any) -> dict[str, Tool]:
    if not isinstance(names, list):
        return tools
    wanted = {str(n) for n in names}
    return {k: v for k, v in tools.items() if k in wanted}

