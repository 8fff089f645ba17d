"""Shared by the bad-input tests (tests/*/test_*_bad_input.py): a wrong value is refused with
``NvkitError`` carrying the words a user needs, and the demo session loaded for the file is still
the current one and still generates the same text afterwards."""

from __future__ import annotations

import pytest

from nvkit import NvkitError

PROMPT = "NVIDIA GPUs are"


class Survivor:
    """The demo session one test file shares, with its greedy continuation of PROMPT taken before
    any bad call (compared only with itself, in the same process)."""

    def __init__(self):
        import nvkit
        self.session = nvkit.load("demo")
        self.reply = self.session.generate(PROMPT, max_new_tokens=4)
        assert self.reply.strip()

    def check(self) -> None:
        import nvkit
        assert nvkit.session(required=False) is self.session, "the bad call replaced or dropped the session"
        assert self.session.generate(PROMPT, max_new_tokens=4) == self.reply

    def close(self) -> None:
        self.session.unload()


def refused(call, *words: str, survivor: Survivor | None = None) -> str:
    """Run ``call``; it must raise NvkitError whose message holds each of ``words``; then the
    survivor's session must still generate. Returns the message."""
    with pytest.raises(NvkitError) as e:
        call()
    msg = str(e.value)
    for w in words:
        assert w in msg, f"{w!r} is not in the message: {msg!r}"
    if survivor is not None:
        survivor.check()
    return msg
