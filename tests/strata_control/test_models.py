"""strata_control.models: discovery and description from GGUF metadata, over files the tests write."""
import os

from strata_control.models import describe, discover, find, template_family
from tests.strata_control.ggufs import LLAMA3, write_model


def test_describe_reads_the_metadata(tmp_path):
    m = describe(str(write_model(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")), "default", ["small"])
    assert (m.id, m.architecture, m.quant, m.n_ctx_train, m.template) == \
        ("smollm2-135m-instruct", "llama", "Q4_1", 8192, "chatml")
    assert (m.n_layer, m.n_head, m.n_head_kv, m.head_dim) == (30, 9, 3, 64)
    assert m.usable and m.names() == ["smollm2-135m-instruct", "small"]
    assert m.size_bytes == os.path.getsize(m.path) and m.row()["status"] == "ok"


def test_unsupported_and_unreadable_files_are_listed_with_the_reason(tmp_path):
    d = tmp_path / "models"
    (d / "sub").mkdir(parents=True)
    write_model(d / "a-gemma.gguf", arch="gemma2")
    write_model(d / "b-five.gguf", file_type=19)
    write_model(d / "c-llama3.gguf", template="[INST] {{ m.content }} [/INST]")
    write_model(d / "e-mistral.gguf", template="{% for m in messages %}[INST] {{ m.content }} [/INST]{% endif %}")
    (d / "sub" / "d-broken.gguf").write_bytes(b"GGUF\x03\x00")
    (d / "notes.txt").write_text("not a model")
    found = {m.id: m for m in discover(models_dirs=[str(d)])}
    rows = {k: m.problem for k, m in found.items()}
    assert set(rows) == {"a-gemma", "b-five", "c-llama3", "d-broken", "e-mistral"}
    assert "architecture 'gemma2'" in rows["a-gemma"]
    assert "quantization IQ2_XXS" in rows["b-five"]
    # a template of another family is rendered by its own Jinja text; only one that does not compile is refused
    assert rows["c-llama3"] is None and found["c-llama3"].template == "mistral"
    assert "does not compile" in rows["e-mistral"] and "endif" in rows["e-mistral"]
    assert rows["d-broken"].startswith("unreadable")


def test_discover_orders_flag_default_folder_and_keeps_ids_unique(tmp_path):
    (tmp_path / "x").mkdir()
    a = write_model(tmp_path / "x" / "m.Q4_1.gguf")
    b = write_model(tmp_path / "y.gguf")
    folder = tmp_path / "f"
    folder.mkdir()
    write_model(folder / "m.Q8_0.gguf", file_type=7)
    os.symlink(b, folder / "link.gguf")   # the same file again: listed once
    found = discover(model=str(b), default=str(a), models_dirs=[str(folder), str(tmp_path / "absent")],
                     aliases_of=lambda p: ["fav"] if p.endswith("y.gguf") else [])
    assert [(m.id, m.source) for m in found] == [("y", "--model"), ("m", "default"), ("m-2", str(folder))]
    assert found[0].aliases == ["fav"]
    assert find(found, "fav") is found[0] and find(found, "m-2").quant == "Q8_0"
    assert find(found, str(a)) is found[1] and find(found, "nope") is None and find(found, None) is found[0]


def test_template_family():
    assert template_family(None) is None and template_family("") is None
    assert template_family("{{ '<|im_start|>' }}") == "chatml" and template_family("plain") == "unknown"


def test_the_lists_of_what_strata_serves_have_one_source():
    """The architectures are the engine's model files; the rendered families are strata_control/families.py's one list."""
    import pathlib
    from strata_control import families
    from strata_control import models
    root = pathlib.Path(__file__).resolve().parents[2]
    assert sorted(models.SUPPORTED_ARCHS) == sorted(p.stem for p in (root / "engine" / "models").glob("*.cpp"))
    assert models.template_problem is families.template_problem
    assert template_family("{{ '<|start_header_id|>' }}") == families.template_family("<|start_header_id|>")
