"""What one generation request did: tokens, time, time to first token, and which path ran how
(the stats line the Generate panel and ``%nvkit generate`` show)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GenerationStats:
    """What one request did. Two rates, because a first request can spend seconds before its first
    token (the fast path's one-time capture) and then decode in milliseconds: one number for both
    would be either the wait or the speed, never the truth about the other."""
    prompt_tokens: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    time_to_first_token: float | None = None
    stopped: bool = False
    path: str = "generate"
    prompts_done: int = 0  # batch paths: prompts finished so far (for progress displays)
    detail: str = ""       # how the path ran (the fast path: FastDecoder.describe), or why the fast path was off
    prepared: str = ""     # where a first request's wait went when it prepared the fast path (graphs.Timings)

    @property
    def tokens_per_second(self) -> float:
        """New tokens over the whole request, first-token wait included."""
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Tokens after the first one over the time after it (None when there are none to time)."""
        if self.time_to_first_token is None:
            return None
        decode = self.seconds - self.time_to_first_token
        return (self.new_tokens - 1) / decode if self.new_tokens > 1 and decode > 0 else None

    @property
    def how(self) -> str:
        """The path, with how it ran where it can run several ways: "fast (fused step, ...)"."""
        return f"{self.path} ({self.detail})" if self.detail else self.path

    def __str__(self) -> str:
        ttft = f"{self.time_to_first_token * 1000:.0f} ms" if self.time_to_first_token is not None else "n/a"
        decode = self.decode_tokens_per_second
        after = f" · then {decode:.1f} tok/s decode" if decode is not None else ""
        return (f"{self.new_tokens} tokens in {self.seconds:.2f} s · {self.tokens_per_second:.1f} tok/s overall · "
                f"first token {ttft}{after} · {self.how}{' · stopped' if self.stopped else ''}"
                f"{f' · prepared first: {self.prepared}' if self.prepared else ''}")
