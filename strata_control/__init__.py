"""strata_control: the decisions made before anything runs. Pure functions: no HTTP, no processes.

- `models`: which models this machine has (the default, `--model`, the models folders), from GGUF metadata.
- `runconfig`: run configs (`strata-<model>.json`), the one key table, the merge card -> config -> flags.
- `runconfig_file`: reading, mending and checking a run config file and the shared Chat settings beside it.
- `families`: the chat-template families Strata renders and the family detection.
- `plan`: launch plans (threads, context that fits, KV type, lanes, replicas), each decision with its reason.
- `activity`: the activity records of running servers (`strata ps`).
Floor 2: imports `tokenizer` and `serve.core` only (tests/test_import_graph.py).
"""
