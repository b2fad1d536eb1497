"""serve.prompt.jinja_template (floor 3): a GGUF's own `tokenizer.chat_template` rendered as written, in a sandbox.

Contract: `JinjaTemplate(text, bos_token, eos_token)` compiles once (a syntax error raises `TemplateRenderError`);
`render(messages, tools=None, add_generation_prompt=True, **flags)` returns the prompt text or raises
`TemplateRenderError` (the caller answers 400 naming its message, never 500). The environment is jinja2's
`ImmutableSandboxedEnvironment` with trim_blocks / lstrip_blocks on, the loop-controls extension and Hugging
Face's `{% generation %}` block (its body rendered as is), as transformers sets it; globals `raise_exception(msg)` and `strftime_now(fmt)`; the `tojson` filter with
`ensure_ascii=False`, an optional `indent`, keys in the caller's order (transformers does not sort).
Bounds: a rendered prompt over `MAX_OUTPUT_BYTES` is refused. serve/prompt/jinja_chat.py puts it behind the native renderers' interface.
"""

import json
import time

MAX_OUTPUT_BYTES = 4 * 1024 * 1024   # a prompt longer than this is refused (no context window is near it)


class TemplateRenderError(ValueError):
    """A template that cannot be compiled or cannot render this request; the message names the template's error."""


def _raise_exception(message):
    raise TemplateRenderError(f"chat template: {message}")


def _strftime_now(fmt):
    return time.strftime(fmt)


def _tojson(value, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def _generation_extension(jinja2):
    """`{% generation %}...{% endgeneration %}` (transformers marks the assistant's tokens with it): the body only."""
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return Generation


class JinjaTemplate:
    """One compiled chat template; immutable after construction, so safe to share across threads."""

    def __init__(self, text: str, bos_token: str = "", eos_token: str = ""):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        self._jinja2 = jinja2
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols", _generation_extension(jinja2)])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(text)
        except jinja2.TemplateError as e:
            raise TemplateRenderError(f"chat template does not compile: {e}") from e
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages, tools=None, add_generation_prompt=True, **flags) -> str:
        try:
            out = self._template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token, **flags)
        except TemplateRenderError:
            raise
        except Exception as e:  # noqa: BLE001  whatever the model's template raises is the template's failure (400)
            raise TemplateRenderError(f"chat template failed to render this request: {type(e).__name__}: {e}") from e
        if len(out.encode("utf-8")) > MAX_OUTPUT_BYTES:
            raise TemplateRenderError(f"chat template rendered more than {MAX_OUTPUT_BYTES} bytes")
        return out
