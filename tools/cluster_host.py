"""One Strata HTTP server over the fake engine (tests/fake_engine.py) that answers every chat with its name
(or, with --echo, with the last `#N#` marker of the prompt, --repeat times, a token every --token-delay-s): a
host of tools/cluster_figures.py --fake and tests/tools/test_cluster_ns.py, so they need no engine build or model. It
names itself in X-Strata-Host.

Usage: python tools/cluster_host.py --host ADDR --port N --name NAME [--seconds S] [--echo --repeat K]
Serves until SIGTERM or S seconds (default 300), then stops its fake engine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from serve.engine_client.engine import StrataEngine  # noqa: E402
from serve.generation.service import Service  # noqa: E402
from serve.http.server import Options, make_server  # noqa: E402
from tokenizer.bpe import ByteTokenizer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--echo", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--token-delay-s", type=float, default=0.0)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="strata-cluster-")
    script = os.path.join(tmp, "script.json")
    with open(script, "w", encoding="utf-8") as f:
        turn = {"echo": "(?s)#[0-9]+#(?!.*#[0-9]+#)"} if args.echo else {"text": args.name}
        json.dump({"turns": [{**turn, "repeat": args.repeat, "token_delay_s": args.token_delay_s}]}, f)
    engine = StrataEngine([sys.executable, os.path.join(ROOT, "tests", "fake_engine.py"), "--script", script],
                          ["--max-context", "2048"], log_path=os.path.join(tmp, "engine.log"))
    engine.start()
    httpd = make_server(Service(engine, ByteTokenizer(), "fake-model"),
                        Options(host=args.host, port=args.port, quiet=True, host_name=args.name))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    print(f"cluster_host {args.name}: listening on {args.host}:{args.port}", flush=True)
    stop.wait(args.seconds)
    httpd.begin_stop()
    httpd.shutdown()
    httpd.server_close()
    engine.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
