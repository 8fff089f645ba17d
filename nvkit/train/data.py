"""Training data for ``nvkit.finetune``: read, check, tokenize, pack, batch.

Accepted shapes (a list, or a local .jsonl/.json/.csv/.txt file holding them):
- plain strings (or ``{"text": ...}``): loss on every token;
- ``{"prompt": ..., "response": ...}``: rendered with the chat template when the tokenizer has one
  (as a user turn and an assistant turn), plain ``prompt + response`` otherwise; loss on the response;
- chat messages (``{"messages": [...]}`` or a bare list of ``{"role", "content"}``): rendered with the
  chat template; loss on the assistant turns.

Everything is checked before training starts, so a typo in a key fails in a second instead of after
the model has been prepared. Batches are right-padded: under causal attention a pad at the end never
influences an earlier token, so no attention mask is needed and SDPA/FlashAttention keep their
fast causal path.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass

from ..errors import NvkitError, require

IGNORE = -100
_ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


# --- reading -------------------------------------------------------------------------------------

class Rows(list):
    """The raw examples, and where each came from when they were read from a file (so an error
    names the file and the line)."""

    def __init__(self, items=(), source: str | None = None, lines: list | None = None):
        super().__init__(items)
        self.source = source
        self.lines = lines

    def where(self, i: int) -> str:
        """'Example i', with the file and line (or item) when known."""
        if self.source is None:
            return f"Example {i}"
        if self.lines is not None and i < len(self.lines):
            return f"Example {i} ({self.source}, line {self.lines[i]})"
        return f"Example {i} ({self.source}, item {i})"


def read(data) -> Rows:
    """The raw examples from a list or a local file (no tokenization yet)."""
    if isinstance(data, Rows):
        return data
    if isinstance(data, (str, os.PathLike)):
        return _read_file(os.fspath(data))
    if isinstance(data, tuple):
        data = list(data)
    require(isinstance(data, list),
            f"data must be a list of examples or a path to a local .jsonl/.json/.csv/.txt file, not {type(data).__name__}.")
    require(len(data) > 0, "data is empty: give at least one example, e.g. ['NVIDIA GPUs are fast.'] or "
                           "[{'prompt': 'Hi', 'response': 'Hello!'}].")
    return Rows(data)


def _read_csv(f, path: str, delimiter: str) -> Rows:
    """A CSV/TSV file with a header row. A row with more or fewer fields than the header is refused
    (csv.DictReader would silently drop the extra text or fill None)."""
    name = "tab" if delimiter == "\t" else "comma"
    reader = csv.reader(f, delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        raise NvkitError(f"{path} is empty: a CSV file needs a header row (e.g. prompt,response) and one example "
                         "per row.") from None
    except csv.Error as e:
        raise NvkitError(f"{path}, line 1: not a valid CSV header ({e}).") from e
    header = [h.strip() for h in header]
    if not header or any(not h for h in header) or len(set(header)) != len(header):
        raise NvkitError(f"{path}, line 1: the header {header} must name each column once (e.g. prompt,response or "
                         "text).")
    rows, lines = [], []
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise NvkitError(f"{path}, line {reader.line_num}: not valid CSV ({e}). Put a value that holds quotes or "
                             "line breaks in double quotes, with inner quotes doubled (\"say \"\"hi\"\"\").") from e
        if not fields or all(not x.strip() for x in fields):
            continue
        if len(fields) != len(header):
            fix = (f"a value that holds a {name} must be in double quotes, e.g. \"GPUs are fast, and cheap\""
                   if len(fields) > len(header) else "fill in every column (an empty value must still have its separator)")
            raise NvkitError(f"{path}, line {reader.line_num}: {len(fields)} fields but the header has {len(header)} "
                             f"({delimiter.join(header) if delimiter != chr(9) else ', '.join(header)}): {fix}.")
        rows.append(dict(zip(header, fields)))
        lines.append(reader.line_num)
    return Rows(rows, os.path.basename(path), lines)


def _too_deep(where: str) -> str:
    # Python's json parser recurses once per level: a file nested deeper than the interpreter's
    # stack raises RecursionError, which is no answer to give about a data file.
    return (f"{where}: the JSON is nested too deeply to read (lists or objects inside each other thousands of "
            "levels down). An example is a string, {'text'}, {'prompt','response'} or {'messages'}: fix the file.")


def _read_file(path: str) -> Rows:
    p = os.path.expanduser(path)
    if not os.path.isfile(p):
        raise NvkitError(f"data file {path!r} not found. Give a local .jsonl, .json, .csv or .txt file, or a list of examples.")
    ext = os.path.splitext(p)[1].lower()
    base = os.path.basename(p)
    try:
        with open(p, encoding="utf-8", newline="" if ext in (".csv", ".tsv") else None) as f:
            if ext in (".jsonl", ".ndjson"):
                items, lines = [], []
                for i, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            items.append(json.loads(line))
                        except json.JSONDecodeError as e:
                            raise NvkitError(f"{path}, line {i}: not valid JSON ({e.msg}). Each line must be one JSON "
                                             "example: a string, {'text'}, {'prompt','response'} or {'messages'}.") from e
                        except RecursionError as e:
                            raise NvkitError(_too_deep(f"{path}, line {i}")) from e
                        lines.append(i)
                rows = Rows(items, base, lines)
            elif ext == ".json":
                try:
                    items = json.load(f)
                except json.JSONDecodeError as e:
                    raise NvkitError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}).") from e
                except RecursionError as e:
                    raise NvkitError(_too_deep(path)) from e
                require(isinstance(items, list), f"{path} must hold a JSON list of examples, not a {type(items).__name__}.")
                rows = Rows(items, base)
            elif ext in (".csv", ".tsv"):
                rows = _read_csv(f, path, "\t" if ext == ".tsv" else ",")
            elif ext in (".txt", ".text", ".md", ""):
                # One example per paragraph (blank-line separated) keeps multi-line examples whole.
                items, lines, block, start = [], [], [], 0
                for i, line in enumerate(f.read().split("\n"), 1):
                    if line.strip():
                        if not block:
                            start = i
                        block.append(line)
                    elif block:
                        items.append("\n".join(block).strip())
                        lines.append(start)
                        block = []
                if block:
                    items.append("\n".join(block).strip())
                    lines.append(start)
                rows = Rows(items, base, lines)
            else:
                raise NvkitError(f"Unsupported data file type {ext!r} ({path}). Use .jsonl, .json, .csv or .txt.")
    except UnicodeDecodeError as e:
        raise NvkitError(f"{path} is not UTF-8 text: {e}. Save it as UTF-8.") from e
    require(len(rows) > 0, f"{path} holds no examples.")
    return rows


def kind_of(data) -> str:
    """'text', 'prompt-response' or 'chat' (by the first example; mixing is checked later)."""
    rows = read(data)
    return _kind(rows[0], rows.where(0))


def _kind(ex, where: str) -> str:
    if isinstance(ex, str):
        return "text"
    if isinstance(ex, list):
        return "chat"
    if isinstance(ex, dict):
        keys = set(ex)
        if "messages" in keys:
            return "chat"
        if {"prompt", "response"} <= keys:
            return "prompt-response"
        if "text" in keys:
            return "text"
        raise NvkitError(f"{where} has keys {sorted(map(str, keys))}; expected 'text', 'prompt' and 'response', or "
                         "'messages' (a list of {'role', 'content'}).")
    raise NvkitError(f"{where} is a {type(ex).__name__}; expected a string, a dict with 'text', "
                     "'prompt'/'response' or 'messages', or a list of chat messages.")


# --- tokenizing ----------------------------------------------------------------------------------

def _text(value, where: str, key: str) -> str:
    if not isinstance(value, str):
        raise NvkitError(f"{where}: {key!r} must be a string, not {type(value).__name__}.")
    if not value.strip():
        raise NvkitError(f"{where}: {key!r} is empty. Fill it in or drop the example.")
    return value


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _eos(tokenizer) -> list[int]:
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []


def _messages(ex, where: str) -> list[dict]:
    msgs = ex["messages"] if isinstance(ex, dict) else ex
    require(isinstance(msgs, list) and msgs, f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}}.")
    for j, m in enumerate(msgs):
        require(isinstance(m, dict) and "role" in m and "content" in m,
                f"{where}, message {j}: each message needs 'role' and 'content', got {m!r:.80}.")
        require(m["role"] in _ROLES, f"{where}, message {j}: role {m['role']!r} is not one of {', '.join(_ROLES)}.")
        _text(m["content"], where, f"messages[{j}].content")
    require(any(m["role"] == "assistant" for m in msgs),
            f"{where} has no assistant message: there is nothing to learn (loss is on the assistant turns).")
    return msgs


def _chat_example(tokenizer, msgs: list[dict]) -> Example:
    """Render with the chat template, one turn at a time, so that the tokens of each assistant turn
    are known exactly and only they get labels."""
    ids: list[int] = []
    labels: list[int] = []
    rendered = ""
    for j, m in enumerate(msgs):
        if m["role"] == "assistant":
            prefix = tokenizer.apply_chat_template(msgs[:j], add_generation_prompt=True, tokenize=False)
            full = tokenizer.apply_chat_template(msgs[:j + 1], tokenize=False)
            # the generation prompt is context, the assistant text (and its end-of-turn) is the target
            ctx, target = prefix[len(rendered):], full[len(prefix):]
            c, t = _encode(tokenizer, ctx), _encode(tokenizer, target)
            ids += c + t
            labels += [IGNORE] * len(c) + t
            rendered = full
    tail = tokenizer.apply_chat_template(msgs, tokenize=False)[len(rendered):]
    if tail:
        c = _encode(tokenizer, tail)
        ids += c
        labels += [IGNORE] * len(c)
    return Example(ids, labels)


def encode(ex, where: str, kind: str, tokenizer) -> Example:
    """One raw example as the model sees it: token ids and labels (IGNORE where no loss)."""
    k = _kind(ex, where)
    if k != kind:
        raise NvkitError(f"{where} is {k} but the first example is {kind}: use one kind of example per run.")
    if k == "text":
        text = _text(ex if isinstance(ex, str) else ex["text"], where, "text")
        ids = _encode(tokenizer, text) + _eos(tokenizer)
        e = Example(ids, list(ids))
    elif k == "prompt-response":
        prompt, response = _text(ex["prompt"], where, "prompt"), _text(ex["response"], where, "response")
        if getattr(tokenizer, "chat_template", None):
            e = _chat_example(tokenizer, [{"role": "user", "content": prompt},
                                          {"role": "assistant", "content": response}])
        else:
            p, r = _encode(tokenizer, prompt), _encode(tokenizer, response) + _eos(tokenizer)
            e = Example(p + r, [IGNORE] * len(p) + r)
    else:
        if not getattr(tokenizer, "chat_template", None):
            raise NvkitError("Chat examples need a tokenizer with a chat template, and this one has none. "
                             "Use {'prompt', 'response'} or plain text examples instead.")
        e = _chat_example(tokenizer, _messages(ex, where))
    if len(e) < 2 or all(t == IGNORE for t in e.labels[1:]):
        raise NvkitError(f"{where} has nothing to learn from after tokenization (too short or no target tokens).")
    return e


def tokenize(data, tokenizer, seq_len: int) -> tuple[list[Example], str]:
    """Check and tokenize every example; returns (examples, kind). Raises NvkitError on the first
    bad one, naming it (with its file and line) and what to fix."""
    rows = read(data)
    kind = _kind(rows[0], rows.where(0))
    out: list[Example] = []
    too_long = []
    for i, ex in enumerate(rows):
        e = encode(ex, rows.where(i), kind, tokenizer)
        if len(e) > seq_len:
            too_long.append((i, len(e)))
        out.append(e)
    if too_long:
        worst = max(n for _, n in too_long)
        listed = ", ".join(f"#{i} ({n} tokens)" for i, n in too_long[:5]) + (" ..." if len(too_long) > 5 else "")
        raise NvkitError(f"{len(too_long)} example(s) are longer than seq_len={seq_len}: {listed}. "
                         f"Raise seq_len to at least {worst}, or shorten/split those examples.")
    return out, kind


def pack(examples: list[Example], seq_len: int) -> list[Example]:
    """Concatenate examples into blocks of at most seq_len tokens, in order, never splitting one.
    Fewer, fuller rows mean less padding (no wasted FLOPs); attention crosses example boundaries
    inside a block (each example ends with EOS), the usual trade-off of packing."""
    blocks: list[Example] = []
    cur = Example([], [])
    for e in examples:
        if len(cur) + len(e) > seq_len and len(cur):
            blocks.append(cur)
            cur = Example([], [])
        # An example's first token is not a target: predicting it from the previous example's
        # last token would teach the model an arbitrary order of examples.
        cur.labels += ([IGNORE] + e.labels[1:]) if len(cur) else list(e.labels)
        cur.input_ids += e.input_ids
    if len(cur):
        blocks.append(cur)
    return blocks


def batch_length(rows: list[Example], pad_to: int) -> int:
    """The length of the longest batch ``Collator(pad_to=pad_to)`` makes from ``rows``: the longest
    row, rounded up to a multiple of ``pad_to`` (unpacked examples make batches shorter than seq_len)."""
    n = max((len(r) for r in rows), default=0)
    return -(-n // pad_to) * pad_to


class Collator:
    """Right-pads a list of examples into (input_ids, labels) tensors; lengths are rounded up to a
    multiple of ``pad_to`` so compiled regions see few distinct shapes. Adds ``num_tokens`` (the
    real tokens in the batch, for tokens/s)."""

    def __init__(self, pad_id: int, pad_to: int = 8):
        self.pad_id = int(pad_id)
        self.pad_to = max(1, int(pad_to))

    def __call__(self, batch):
        import torch
        rows = [b if isinstance(b, Example) else Example(b["input_ids"], b["labels"]) for b in batch]
        n = batch_length(rows, self.pad_to)
        ids = torch.full((len(rows), n), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), n), IGNORE, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r.input_ids, dtype=torch.long)
            labels[i, :len(r)] = torch.tensor(r.labels, dtype=torch.long)
        return {"input_ids": ids, "labels": labels, "num_tokens": sum(len(r) for r in rows)}


class ListDataset:
    """A map-style dataset over examples (what Trainer's DataLoader needs)."""

    def __init__(self, examples: list[Example]):
        self.examples = examples

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]


