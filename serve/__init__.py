"""serve: the server, one floor per package; a package imports only from floors below it (tests/test_import_graph.py).

- floor 0 `tokenizer` (top-level package): the GGUF's text side (BPE, SentencePiece, vocab, prompt encoder).
- floor 1 `serve.core`: the one internal request (`events`), its values (`sampling`, `effort`), its errors.
- floor 2 `strata_control` (top-level package): models, run configs, launch plans, template families.
- floor 3 `serve.ops` figures and views, `serve.prompt` messages -> prompt text, `serve.engine_client` the engine child.
- floor 4 `serve.generation`: a prepared request -> events (Service, passes, parsers, guards, grammar).
- floor 5 `serve.lifecycle`: which model's Service runs (load on demand, unload idle, leases).
- floor 6 `serve.api`: one translator per dialect (openai, anthropic, responses, ollama, llama_routes) over `wire`.
- floor 7 `serve.http`: the shell (server, routes, views, guard, access, pacing, stream sessions, run).
- floor 8 `serve.bootstrap.paths`: where Strata's files are (engine, model files, private cache, logs).
- floor 9 `serve.bootstrap.options`: the server's options from flags over the run config.
- floor 10 `serve.bootstrap` (its `__init__.py`): the composition root (options -> engine, Service, Lifecycle, server).
- `serve/static/`: the web app (Chat, Monitor, About). Above all: `strata_cli` (the `strata` command), `tools/`.
"""
