"""The `claude-agent-sdk` engine: the Claude Agent SDK's bundled Claude Code CLI, driven the way the
SDK drives it (stream-json in and out, control requests), its messages passed on unchanged.

One CLI process per engine, started at init and kept between queries (a warm conversation). The
session's options become the CLI's flags, as the Agent SDK maps its own options. The CLI reaches
the model through a loopback listener that forwards to the model proxy socket (`_forward`), with
a placeholder key. A cold resume writes the stored history as the CLI's transcript and resumes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ashd.bridge.engine import _messages as m
from ashd.bridge.engine._background import wait_started
from ashd.bridge.engine._config import EngineConfig
from ashd.bridge.engine._forward import LoopbackForwarder
from ashd.bridge.engine._loop import EngineError
from ashd.bridge.engine._mcp import read_mcp_config
from ashd.bridge.engine._model import MAX_RETRIES
from ashd.bridge.engine._options import QueryOptions, apply_live_config
from ashd.bridge.engine._skills import expand_skill
from ashd.engines import SDK, bundled_cli
from ashd.model_names import subagent_model

log = logging.getLogger(__name__)

ENGINE_NAME = SDK
PLACEHOLDER_KEY = "sk-ant-sandbox-placeholder"  # the model proxy puts the session's key in its place
CONTROL_TIMEOUT_S = 60.0
INTERRUPT_DRAIN_S = 30.0
MCP_START_TIMEOUT_S = 60.0
MCP_POLL_S = 0.1
Emit = Callable[[dict[str, Any]], Awaitable[None]]


# Results that end a turn as asked (a limit of the message), not as a failure of the engine.
_ENDS_WITHOUT_ERROR = ("error_max_turns", "error_max_budget_usd", "error_max_structured_output_retries")


class SdkEngineError(EngineError):
    """The CLI failed; the message is meant for a person."""


def cli_permission_mode(mode: str) -> str:
    """ashd's modes as the CLI's: `permissionsByAgent` (only settings.json `allow` runs, no approver)
    is the CLI's `default` in print mode; no mode is the built-in engine's default, bypass."""
    return {"permissionsByAgent": "default", "": "bypassPermissions"}.get(mode, mode)


def _transcript_dir(home: str, cwd: Path) -> Path:
    # The CLI keeps a project's transcripts under its working directory with every other character a `-`.
    slug = "".join(c if c.isalnum() else "-" for c in str(cwd))
    return Path(home) / ".claude" / "projects" / slug


def write_transcript(path: Path, session_id: str, cwd: Path, history: list[dict[str, Any]]) -> None:
    """The stored history as the CLI's transcript: user and assistant entries in a parent chain."""
    path.parent.mkdir(parents=True, exist_ok=True)
    parent: str | None = None
    lines = []
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    for message in history:
        entry_id = str(uuid.uuid4())
        lines.append(json.dumps({
            "parentUuid": parent, "isSidechain": False, "type": message.get("role"), "message": message,
            "uuid": entry_id, "timestamp": now, "sessionId": session_id, "cwd": str(cwd), "userType": "external",
        }))
        parent = entry_id
    path.write_text("\n".join(lines) + "\n")


class McpStatus:
    """What init_ok reports about the MCP servers (the CLI's `mcp_status` answer)."""

    def __init__(self) -> None:
        self.servers: list[dict[str, Any]] = []

    def status(self) -> list[dict[str, Any]]:
        return list(self.servers)


