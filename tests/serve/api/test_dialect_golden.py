"""Golden tests per dialect: a recorded request over a scripted fake engine -> the exact answer it gives.

Each case is one file in tests/data/dialects/NAME.json: `{"script", "method", "path", "body", "status",
"answer"}`. `answer` is the JSON body, or for a stream the list of its frames (`{"event"?, "data"}` for SSE,
one object per NDJSON line, `": comment"` for keep-alives). Values that change from run to run (ids, times,
durations, timings) are written as "*". `STRATA_UPDATE_GOLDEN=1` rewrites the files from what the server
answers now; read the diff before committing one.
"""
import json
import os

import pytest

GOLDEN_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "data", "dialects")
VOLATILE = {"id", "item_id", "call_id", "created", "created_at", "modified_at", "timings", "total_duration",
            "load_duration", "prompt_eval_duration", "eval_duration", "time_ms", "expires_at", "digest"}
CALL_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
CALL_TEXT = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
OLLAMA_TOOLS = [{"type": "function", "function": {k: v for k, v in CALL_TOOLS[0].items() if k != "type"}}]

CASES = {
    "responses_stream_text": ({"turns": [{"text": "Hi there."}]}, "POST", "/v1/responses",
                              {"model": "m", "input": "Hello", "stream": True}),
    "responses_json_text": ({"turns": [{"text": "Hi there."}]}, "POST", "/v1/responses",
                            {"model": "m", "input": "Hello", "instructions": "Be brief.", "max_output_tokens": 50}),
    "responses_stream_call": ({"turns": [{"text": CALL_TEXT}]}, "POST", "/v1/responses",
                              {"model": "m", "input": [{"role": "user", "content": "Weather in Paris?"}],
                               "tools": CALL_TOOLS, "stream": True}),
    "responses_stream_thinking_length": (
        {"turns": [{"text": "<think>Plan.</think>Answer is long"}]}, "POST", "/v1/responses",
        {"model": "m", "input": "Q", "stream": True, "max_output_tokens": 24}),
    "ollama_chat_stream": ({"turns": [{"text": "Hi there."}]}, "POST", "/api/chat",
                           {"model": "m", "messages": [{"role": "user", "content": "Hello"}],
                            "options": {"temperature": 0, "num_predict": 50}}),
    "ollama_chat_tools": ({"turns": [{"text": CALL_TEXT}]}, "POST", "/api/chat",
                          {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                           "tools": OLLAMA_TOOLS, "stream": False}),
    "ollama_generate_json": ({"turns": [{"text": "abcdefgh"}]}, "POST", "/api/generate",
                             {"model": "m", "prompt": "Say", "stream": False, "options": {"num_predict": 4}}),
    "llama_completion_stream": ({"turns": [{"text": "one two"}]}, "POST", "/completion",
                                {"prompt": "Count:", "n_predict": 16, "stream": True}),
    "llama_completion_json": ({"turns": [{"text": "one two STOP three"}]}, "POST", "/completion",
                              {"prompt": [67, 111, 117], "stop": ["STOP"], "seed": 3, "temperature": 0.5}),
}


def _blank(obj):
    if isinstance(obj, dict):
        return {k: ("*" if k in VOLATILE else _blank(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_blank(v) for v in obj]
    return obj


def _frames(text: str, content_type: str) -> list:
    if "ndjson" in content_type:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        if block.startswith(":"):
            out.append(block.strip())
            continue
        frame = {}
        for line in block.splitlines():
            key, _, value = line.partition(": ")
            frame[key] = json.loads(value) if key == "data" and value != "[DONE]" else value
        out.append(frame)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(server, name):
    script, method, path, body = CASES[name]
    s = server(script)
    c = s.conn()
    c.request(method, path, body=json.dumps(body))
    r = c.getresponse()
    status, ctype, raw = r.status, r.getheader("Content-Type") or "", r.read().decode()
    c.close()
    answer = json.loads(raw) if ctype == "application/json" else _frames(raw, ctype)
    got = {"script": script, "method": method, "path": path, "body": body, "status": status,
           "content_type": ctype, "answer": _blank(answer)}
    file = os.path.join(GOLDEN_DIR, name + ".json")
    if os.environ.get("STRATA_UPDATE_GOLDEN") == "1":
        with open(file, "w") as f:
            json.dump(got, f, indent=1, ensure_ascii=False)
            f.write("\n")
    with open(file) as f:
        want = json.load(f)
    assert got == want
