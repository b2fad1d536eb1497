"""GET /v1/models/{id} as OpenAI answers it: the model's entry (by its id or an alias) on a one-model server and
over a Lifecycle's models (loaded or not); an unknown id is OpenAI's 404 `model_not_found`."""
from urllib.parse import quote


def test_one_model_by_id_and_unknown(server):
    s = server()
    status, listing, _ = s.request("GET", "/v1/models")
    entry = listing["data"][0]
    status, got, _ = s.request("GET", f"/v1/models/{quote(entry['id'])}")
    assert status == 200 and got == entry and got["object"] == "model"
    status, err, _ = s.request("GET", "/v1/models/gpt-nope")
    assert status == 404 and err["error"]["code"] == "model_not_found" and "gpt-nope" in err["error"]["message"]


def test_every_lifecycle_model_loaded_or_not(lifecycle_server):
    s = lifecycle_server(names=("alpha", "beta"))
    for name in ("alpha", "beta"):
        status, got, _ = s.request("GET", f"/v1/models/{name}")
        assert status == 200 and got["id"] == name, got
    assert s.request("GET", "/v1/models/gamma")[0] == 404
