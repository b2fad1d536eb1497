"""serve.generation (floor 4): a prepared request -> events (Service, passes, output and tool-call parsers, grammar)."""
