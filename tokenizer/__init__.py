"""tokenizer (floor 0): the GGUF's text side (BPE, SentencePiece, vocab, prompt encoder); imports nothing of ours."""
