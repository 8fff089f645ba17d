"""The batched fast path's host side on its own (``fast.schedule``, no torch): rows, pages,
refill before the last ids are read, what each replay's ids belong to, packing rows into a smaller
class, EOS / stop strings / max tokens, and the order results come back in."""

import pytest

from nvkit.generate.fast.schedule import SCRATCH, PagePool, Scheduler, Sequence, pages_for

K = 4
PAGE = 8


def _seqs(lengths, max_new):
    return [Sequence(i, [100 + i] * n, max_new) for i, n in enumerate(lengths)]


def _ids(snap, rows, step_ids):
    """A replay's read-back ids: row r gets [its start id] + step_ids(r, i) for i in 1..K."""
    return [[1000 * r] + [step_ids(r, i) for i in range(1, K + 1)] for r in range(rows)]


def test_page_pool_hands_out_low_ids_and_takes_them_back():
    pool = PagePool(6)  # page 0 is the scratch page: 5 to give
    a = pool.take(2)
    b = pool.take(3)
    assert a == [1, 2] and b == [3, 4, 5] and SCRATCH not in a + b
    assert pool.take(1) is None and pool.free == 0
    pool.give(a)
    assert pool.free == 2 and pool.take(2) == [1, 2]
    with pytest.raises(ValueError):
        PagePool(1)


def test_admission_fills_rows_in_order_while_pages_last():
    seqs = _seqs([5, 20, 3, 9], max_new=4)  # needs 2, 3, 1, 2 pages of 8
    sched = Scheduler(seqs, rows=4, pool_pages=1 + 5, page=PAGE, k=K)
    got = sched.admit()
    assert [s.index for s in got] == [0, 1]  # the third would fit, but order is kept: it waits its turn
    assert [s.row for s in got] == [0, 1] and sched.live == 2 and sched.top == 2
    assert all(len(s.pages) == pages_for(s.positions, PAGE) for s in got)
    assert not set(seqs[0].pages) & set(seqs[1].pages)
    with pytest.raises(ValueError, match="prompt 0"):
        Scheduler(_seqs([100], 4), rows=1, pool_pages=3, page=PAGE, k=K)


def test_a_row_is_refilled_as_soon_as_the_queued_replays_cover_its_tokens():
    """max_new = 6 with K = 4: a fresh row gets 1 + 4 tokens from its first replay and 4 more from
    the second, so once the second replay is queued its row and pages go to the next prompt, before
    either replay's ids are read; the ids still go to the sequence that ran them."""
    seqs = _seqs([3, 3, 3], max_new=6)
    sched = Scheduler(seqs, rows=2, pool_pages=1 + 2 * pages_for(9, PAGE), page=PAGE, k=K)
    first = sched.admit()
    s1 = sched.plan(2, {s.row for s in first})
    assert [s.planned for s in seqs] == [5, 5, 0]
    assert sched.release() == [] and sched.admit() == []  # nothing free yet
    s2 = sched.plan(2, set())
    assert [s.planned for s in seqs[:2]] == [9, 9]
    released = sched.release()
    assert released == seqs[:2] and not any(s.finished for s in seqs)  # released before being read
    refill = sched.admit()
    assert refill == [seqs[2]] and seqs[2].row == 0 and seqs[2].pages in ([1, 2], [3, 4])  # freed pages again
    assert sched.to_park == {1}  # row 1 has nothing to do: parked
    s3 = sched.plan(1, {0})
    # the replays are read now, in order; their ids belong to the sequences of their snapshots
    sched.take(s1, _ids(s1, 2, lambda r, i: 10 * r + i))
    assert seqs[0].tokens == [0, 1, 2, 3, 4] and seqs[1].tokens == [1000, 11, 12, 13, 14]
    done = sched.take(s2, _ids(s2, 2, lambda r, i: 50 + 10 * r + i))
    assert done == seqs[:2] and seqs[0].tokens == [0, 1, 2, 3, 4, 51] and len(seqs[1].tokens) == 6
    done = sched.take(s3, _ids(s3, 1, lambda r, i: 90 + i))
    assert done == [] and seqs[2].tokens == [0, 91, 92, 93, 94]  # row 0 is seqs[2] now: its first id is column 0
    assert not sched.done


