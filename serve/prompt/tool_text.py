"""Tool text: how a tool call and the tool section are written into a prompt.

Role: the text form of tool calls as the prompt writes it: the tags (`<tool_call>`, `<function=`,
`<parameter=`), a call's arguments as JSON text or as an object, call ids, the system turn's tool section in
pieces (`tools_intro(fmt)`, `tool_signature(tool)` per line, `tools_outro(fmt)`; the template writes them,
with the signatures as client text) and the opening that forces a call. Reading calls back out of model text
is serve/generation/toolcall_parsers.py's job. Knows no HTTP, no tokens and no engine.

Public surface: `CALL_OPEN`, `CALL_CLOSE`, `FUNCTION_OPEN`, `FUNCTION_CLOSE`, `PARAM_OPEN`, `PARAM_CLOSE`,
`new_call_id(api)`, `arguments_text(args)`, `arguments_object(args)`, `tools_intro(fmt)`, `tools_outro(fmt)`,
`tool_signature(tool)`, `forced_opening(tool_choice, tools, fmt)`.
"""
from __future__ import annotations

import json
import secrets
from typing import Any

from serve.core.events import ToolSpec


CALL_OPEN = "<tool_call>"


CALL_CLOSE = "</tool_call>"


FUNCTION_OPEN = "<function="


FUNCTION_CLOSE = "</function>"


PARAM_OPEN = "<parameter="


PARAM_CLOSE = "</parameter>"


def new_call_id(api: str = "openai") -> str:
    """`call_<24 hex>` (OpenAI) or `toolu_<24 hex>` (Anthropic)."""
    return ("toolu_" if api == "anthropic" else "call_") + secrets.token_hex(12)


def arguments_text(args: dict | str) -> str:
    """The arguments' JSON text as both APIs carry it; streamed pieces concatenate to exactly this."""
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def arguments_object(args: dict | str) -> dict:
    """The arguments as an object: JSON text is parsed; text that is not a JSON object becomes
    `{"arguments": text}` (the form the templates write back and Ollama's clients read)."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return {"arguments": args}
    return args if isinstance(args, dict) else {"arguments": args}


_XML_INSTRUCTIONS = (
    "To call a function, write a block in exactly this form (one block per call, nothing inside it but the "
    "call):\n<tool_call>\n<function=FUNCTION_NAME>\n<parameter=PARAMETER_NAME>\nVALUE\n</parameter>\n"
    "</function>\n</tool_call>\nGive every required parameter. Values that are not plain text are written "
    "as JSON. You may write text before a call; after calls, stop and wait for their results.")


_JSON_INSTRUCTIONS = (
    "To call a function, write a JSON object with its name and arguments between <tool_call> and "
    "</tool_call>, one block per call:\n<tool_call>\n{\"name\": \"FUNCTION_NAME\", \"arguments\": "
    "{\"PARAMETER_NAME\": VALUE}}\n</tool_call>\nAfter calls, stop and wait for their results.")


def tools_intro(fmt: str = "json") -> str:
    """The tool section's text before the signatures (which follow one JSON object per line)."""
    return ("# Tools\n\nYou can call these functions to help with the user's request. Their signatures, "
            "as JSON schemas:\n<tools>\n")


def tools_outro(fmt: str = "json") -> str:
    """The tool section's text after the signatures: how to write a call in the form `fmt`."""
    return "</tools>\n\n" + (_XML_INSTRUCTIONS if fmt == "xml" else _JSON_INSTRUCTIONS)


def tool_signature(tool: ToolSpec) -> str:
    return json.dumps({"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                        "parameters": tool.parameters or {}}}, ensure_ascii=False)


def _choice_name(tool_choice: Any) -> str | None:
    if isinstance(tool_choice, dict):
        name = tool_choice.get("name")
        if name is None and isinstance(tool_choice.get("function"), dict):
            name = tool_choice["function"].get("name")
        return name if isinstance(name, str) else None
    return None


def forced_opening(tool_choice: Any, tools: list[ToolSpec], fmt: str = "json") -> str | None:
    """The text that forces a call, or None (auto / none / unknown choices act as auto).

    "required" (Anthropic "any") with tools opens a call, naming the tool when there is exactly one; a named
    tool in the list opens a call to it.
    """
    if not tools or tool_choice in (None, "auto", "none"):
        return None
    name = _choice_name(tool_choice)
    if name is None and tool_choice in ("required", "any") and len(tools) == 1:
        name = tools[0].name
    if name is not None and name not in {t.name for t in tools}:
        return None
    if name is None and tool_choice not in ("required", "any"):
        return None
    # A named tool with required parameters can only go on with its first parameter: the opening writes
    # that much too, which keeps small models on the format.
    spec = next((t for t in tools if t.name == name), None)
    required = bool(spec and isinstance(spec.parameters, dict) and spec.parameters.get("required"))
    if fmt == "xml":
        return f"{CALL_OPEN}\n{FUNCTION_OPEN}" + (f"{name}>\n" + (PARAM_OPEN if required else "") if name else "")
    if name:
        return (f'{CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": ' +
                ('{"' if required else ""))
    return f'{CALL_OPEN}\n{{"name": "'
