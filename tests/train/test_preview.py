"""nvkit.train.data.preview: rows as the model sees them, loss tokens marked, totals."""

from __future__ import annotations

import math

import pytest

from nvkit.errors import NvkitError
from nvkit.train import data as D


def test_prompt_response_rows_show_the_template_and_the_loss_tokens(s):
    data = [{"prompt": f"Question {i}?", "response": f"Answer {i}."} for i in range(10)]
    p = D.preview(data, s, seq_len=64, n=3, batch_size=4, grad_accum=2)
    examples, _ = D.tokenize(data, s.tokenizer, 64)
    assert [r.tokens for r in p.rows] == [len(e) for e in examples[:3]]
    r = p.rows[0]
    assert r.text == s.tokenizer.decode(examples[0].input_ids)  # exactly what the model reads
    assert "<|im_start|>" in r.text or "Question 0?" in r.text
    assert "⟦Answer 0." in r.marked and "⟦Question" not in r.marked
    assert r.target_tokens == sum(1 for t in examples[0].labels if t != D.IGNORE)
    t = p.totals
    assert t["rows"] == 10 and t["sequences"] == 10 and not t["packing"]
    assert t["steps_per_epoch"] == math.ceil(math.ceil(10 / 4) / 2) == 2
    assert t["tokens"] == sum(len(e) for e in examples) and t["too_long"] == 0
    text = str(p)
    assert "10 prompt-response rows" in text and "2 steps per epoch" in text and "⟦" in text
    assert p.to_frame().shape[0] == 3


def test_text_rows_pack_and_too_long_rows_are_flagged_not_raised(s):
    data = ["GPUs are fast."] * 12 + ["word " * 200]
    p = D.preview(data, s.tokenizer, seq_len=64, n=0)
    assert p.rows == [] and p.totals["too_long"] == 1 and p.totals["packing"]
    assert p.totals["sequences"] < 12  # packed
    assert "longer than seq_len=64" in p.summary() and "Example 12" in p.summary()
    with pytest.raises(NvkitError, match="longer than seq_len"):
        D.tokenize(data, s.tokenizer, 64)  # what finetune would say


def test_html_is_escaped(s):
    p = D.preview([{"prompt": "<script>alert(1)</script>", "response": "<b>bold</b>"}], s, seq_len=64)
    h = p._repr_html_()
    assert "<script>" not in h and "&lt;script&gt;" in h and "<mark>&lt;b&gt;bold" in h


@pytest.mark.parametrize("kw, match", [
    (dict(tokenizer=42), "tokenizer"),
    (dict(seq_len=4), "seq_len"),
    (dict(n=-1), "n must"),
    (dict(batch_size=0), "batch_size"),
    (dict(packing="yes"), "packing"),
    (dict(data=[{"q": 1}]), "keys"),
])
def test_bad_input(s, kw, match):
    args = dict(data=["GPUs are fast."], tokenizer=s, seq_len=64)
    args.update(kw)
    with pytest.raises(NvkitError, match=match):
        D.preview(**args)
