"""A rendered chat prompt and the writer that builds it, shared by every template family.

Contract: `PromptWriter` collects prompt text and the character spans of it that came from a client
(`user_text`: never parsed as special tokens, UPSTREAM §8.3); `Rendered` is what a template's render()
returns. serve/prompt/chatml.py (ChatML) and serve/prompt/llama3_gemma.py (Llama 3, Gemma) both build on these; this
module imports neither.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Rendered:
    text: str
    plain: list[tuple[int, int]] = field(default_factory=list)  # spans never parsed as special tokens
    thinking: bool = False   # the generation prompt opened a think block (the output starts in reasoning)


class PromptWriter:
    def __init__(self):
        self.parts: list[str] = []
        self.plain: list[tuple[int, int]] = []
        self.n = 0

    def raw(self, text: str) -> None:
        self.parts.append(text)
        self.n += len(text)

    def user_text(self, text: str) -> None:
        """Text that came from a client: never special tokens."""
        if text:
            self.plain.append((self.n, self.n + len(text)))
            self.raw(text)
