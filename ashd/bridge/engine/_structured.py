"""Structured output (`outputFormat: {type: "json_schema", schema}`) for the built-in engine.

As the Claude Agent SDK does it: the model gets one more tool, `StructuredOutput`, whose input
schema is the requested schema, and is told to give its final answer through it. The engine checks
the answer against the schema (jsonschema): a valid one ends the turn and is the `result`'s
`structured_output`; an invalid one goes back to the model as an error tool result, and a turn
that ends without the tool is asked again (the call then forces the tool, unless extended
thinking is on, which the API does not allow with a forced tool). After `MAX_RETRIES` such
corrections the turn ends with `error_max_structured_output_retries`.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import validators  # type: ignore[import-untyped]

from ashd.bridge.engine._options import STRUCTURED_OUTPUT_TOOL

MAX_RETRIES = 5
SYSTEM_NOTE = (f"When you have finished, give your final answer by calling the {STRUCTURED_OUTPUT_TOOL} tool "
               "exactly once, as your last action; its input must match the tool's schema.")
REMINDER = (f"You ended your turn without calling the {STRUCTURED_OUTPUT_TOOL} tool. Call it now with your "
            "final answer; its input must match the tool's schema.")
_ERRORS_SHOWN = 5


class StructuredOutput:
    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        # A tool's input is always a JSON object: any other schema is wrapped in `{output: ...}`.
        self.wrapped = schema.get("type") != "object"
        self.input_schema: dict[str, Any] = (
            {"type": "object", "properties": {"output": schema}, "required": ["output"]} if self.wrapped
            else schema)
        self._validator = validators.validator_for(schema)(schema)
        self.value: Any = None
        self.done = False
        self.corrections = 0
        self.force_next = False

    def tool(self) -> dict[str, Any]:
        what = "Put your final answer in `output`. " if self.wrapped else ""
        return {"name": STRUCTURED_OUTPUT_TOOL,
                "description": f"Return your final answer as structured output. {what}Call this exactly once, "
                               "at the end.",
                "input_schema": self.input_schema}

    @property
    def exhausted(self) -> bool:
        return self.corrections > MAX_RETRIES

    def remind(self) -> str:
        """The turn ended without the tool: the text that asks for it (the next call forces it)."""
        self.corrections += 1
        self.force_next = True
        return REMINDER

    def answer(self, block: dict[str, Any]) -> dict[str, Any]:
        """The tool result for the model's StructuredOutput call; a valid answer is kept."""
        self.force_next = False
        raw = block.get("input")
        args: dict[str, Any] = raw if isinstance(raw, dict) else {}
        value = args.get("output") if self.wrapped else args
        errors = sorted(self._validator.iter_errors(value), key=lambda e: list(e.path))
        if self.wrapped and "output" not in args:
            errors = []
            problem = "the input has no `output` field"
        else:
            problem = "; ".join(f"{'/'.join(str(p) for p in e.path) or '(root)'}: {e.message}"
                                for e in errors[:_ERRORS_SHOWN])
        if not problem:
            self.value, self.done = value, True
            return {"type": "tool_result", "tool_use_id": block.get("id"),
                    "content": "Structured output provided successfully"}
        self.corrections += 1
        return {"type": "tool_result", "tool_use_id": block.get("id"), "is_error": True,
                "content": f"The output does not match the schema: {problem}. Call {STRUCTURED_OUTPUT_TOOL} "
                           "again with a corrected answer."}

    def result_text(self, text: str) -> str:
        return text or json.dumps(self.value, ensure_ascii=False)