def test_eos_and_stop_strings_end_a_sequence_and_free_its_row_at_the_next_queue():
    class Stops:  # a stop string that completes with id 7 (StopStrings' interface)
        def cut(self, tokens, checked):
            return next((i + 1 for i in range(checked, len(tokens)) if tokens[i] == 7), None)

    seqs = _seqs([2, 2, 2], max_new=50)
    seqs[1].stops = Stops()
    sched = Scheduler(seqs, rows=2, pool_pages=1 + 2 * pages_for(52, PAGE), page=PAGE, k=K, eos=[9])
    sched.admit()
    snap = sched.plan(2, {0, 1})
    ids = [[5, 6, 9, 6, 6], [5, 7, 6, 6, 6]]  # row 0 reaches EOS (kept), row 1 completes a stop string
    assert sched.take(snap, ids) == seqs[:2]
    assert seqs[0].tokens == [5, 6, 9] and seqs[1].tokens == [5, 7]
    assert [s.index for s in sched.release()] == [0, 1] and [s.row for s in sched.admit()] == [0]
    late = sched.take(snap, ids)  # a replay that was in flight: finished sequences take nothing more
    assert late == [] and seqs[0].tokens == [5, 6, 9]


def test_rows_pack_into_a_smaller_class_when_the_queue_is_empty():
    seqs = _seqs([2] * 8, max_new=30)
    sched = Scheduler(seqs, rows=8, pool_pages=1 + 8 * pages_for(32, PAGE), page=PAGE, k=K)
    sched.admit()
    for s in seqs:
        if s.index not in (1, 6):
            s.finished = True
    sched.release()
    assert sched.live == 2 and sched.top == 7
    moves = sched.compact(2)
    assert moves == [(6, 0)] and seqs[6].row == 0 and seqs[1].row == 1 and sched.top == 2
    assert 6 in sched.to_park and 0 not in sched.to_park
    snap = sched.plan(2, set())
    assert [(r, s.index) for r, s, _ in snap.rows] == [(0, 6), (1, 1)]


def test_every_prompt_runs_once_and_results_keep_input_order():
    """A whole request of mixed lengths through fewer rows than prompts, driven as the decoder
    drives it (two replays in flight, refills between): every sequence gets exactly its tokens,
    in its own order, and its pages are never shared with a sequence running at the same time."""
    import collections
    lengths = [3, 40, 1, 17, 9, 2, 33, 5, 12, 7]
    seqs = _seqs(lengths, max_new=11)
    rows = 4
    needs = sorted((pages_for(n + 11, PAGE) for n in lengths), reverse=True)
    sched = Scheduler(seqs, rows=rows, pool_pages=1 + sum(needs[:rows]), page=PAGE, k=K)
    pending = collections.deque()
    counter = collections.Counter()

    def ids_for(snap):
        out = [[0] * (K + 1) for _ in range(snap.batch)]
        for r, s, fresh in snap.rows:
            for i in range(K + 1):
                if fresh or i:
                    out[r][i] = 10_000 * s.index + counter[s.index]
                    counter[s.index] += 1
        return out

    while True:
        while len(pending) < 2:
            sched.release()
            new = sched.admit()
            held = [p for s in sched.rows if s is not None for p in s.pages]
            assert len(held) == len(set(held)) and SCRATCH not in held
            if sched.live == 0:
                break
            snap = sched.plan(sched.top, {s.row for s in new})
            pending.append((snap, ids_for(snap)))
        if not pending:
            break
        sched.take(*pending.popleft())
    assert sched.done and not sched.waiting
    for s in seqs:
        assert s.tokens == [10_000 * s.index + j for j in range(11)], s.index