def check_seq_len(seq_len) -> None:
    require(isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len >= 8,
            f"seq_len must be a whole number ≥ 8, not {seq_len!r}.")


def check_packing(packing) -> None:
    require(packing is True or packing is False or packing == "auto",
            f"packing must be True, False or 'auto', not {packing!r}.")


def _packing(packing, kind: str) -> bool:
    if packing == "auto" and not isinstance(packing, bool):
        # Supervised examples stay separate: packing them would let a response attend to an
        # unrelated earlier prompt.
        return kind == "text"
    require(isinstance(packing, bool), f"packing must be True, False or 'auto', not {packing!r}.")
    return packing


def arrange(examples: list[Example], kind: str, seq_len: int, packing) -> tuple[list[Example], dict]:
    """Tokenized examples → training rows (packed or not) and the facts for the run's info."""
    packing = _packing(packing, kind)
    rows = pack(examples, seq_len) if packing else list(examples)
    return rows, {"kind": kind, "examples": len(examples), "rows": len(rows),
                  "tokens": sum(len(e) for e in examples),
                  "target_tokens": sum(1 for e in examples for t in e.labels[1:] if t != IGNORE),
                  "packing": packing}


def prepare(data, tokenizer, seq_len: int, packing) -> tuple[list[Example], dict]:
    """tokenize + (optionally) pack; returns (rows, facts for the run's info)."""
    check_seq_len(seq_len)
    examples, kind = tokenize(data, tokenizer, seq_len)
    _packing(packing, kind)
    return arrange(examples, kind, seq_len, packing)


