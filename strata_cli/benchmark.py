"""`strata bench`: prefill, decode and time to first token of a model on this machine, through a server,
with a facts block that is safe to paste into an issue.

Role: run a few requests against a Strata server (one started for the bench, or a running one), read the
engine's own figures from each reply's llama.cpp `timings`, and describe the machine: CPU, cores, RAM, OS,
Strata version, model, flags. `redact` removes the host name, the user name, home paths and API keys from
everything it prints (as upstream's bench facts do). Knows nothing of the engine's insides.

Public surface: `facts(model, flags, engine_info)`, `redact(value, secrets=())`, `run(server, model)`,
`render(report)`, `PROMPT_TOKENS_APPROX`, `DECODE_TOKENS`.
"""
from __future__ import annotations

import getpass
import os
import platform
import re
import socket
import statistics
import time

from strata_cli.client import Server

TTFT_RUNS = 3                 # short-prompt time to first token: the median of this many
PROMPT_TOKENS_APPROX = 1000   # the prefill prompt: about this many tokens of varied text
DECODE_TOKENS = 128           # tokens asked for in the decode run
REQUEST_TIMEOUT_S = 600.0     # one bench request on a slow machine
_FILLER = ("The river bends past the old mill where the miller's children once sold bread to travellers; "
           "in spring the water rises and the wheel turns faster. ")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
            m = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
        return m.group(1) if m else "?"
    except OSError:
        return "?"


def facts(model: dict, flags: dict, engine_info: dict | None = None) -> dict:
    from strata_control.plan import machine_facts
    m = machine_facts()
    info = engine_info or {}
    return {"cpu": _cpu_name(), "cores": m.cores, "physical_cores": m.physical_cores,
            "ram_mib": m.ram_bytes >> 20, "os": m.os, "python": platform.python_version(),
            "strata": _version(), "kernels": info.get("kernels"), "engine": info.get("engine"),
            "model": model, "flags": flags}


def redact(value, secrets=()):
    """`value` with the host name, the user name, home paths and the given secrets (API keys) replaced."""
    home = os.path.expanduser("~")
    user = getpass.getuser()
    host = socket.gethostname()
    keys = [s for s in (*secrets, os.environ.get("STRATA_API_KEY")) if s]

    def clean(text: str) -> str:
        for k in keys:
            text = text.replace(k, "<key>")
        if home and home != "/":
            text = text.replace(home, "~")
        if host:
            text = re.sub(rf"\b{re.escape(host)}\b", "<host>", text)
        if user:
            text = re.sub(rf"\b{re.escape(user)}\b", "<user>", text)
        return text

    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(str(k)): redact(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    return value


def _ttft_ms(server: Server, model, text: str) -> float:
    t0 = time.perf_counter()
    stream = server.chat_stream([{"role": "user", "content": text}], model, max_tokens=8, temperature=0)
    try:
        next(stream)
        return (time.perf_counter() - t0) * 1e3
    finally:
        stream.close()


def _timed(server: Server, model, text: str, max_tokens: int) -> dict:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0}
    if model:
        body["model"] = model
    status, reply = server.call("POST", "/v1/chat/completions", body, timeout_s=REQUEST_TIMEOUT_S)
    if status != 200:
        raise RuntimeError(f"the bench request failed ({status}): {reply}")
    return reply.get("timings") or {}


def run(server: Server, model: str | None = None) -> dict:
    """Warm up, then TTFT (median of TTFT_RUNS short questions), prefill (a ~1000-token prompt, one token
    out) and decode (DECODE_TOKENS out) -> figures. Each prompt starts with its own number, so no run reuses
    another's cached prefix."""
    stamp = int(time.time())
    _timed(server, model, f"{stamp} Say hello.", 4)
    ttft = [_ttft_ms(server, model, f"{stamp + i} What is {i} plus {i}?") for i in range(1, TTFT_RUNS + 1)]
    long_text = f"{stamp} " + _FILLER * max(1, PROMPT_TOKENS_APPROX // 28) + "Summarise this in one word."
    prefill = _timed(server, model, long_text, 1)
    decode = _timed(server, model, f"{stamp} Count from 1 to 500, separated by commas.", DECODE_TOKENS)
    return {"ttft_ms_median": round(statistics.median(ttft), 1), "ttft_ms": [round(x, 1) for x in ttft],
            "prefill_tokens": prefill.get("prompt_n"), "prefill_tok_s": _round(prefill.get("prompt_per_second")),
            "decode_tokens": decode.get("predicted_n"), "decode_tok_s": _round(decode.get("predicted_per_second"))}


def _round(x):
    return round(x, 1) if isinstance(x, (int, float)) else None


def render(report: dict) -> str:
    r, f = report["results"], report["facts"]
    lines = [f"strata bench: {f['model'].get('id')} ({f['model'].get('quant')}) on {f['cpu']}, "
             f"{f['physical_cores']} cores, {f['ram_mib']} MiB RAM, {f['os']}, kernels {f['kernels']}",
             f"  time to first token   {r['ttft_ms_median']} ms (median of {len(r['ttft_ms'])})",
             f"  prefill               {r['prefill_tok_s']} tok/s ({r['prefill_tokens']} tokens)",
             f"  decode                {r['decode_tok_s']} tok/s ({r['decode_tokens']} tokens)",
             f"  strata {f['strata']}, python {f['python']}, flags {f['flags']}"]
    return "\n".join(lines)
