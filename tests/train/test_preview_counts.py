"""Counts in the data preview read as English: "1 step per epoch", never "1 steps per epoch"."""

from nvkit.train.preview import Preview


def _totals(n: int) -> dict:
    return {"rows": n, "kind": "prompt-response", "tokens": n, "target_tokens": n, "too_long": n, "longest": 900,
            "packing": False, "sequences": n, "seq_len": 512, "steps_per_epoch": n, "batch_size": 8, "grad_accum": 1}


def test_one_of_each_is_singular():
    line = Preview([], _totals(1), ["Example 1"]).summary()
    assert "1 step per epoch" in line and "1 prompt-response row ·" in line and "1 token (1 carries loss)" in line
    assert "1 sequence (not packed)" in line and "\n1 row longer than seq_len=512" in line
    assert "1 steps" not in line and "1 sequences" not in line and "row(s)" not in line


def test_several_are_plural():
    line = Preview([], _totals(2), ["Example 1", "Example 2"]).summary()
    assert "2 steps per epoch" in line and "2 prompt-response rows" in line and "2 tokens (2 carry loss)" in line
    assert "2 sequences (not packed)" in line and "\n2 rows longer than seq_len=512" in line


def test_counted():
    from nvkit.units import counted
    assert counted(1, "step") == "1 step" and counted(0, "step") == "0 steps" and counted(3, "step") == "3 steps"
    assert counted(1, "process", "processes") == "1 process" and counted(2, "process", "processes") == "2 processes"