class SdkEngine:
    NAME = ENGINE_NAME

    def __init__(self, config: EngineConfig, log_fn: Callable[[str, str], Awaitable[None]]) -> None:
        self.config = config
        self.session_id = config.session_id or m.new_uuid()
        self.mcp = McpStatus()
        self._log = log_fn
        self._forwarder: LoopbackForwarder | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._lines: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._controls: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._stderr: list[str] = []
        self._model: str | None = None
        # The per-query flags (maxTurns, effort, thinking, outputFormat, maxBudgetUsd) the running CLI
        # was started with: a query asking for others restarts it on the same transcript, as a model does.
        self._flags: list[str] = self._query_flags(QueryOptions())
        self._reconfigured = False  # the live config changed: the next query restarts the CLI
        self._busy = False
        self._interrupted = False
        self._request_seq = 0
        self._mcp_ready: asyncio.Task[None] | None = None  # the CLI's MCP servers, until none is pending

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        cli = bundled_cli()
        if cli is None:
            raise SdkEngineError(
                "the claude-agent-sdk engine is not installed in the sandbox's Python: install ashd with "
                "its `sdk` extra (pip install 'ashd[sdk]')")
        if not self.config.model_socket:
            raise SdkEngineError("the claude-agent-sdk engine needs the model proxy socket")
        self._forwarder = LoopbackForwarder(self.config.model_socket)
        await self._forwarder.start()
        transcript = self._transcript()
        if not transcript.exists() and self.config.history:
            write_transcript(transcript, self.session_id, self.config.workspace, self.config.history)
        await self._spawn(cli, self._default_model(), resume=transcript.exists())
        # The CLI starts its MCP servers itself; `init` does not wait for them (a stdio server: a second
        # or more), a query does, before its prompt goes: the CLI would run a turn without the tools
        # of servers still connecting.
        with contextlib.suppress(OSError, ValueError):  # (the CLI says what is wrong with the file)
            self.mcp.servers = [{"name": name, "status": "pending"} for name in read_mcp_config(self.config.workspace)]
        self._mcp_ready = asyncio.create_task(self._wait_for_mcp())

    def _transcript(self) -> Path:
        home = self.config.tool_env()["HOME"]
        return _transcript_dir(home, self.config.workspace) / f"{self.session_id}.jsonl"

    async def _wait_for_mcp(self) -> None:
        """The MCP servers' status for init_ok, once the CLI has connected them (or given up)."""
        deadline = asyncio.get_running_loop().time() + MCP_START_TIMEOUT_S
        while True:
            answer = await self._control({"subtype": "mcp_status"})
            servers = answer.get("mcpServers")
            self.mcp.servers = [{"name": s.get("name"), "status": s.get("status")}
                                for s in servers or [] if isinstance(s, dict)]
            pending = [s for s in self.mcp.servers if s["status"] == "pending"]
            if not pending or asyncio.get_running_loop().time() > deadline:
                return
            await asyncio.sleep(MCP_POLL_S)

    async def _mcp_started(self) -> None:
        """Wait for the CLI's MCP servers still connecting at its start (an interrupt ends the wait,
        not the servers' start); a CLI that fails meanwhile is reported by the query itself."""
        await wait_started(self._mcp_ready, "the Claude Code CLI's MCP status could not be read")
        self._mcp_ready = None

    async def close(self) -> None:
        if self._mcp_ready is not None:
            self._mcp_ready.cancel()
        await self.close_cli()
        if self._forwarder is not None:
            await self._forwarder.close()

    def _default_model(self, query_model: str | None = None) -> str:
        """The built-in engine's precedence: query > session > initialAgent's model > settings > default."""
        agent_model = None
        name = self.config.initial_agent
        if name and name in self.config.subagents:
            agent_model = subagent_model(self.config.subagents[name].get("model"))
        return query_model or self.config.model or agent_model or self.config.default_model()

    def _argv(self, cli: Path, model: str, resume: bool) -> list[str]:
        c = self.config
        argv = [str(cli), "-p", "--output-format", "stream-json", "--input-format", "stream-json", "--verbose",
                "--include-partial-messages", "--model", model,
                "--permission-mode", cli_permission_mode(c.permission_mode),
                "--system-prompt", c.system_prompt or "", *self._flags]
        argv += ["--resume", self.session_id] if resume else ["--session-id", self.session_id]
        if c.allowed_tools:
            argv += ["--allowedTools", ",".join(c.allowed_tools)]
        if c.disallowed_tools:
            argv += ["--disallowedTools", ",".join(c.disallowed_tools)]
        if c.betas:
            argv += ["--betas", ",".join(c.betas)]
        permissions = {"allow": c.allow_rules(), "deny": c.deny_rules()}
        if permissions["allow"] or permissions["deny"]:
            argv += ["--settings", json.dumps({"permissions": permissions})]
        mcp = c.workspace / ".mcp.json"
        argv += ["--strict-mcp-config"] + (["--mcp-config", str(mcp)] if mcp.is_file() else [])
        if c.subagents:
            agents = {name: {k: v for k, v in d.items() if k in ("description", "prompt", "tools", "model")}
                      for name, d in c.subagents.items()}
            argv += ["--agents", json.dumps(agents)]
        if c.initial_agent and c.initial_agent in c.subagents:
            argv += ["--agent", c.initial_agent]
        return argv

    def _query_flags(self, options: QueryOptions) -> list[str]:
        """A query's options as the CLI's flags (as the Agent SDK maps them)."""
        flags = ["--max-turns", str(options.max_turns or self.config.max_turns)]
        if options.effort:
            flags += ["--effort", options.effort]
        thinking = options.thinking or {}
        if thinking.get("type") == "adaptive":
            flags += ["--thinking", "adaptive"]
        elif options.thinking_budget is not None:
            flags += ["--max-thinking-tokens", str(options.thinking_budget)]
        elif thinking.get("type") == "disabled":
            flags += ["--thinking", "disabled"]
        if options.output_schema is not None:
            flags += ["--json-schema", json.dumps(options.output_schema)]
        if options.max_budget_usd is not None:
            flags += ["--max-budget-usd", str(options.max_budget_usd)]
        return flags

    def reconfigure(self, changes: dict[str, Any]) -> None:
        """The session's live config changed (PATCH .../config): the CLI restarts with it at the next query."""
        if self._busy:
            raise SdkEngineError("a query is already running in this session")
        if apply_live_config(self.config, changes):
            self._reconfigured = True

    def _env(self) -> dict[str, str]:
        assert self._forwarder is not None
        env = self.config.tool_env()
        env.update({
            "ANTHROPIC_BASE_URL": self._forwarder.base_url,
            "ANTHROPIC_API_KEY": PLACEHOLDER_KEY,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_ENTRYPOINT": "sdk-py",
            # The builtin engine's retry budget. The CLI's own is 10, with backoff to 40 s, and it
            # retries a 401 too: a wrong ANTHROPIC_API_KEY took three minutes to reach the person.
            "CLAUDE_CODE_MAX_RETRIES": str(MAX_RETRIES),
            # It is: without this the CLI refuses bypassPermissions to a root user (a bridge run
            # outside a sandbox, as in tests); inside one it runs as an unprivileged uid anyway.
            "IS_SANDBOX": "1",
        })
        return env

    async def _spawn(self, cli: Path, model: str, *, resume: bool) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *self._argv(cli, model, resume), cwd=str(self.config.workspace), env=self._env(),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024)
        self._model = model
        self._lines = asyncio.Queue()
        self._reader = asyncio.create_task(self._read(self._proc))

    async def _restart(self, model: str) -> None:
        """A different model or flags for this query: the CLI is started again on the same transcript
        (a new one when the session has none yet: its first query)."""
        await self.close_cli()
        cli = bundled_cli()
        assert cli is not None
        await self._spawn(cli, model, resume=self._transcript().exists())

    async def close_cli(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self._reader is not None:
            await asyncio.wait([self._reader], timeout=5)

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        assert proc.stderr is not None
        stderr = proc.stderr

        async def drain_stderr() -> None:
            while line := await stderr.readline():
                text = line.decode(errors="replace").rstrip()
                self._stderr = [*self._stderr[-40:], text]
                log.info("claude cli: %s", text)

        errs = asyncio.create_task(drain_stderr())
        try:
            while line := await proc.stdout.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    log.info("claude cli (stdout): %s", line.decode(errors="replace").rstrip())
                    continue
                if not isinstance(msg, dict):
                    continue
                if msg.get("type") == "control_response":
                    response = msg.get("response") or {}
                    waiter = self._controls.pop(str(response.get("request_id")), None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(response)
                    continue
                await self._lines.put(msg)
        finally:
            await asyncio.wait([errs], timeout=5)
            for waiter in self._controls.values():
                if not waiter.done():
                    waiter.set_exception(SdkEngineError(self._exit_reason()))
            await self._lines.put(None)

    def _exit_reason(self) -> str:
        tail = "; ".join(line for line in self._stderr[-5:] if line)
        code = self._proc.returncode if self._proc is not None else None
        return f"the Claude Code CLI stopped (exit code {code}){': ' + tail if tail else ''}"

    async def _write(self, payload: dict[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            raise SdkEngineError(self._exit_reason())
        try:
            proc.stdin.write((json.dumps(payload) + "\n").encode())
            await proc.stdin.drain()
        except (ConnectionError, OSError) as exc:
            raise SdkEngineError(self._exit_reason()) from exc

    async def _control(self, request: dict[str, Any]) -> dict[str, Any]:
        self._request_seq += 1
        request_id = f"req_{self._request_seq}_{os.urandom(4).hex()}"
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._controls[request_id] = waiter
        await self._write({"type": "control_request", "request_id": request_id, "request": request})
        try:
            response = await asyncio.wait_for(waiter, CONTROL_TIMEOUT_S)
        except TimeoutError as exc:
            raise SdkEngineError(f"the Claude Code CLI did not answer {request['subtype']}") from exc
        finally:
            self._controls.pop(request_id, None)
        if response.get("subtype") == "error":
            raise SdkEngineError(f"the Claude Code CLI refused {request['subtype']}: {response.get('error')}")
        inner = response.get("response")
        return inner if isinstance(inner, dict) else {}

    async def _next(self) -> dict[str, Any]:
        msg = await self._lines.get()
        if msg is None:
            raise SdkEngineError(self._exit_reason())
        return msg

    async def _drain_interrupted(self) -> None:
        """Skip what the CLI still says about an interrupted turn, up to its result."""
        self._interrupted = False
        try:
            async with asyncio.timeout(INTERRUPT_DRAIN_S):
                while (await self._next()).get("type") != "result":
                    pass
        except (TimeoutError, SdkEngineError):
            await self._restart(self._model or self._default_model())

    # -- queries -----------------------------------------------------------------------------
    async def query(
        self,
        prompt: str | list[dict[str, Any]],
        *,
        emit: Emit,
        model: str | None = None,
        include_partial: bool = False,
        check_limits: Any = None,
        options: QueryOptions | None = None,
    ) -> dict[str, Any]:
        """Run one user turn through the CLI; emits its messages unchanged and returns its result.
        Raises SdkEngineError when the CLI fails or the turn ends in an error."""
        if self._busy:
            raise SdkEngineError("a query is already running in this session")
        self._busy = True
        try:
            await self._mcp_started()
            if self._interrupted:
                await self._drain_interrupted()
            wanted = self._default_model(model)
            flags = self._query_flags(options or QueryOptions())
            if (wanted != self._model or flags != self._flags or self._reconfigured or self._proc is None
                    or self._proc.returncode is not None):
                self._flags, self._reconfigured = flags, False
                await self._restart(wanted)
            content = (expand_skill(self.config.workspace, prompt) if isinstance(prompt, str) else None) or prompt
            await self._write({"type": "user", "message": {"role": "user", "content": content},
                               "parent_tool_use_id": None, "session_id": self.session_id})
            try:
                while True:
                    msg = await self._next()
                    if msg.get("type") == "stream_event" and not include_partial:
                        continue
                    await emit(msg)
                    if msg.get("type") == "result":
                        break
            except asyncio.CancelledError:
                self._interrupted = True
                with contextlib.suppress(SdkEngineError, OSError):
                    await asyncio.shield(self._write({"type": "control_request", "request_id": f"int_{m.new_uuid()}",
                                                      "request": {"subtype": "interrupt"}}))
                raise
            if msg.get("is_error") and msg.get("subtype") not in _ENDS_WITHOUT_ERROR:
                raise SdkEngineError(str(msg.get("result") or msg.get("errors") or "the turn failed"))
            return msg
        finally:
            self._busy = False
