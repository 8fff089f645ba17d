"""What one generation request did: tokens, time, time to first token, and which path ran how
(the stats line the Generate panel and ``%nvkit generate`` show)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    time_to_first_token: float | None = None
    stopped: bool = False
    path: str = "generate"
    prompts_done: int = 0  # batch paths: prompts finished so far (for progress displays)
    detail: str = ""       # how the path ran, where it can run several ways (the fast path: FastDecoder.describe)

    @property
    def tokens_per_second(self) -> float:
        decode = self.seconds - (self.time_to_first_token or 0.0)
        n = max(self.new_tokens - 1, 0)
        return n / decode if decode > 0 and n else (self.new_tokens / self.seconds if self.seconds else 0.0)

    @property
    def how(self) -> str:
        """The path, with how it ran where it can run several ways: "fast (fused step, ...)"."""
        return f"{self.path} ({self.detail})" if self.detail else self.path

    def __str__(self) -> str:
        ttft = f"{self.time_to_first_token * 1000:.0f} ms" if self.time_to_first_token is not None else "n/a"
        return (f"{self.new_tokens} tokens in {self.seconds:.2f} s · {self.tokens_per_second:.1f} tok/s · "
                f"first token {ttft} · {self.how}{' · stopped' if self.stopped else ''}")
