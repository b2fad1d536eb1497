"""GET /props and GET /slots in llama-server's shapes: context, default sampling (card -> config -> shared
settings), slot count and per-slot state, the model check, and the dead-engine answer."""
import threading
import time

from tests.serve.conftest import chat

JSON = {"Content-Type": "application/json"}


def test_props_shape_and_defaults(server):
    s = server(config={"sampling": {"top_k": 20}})
    status, p, _ = s.request("GET", "/props")
    assert status == 200
    g = p["default_generation_settings"]
    assert g["n_ctx"] == 2048 and g["params"]["top_k"] == 20 and g["params"]["n_predict"] == 4096
    assert p["total_slots"] == 1 and p["model_alias"] == "fake-model" and p["modalities"] == {"vision": False}
    assert p["build_info"].startswith("Strata ")
    s.post("/settings", {"defaults": {"temperature": 0.7, "max_tokens": 99}}, headers=JSON)
    g = s.request("GET", "/props")[1]["default_generation_settings"]
    assert g["params"]["temperature"] == 0.7 and g["params"]["n_predict"] == 99 and g["params"]["top_k"] == 20
    assert s.request("GET", "/props?model=fake-model")[0] == 200
    status, err, _ = s.request("GET", "/props?model=other")
    assert status == 404 and "fake-model" in err["error"]["message"]


def test_props_when_the_engine_is_down(server):
    s = server()
    s.svc.engine.close()
    status, err, _ = s.request("GET", "/props")
    assert status == 503 and err["error"]["type"] == "unavailable_error"
    assert s.request("GET", "/slots")[1] == []


def test_slots_show_each_slot_and_who_works(slot_server):
    s = slot_server({"slots": 4, "repeat": 400, "step_delay_s": 0.003, "token_delay_s": 0.001})
    status, view, _ = s.request("GET", "/slots")
    assert status == 200 and [v["id"] for v in view] == [0, 1, 2, 3]
    assert not any(v["is_processing"] for v in view) and all(v["n_ctx"] == 8192 for v in view)
    t = threading.Thread(target=s.post, args=("/v1/chat/completions", chat("a long one", max_tokens=300)),
                         kwargs={"timeout": 60})
    t.start()
    seen = []
    for _ in range(200):
        seen = [v for v in s.request("GET", "/slots")[1] if v["is_processing"]]
        if seen:
            break
        time.sleep(0.02)
    assert len(seen) == 1 and seen[0]["n_prompt_tokens"] > 0
    t.join(60)
    assert s.request("GET", "/props")[1]["total_slots"] == 4
