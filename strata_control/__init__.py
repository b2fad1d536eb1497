"""strata_control: the decisions made before anything runs. Pure functions: no HTTP, no processes.

- `models`: which models this machine has (the default, `--model`, the models folders), from GGUF metadata.
- `runconfig`: run configs (`strata-<model>.json`), the one key table, the merge card -> config -> flags.
- `plan`: launch plans (threads, context that fits, KV type, lanes, replicas), each decision with its reason.
- `activity`: the activity records of running servers (`strata ps`).
"""