def split(examples: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, held out): ``fraction`` of the examples (at least one) drawn at random with
    ``seed``; both keep their original order."""
    require(isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0 < fraction < 1,
            f"eval_split must be a fraction in (0, 1), e.g. 0.05, not {fraction!r}.")
    n = len(examples)
    n_eval = max(1, round(n * fraction))
    require(n >= 2 and n_eval < n, f"eval_split={fraction} needs at least 2 examples and leaves none to train on "
                                   f"with {n}: give more data, a smaller eval_split, or eval_data=.")
    import random
    held = set(random.Random(seed).sample(range(n), n_eval))
    return [e for i, e in enumerate(examples) if i not in held], [e for i, e in enumerate(examples) if i in held]


def fingerprint(rows: list[Example]) -> str:
    """A short hash of the training rows (tokens and labels, in order): a resumed run checks it
    trains on the same data in the same arrangement."""
    import hashlib
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps([r.input_ids, r.labels], separators=(",", ":")).encode())
    return h.hexdigest()[:16]


def preview(data, tokenizer, seq_len: int = 512, n: int = 5, *, packing="auto", batch_size: int = 8,
            grad_accum: int = 1):
    """Each row as the model will see it, before paying for a run: the chat template applied,
    the token count, whether it is over ``seq_len`` (finetune refuses such rows), and which tokens
    carry the loss; plus totals (rows, tokens, packed sequences, steps per epoch). ``tokenizer``:
    a tokenizer or a Session. Returns a ``Preview`` (text with ``print``, highlighted HTML in a
    notebook, ``.rows``/``.totals``, ``.to_frame()``)."""
    from .preview import Preview, Row
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    require(callable(getattr(tok, "decode", None)) and callable(tok),
            f"preview needs a tokenizer (or a Session), not {type(tokenizer).__name__}.")
    check_seq_len(seq_len)
    require(isinstance(n, int) and not isinstance(n, bool) and n >= 0, f"n must be a whole number ≥ 0, not {n!r}.")
    for name, v in (("batch_size", batch_size), ("grad_accum", grad_accum)):
        require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, f"{name} must be a whole number ≥ 1, not {v!r}.")
    rows = read(data)
    kind = _kind(rows[0], rows.where(0))
    examples = [encode(ex, rows.where(i), kind, tok) for i, ex in enumerate(rows)]
    too_long = [i for i, e in enumerate(examples) if len(e) > seq_len]
    fitting = [e for e in examples if len(e) <= seq_len]
    train_rows, facts = arrange(fitting, kind, seq_len, packing)
    per_epoch = math.ceil(math.ceil(len(train_rows) / batch_size) / grad_accum) if train_rows else 0
    shown = []
    for i, e in enumerate(examples[:n]):
        segments, cur, cur_target = [], [], None
        for t, lab in zip(e.input_ids, e.labels):
            target = lab != IGNORE
            if cur and target != cur_target:
                segments.append((tok.decode(cur), cur_target))
                cur = []
            cur.append(t)
            cur_target = target
        if cur:
            segments.append((tok.decode(cur), cur_target))
        shown.append(Row(index=i, where=rows.where(i), tokens=len(e),
                         target_tokens=sum(1 for lab in e.labels if lab != IGNORE),
                         too_long=len(e) > seq_len, segments=segments))
    totals = {"kind": kind, "rows": len(examples), "tokens": sum(len(e) for e in examples),
              "target_tokens": sum(1 for e in examples for lab in e.labels if lab != IGNORE),
              "too_long": len(too_long), "longest": max(len(e) for e in examples),
              "packing": facts["packing"], "sequences": len(train_rows), "seq_len": seq_len,
              "batch_size": batch_size, "grad_accum": grad_accum, "steps_per_epoch": per_epoch}
    return Preview(shown, totals, [rows.where(i) for i in too_long])


def parse_examples(text: str) -> list:
    """Examples typed as text, one per line: a JSON object or string, or plain text (the Fine-tune
    panel's box and ``%%nvkit finetune``'s cell body)."""
    out = []
    for i, line in enumerate(text.splitlines()):
        line = line.strip()
        if not line:
            continue
        if line[0] in "{[\"":
            try:
                out.append(json.loads(line))
                continue
            except RecursionError as e:
                raise NvkitError(_too_deep(f"Line {i + 1}")) from e
            except ValueError as e:
                raise NvkitError(f"Line {i + 1} looks like JSON but does not parse ({e}). Fix it or drop the "
                                 "leading brace to use it as plain text.") from e
        out.append(line)
    if not out:
        raise NvkitError("No examples: write one per line (plain text or a JSON object such as "
                         '{"prompt": "...", "response": "..."}), or choose a file.')
    return out
