"""Small model files for the strata_control tests: GGUF metadata only (no tensors), written here."""
from tests.conftest import write_gguf

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
LLAMA3 = "<|start_header_id|>{{ role }}<|end_header_id|>"


def write_model(path, arch="llama", file_type=3, template=CHATML, n_ctx=8192, n_layer=30, n_embd=576,
                n_head=9, n_head_kv=3, pad_bytes=0):
    """A GGUF with the keys strata_control reads; `pad_bytes` makes the file that much bigger (its size
    stands for the weights)."""
    kvs = [("general.architecture", 8, arch), ("general.file_type", 4, file_type),
           (f"{arch}.context_length", 4, n_ctx), (f"{arch}.block_count", 4, n_layer),
           (f"{arch}.embedding_length", 4, n_embd), (f"{arch}.attention.head_count", 4, n_head),
           (f"{arch}.attention.head_count_kv", 4, n_head_kv)]
    if template is not None:
        kvs.append(("tokenizer.chat_template", 8, template))
    write_gguf(path, kvs)
    if pad_bytes:
        with open(path, "ab") as f:
            f.truncate(path.stat().st_size + pad_bytes)
    return path
