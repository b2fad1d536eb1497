"""Which models this machine has: the embedded default, `--model FILE`, and every GGUF under the models folders.

Role: describe each model from its GGUF metadata only (tokenizer/gguf_meta.py; tensor data is never read): an id,
its aliases (from its run config), architecture, quantization, file size, context, chat-template family and the
shape figures a launch plan needs (layers, KV heads, head size). A file Strata cannot serve is still listed,
with the reason. Pure: no HTTP, no processes; the only input/output is reading the files it is given.

Public surface: `ModelInfo`, `describe(path, source)`, `discover(model=None, models_dirs=(), default=None,
aliases_of=None)`, `find(models, name)`, `template_family(text)`, `DEFAULT_MODELS_DIR`, `SUPPORTED_ARCHS`.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from strata_control.runconfig_file import default_model_name
from strata_control.families import template_problem
from strata_control.families import template_family as _family_of_text
from tokenizer.gguf_meta import GGUFError, read_metadata, read_tensor_infos

DEFAULT_MODELS_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                  "strata", "models")
# engine/models/<arch>.cpp (a test keeps them equal)
SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "qwen2moe", "phi3", "gpt-oss")
MAX_WALK_FILES = 10000                               # a models folder with more files is the wrong folder

# llama.cpp's `general.file_type` (LLAMA_FTYPE_*) values -> the quantization name
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
              17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 25: "IQ4_NL", 30: "IQ4_XS", 32: "BF16", 38: "MXFP4_MOE"}
# the ones whose tensors the engine reads (engine/cpu/quants.h: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K
# Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4)
SUPPORTED_QUANTS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M",
                    "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4_MOE")
_SHAPE_KEYS = ("context_length", "block_count", "embedding_length", "attention.head_count",
               "attention.head_count_kv", "attention.key_length", "expert_count", "expert_used_count")


@dataclass
class ModelInfo:
    id: str
    path: str
    source: str                      # "default", "--model", or the models folder it was found in
    size_bytes: int = 0
    aliases: list = field(default_factory=list)
    architecture: str | None = None
    quant: str | None = None
    n_ctx_train: int = 0
    template: str | None = None      # chat-template family ("chatml", "llama3", ...; None = the GGUF has none)
    template_problem: str | None = None   # why the template cannot be rendered (it does not compile)
    n_layer: int = 0
    n_embd: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    head_dim: int = 0
    n_expert: int = 0                # mixture of experts: experts per layer, and those each token uses (0: dense)
    n_expert_used: int = 0
    expert_bytes: int = 0            # of size_bytes, what the expert tensors take (by their share of the elements)
    problem: str | None = None       # why Strata cannot serve it (None = it can)

    @property
    def usable(self) -> bool:
        return self.problem is None

    def names(self) -> list[str]:
        return [self.id, *self.aliases]

    def row(self) -> dict:
        """The JSON/table view (`strata models`)."""
        return {"id": self.id, "aliases": list(self.aliases), "architecture": self.architecture,
                "quant": self.quant, "size_bytes": self.size_bytes, "context": self.n_ctx_train,
                "template": self.template, "path": self.path, "source": self.source,
                "experts": {"total": self.n_expert, "active": self.n_expert_used} if self.n_expert else None,
                "status": "ok" if self.usable else "unsupported", "problem": self.problem}


def template_family(text) -> str | None:
    """The family of a GGUF's chat-template text, as the server detects it (serve/prompt/chatml.py: "chatml",
    "llama3", "gemma", "mistral", ..., "unknown"); None when the GGUF has no template."""
    if not isinstance(text, str) or not text:
        return None
    return _family_of_text(text)


def _problem(info: ModelInfo) -> str | None:
    if info.architecture not in SUPPORTED_ARCHS:
        return (f"architecture {info.architecture!r} is not one Strata runs "
                f"({', '.join(SUPPORTED_ARCHS)})")
    if info.quant is not None and info.quant not in SUPPORTED_QUANTS:
        return f"quantization {info.quant} is not one the engine reads ({', '.join(SUPPORTED_QUANTS)})"
    if info.template_problem:
        return info.template_problem
    if info.n_layer <= 0 or info.n_head <= 0:
        return "the metadata lacks the layer or head counts"
    return None


def describe(path: str, source: str = "--model", aliases=()) -> ModelInfo:
    """One model from its metadata; a file that cannot be read comes back with `problem` set."""
    info = ModelInfo(id=default_model_name(path), path=os.path.abspath(path), source=source, aliases=list(aliases))
    try:
        info.size_bytes = os.path.getsize(path)
        meta = read_metadata(path, keys=None)
    except (OSError, GGUFError) as e:
        info.problem = f"unreadable: {getattr(e, 'strerror', None) or e}"
        return info
    arch = meta.get("general.architecture")
    info.architecture = arch if isinstance(arch, str) else None
    ftype = meta.get("general.file_type")
    info.quant = FILE_TYPES.get(ftype, f"file_type {ftype}") if isinstance(ftype, int) else None
    info.template = template_family(meta.get("tokenizer.chat_template"))
    if isinstance(meta.get("tokenizer.chat_template"), str):
        info.template_problem = template_problem(meta["tokenizer.chat_template"])
    shape = {k: meta.get(f"{arch}.{k}") for k in _SHAPE_KEYS}
    whole = lambda v: int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0
    info.n_ctx_train = whole(shape["context_length"])
    info.n_layer, info.n_embd = whole(shape["block_count"]), whole(shape["embedding_length"])
    info.n_head = whole(shape["attention.head_count"])
    info.n_head_kv = whole(shape["attention.head_count_kv"]) or info.n_head
    info.head_dim = whole(shape["attention.key_length"]) or (info.n_embd // info.n_head if info.n_head else 0)
    info.n_expert, info.n_expert_used = whole(shape["expert_count"]), whole(shape["expert_used_count"])
    if info.n_expert:
        info.expert_bytes = _expert_bytes(path, info.size_bytes)
    info.problem = _problem(info)
    return info


def _expert_bytes(path: str, size_bytes: int) -> int:
    """The experts' share of the file: their elements over all the tensors' elements, times the file size
    (tensor infos only; the experts and the rest are mostly of one quantisation in the files people run)."""
    try:
        infos = read_tensor_infos(path)
    except (OSError, GGUFError):
        return 0
    count = lambda ne: math.prod(ne) if ne else 0
    every = sum(count(ne) for _, _, ne in infos)
    experts = sum(count(ne) for name, _, ne in infos if "_exps." in name)
    return int(size_bytes * experts / every) if every else 0


def _gguf_files(folder: str) -> list[str]:
    out: list[str] = []
    seen = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            seen += 1
            if seen > MAX_WALK_FILES:
                return out
            if name.lower().endswith(".gguf"):
                out.append(os.path.join(root, name))
    return out


def discover(model: str | None = None, models_dirs=(), default: str | None = None,
             aliases_of=None) -> list[ModelInfo]:
    """Every model this server could serve, in order: `--model`, the default, the folders' files (sorted).

    `aliases_of(path) -> list[str]` gives a model's aliases (its run config's); ids are made unique with a
    `-2`, `-3` suffix when two files would share one. A file found twice (by a link or two folders) is
    listed once.
    """
    found: list[ModelInfo] = []
    seen: set[str] = set()
    candidates = ([(model, "--model")] if model else []) + ([(default, "default")] if default else [])
    for folder in models_dirs:
        if os.path.isdir(folder):
            candidates += [(p, folder) for p in _gguf_files(folder)]
    ids: set[str] = set()
    for path, source in candidates:
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        info = describe(path, source, aliases_of(path) if aliases_of else ())
        base, n = info.id, 2
        while info.id in ids:
            info.id, n = f"{base}-{n}", n + 1
        ids.add(info.id)
        info.aliases = [a for a in info.aliases if a not in ids]
        found.append(info)
    return found


def find(models: list[ModelInfo], name: str | None) -> ModelInfo | None:
    """The model a name (id, alias, file path or file name) means; None = no such model. No name = the first."""
    if not name:
        return models[0] if models else None
    for m in models:
        if name in m.names():
            return m
    for m in models:
        if os.path.abspath(name) == m.path or os.path.basename(m.path) == name:
            return m
    return None
