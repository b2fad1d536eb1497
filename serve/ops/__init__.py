"""serve.ops (floor 3): figures the server keeps and shows (telemetry, live figures, metrics, Prometheus, llama views)."""
