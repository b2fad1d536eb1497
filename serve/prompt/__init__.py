"""serve.prompt (floor 3): messages -> prompt text (ChatML, Llama 3 / Gemma, the tool text, the writer)."""
