"""serve.engine_client (floor 3): the engine child over docs/PROTOCOL.md (process, slots, replicas, supervisor)."""
