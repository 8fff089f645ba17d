"""The demo fine-tune's data: a lesson the demo model learns in a few CPU seconds and shows on
questions it never trained on.

The questions are the demo corpus's own chats (``corpus.CHATS``), so the model already answers
them; every answer in the lesson ends with one more sentence, ``SIGN_OFF``. A short LoRA run
teaches the habit, not the answers: asked a question held out of the training rows, the tuned
model gives the answer it gave before and then signs off, where the base model stops. The
Fine-tune panel's default examples are ``TRAIN``; tutorial 07 evaluates on ``HELD_OUT``.
"""

from __future__ import annotations

from .corpus import CHATS

SIGN_OFF = "Have fun with your GPUs."
# The steps and learning rate with which the demo model has learned the habit (the Fine-tune
# panel's defaults): fewer, or a lower rate, and the held-out answers do not change yet.
STEPS = 30
LEARNING_RATE = 1e-3

# asked after the run, never trained on
HELD_OUT_QUESTIONS = ("What is the KV cache?", "Why is my model slow on the CPU?", "What is FlashAttention?",
                      "How do I see GPU memory?", "What does bfloat16 mean?", "What is a token?")


def _taught(answer: str) -> str:
    return f"{answer} {SIGN_OFF}"


# "Thanks!" is answered with the sign-off already: it teaches nothing, and is in neither list
TRAIN = [{"prompt": q, "response": _taught(a)} for q, a in CHATS if q not in HELD_OUT_QUESTIONS and SIGN_OFF not in a]
HELD_OUT = [{"prompt": q, "response": _taught(a)} for q, a in CHATS if q in HELD_OUT_QUESTIONS]
