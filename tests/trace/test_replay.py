"""attnmem.trace.recorder.replay against the plain replay of every event through the
allocator (`_run`, as the replay was before it counted small-pool requests without the
allocator and took folded loops in closed form): the same peaks, starts and tensors alive at
each peak, on random streams with repeat events and on a recorded Mamba trace."""

from __future__ import annotations

import json
import random

import pytest

from attnmem.calc.allocator import K_SMALL_SIZE
from attnmem.trace.recorder import (
    PhasePeak,
    ReplayTooLong,
    _run,
    flat,
    replay,
    replay_cost,
)


def plain_replay(events: list, expandable: bool = False) -> dict[str, PhasePeak]:
    """The replay as it was: every event (repeats unrolled) through the allocator, the peaks
    found in one pass and what is alive there listed in a second."""
    evs = list(flat(events))
    phases: dict[str, PhasePeak] = {}
    where: dict[str, int] = {}
    cur = None
    for i, a, _ in _run(evs, expandable):
        ev = evs[i]
        if ev[0] == "m":
            if ev[1] not in phases:
                phases[ev[1]] = PhasePeak(ev[1], start=a.allocated)
            cur = phases[ev[1]]
            if ev[1] not in where or a.allocated > cur.peak:
                cur.peak, where[ev[1]] = a.allocated, i
        elif cur is not None and ev[0] == "a" and a.allocated > cur.peak:
            cur.peak, where[cur.name] = a.allocated, i
    wanted = {i: name for name, i in where.items()}
    for i, a, handles in _run(evs, expandable):
        if i in wanted:
            alive: dict[str, tuple[int, int]] = {}
            for h, label in handles.values():
                if h >= 0:
                    n, b = alive.get(label, (0, 0))
                    alive[label] = (n + 1, b + a.block_size(h))
            phases[wanted[i]].at_peak = alive
    return phases


def _same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for name in want:
        g, w = got[name], want[name]
        assert (g.peak, g.start, g.at_peak) == (w.peak, w.start, w.at_peak), name


def _size(rng: random.Random, large: bool) -> int:
    if large and rng.random() < 0.5:
        return rng.choice([K_SMALL_SIZE + 1, 3 << 20, 9 << 20, 12 << 20, 21 << 20]) \
            + rng.randrange(0, 1 << 20)
    return rng.choice([0, 1, 511, 512, 4096, 98_304, K_SMALL_SIZE - 1, K_SMALL_SIZE])


def _template(rng: random.Random, large: bool) -> tuple:
    """A loop iteration's events as loops.py normalizes them: allocations, frees of this
    iteration's (any order) and of the previous one's carried allocations (by position)."""
    k = rng.randrange(1, 6)
    fate = [rng.choice(["this", "prev", "kept"]) for _ in range(k)]
    out: list[tuple] = []
    for p in range(k):
        if fate[p] == "prev" and rng.random() < 0.7:  # the previous iteration's, freed first
            out.append(("f", "prev", p))
        out.append(("a", _size(rng, large), f"l{rng.randrange(3)}|op{p}"))
        if fate[p] == "this" and rng.random() < 0.5:
            out.append(("f", "this", p))
    for p in range(k):
        if fate[p] == "this" and ("f", "this", p) not in out:
            out.append(("f", "this", p))
        if fate[p] == "prev" and ("f", "prev", p) not in out:
            out.append(("f", "prev", p))
    return tuple(out)


def _stream(seed: int, large: bool) -> list:
    """Plain events and repeat events, as a trace with folded loops makes them: each repeat
    follows a real iteration of its template (the ids its first iteration's "prev" frees),
    and the last real iteration frees the last copy's carried tensors."""
    rng = random.Random(seed)
    events: list[tuple] = []
    live: list[int] = []
    nxt = 0
    for phase in ("prefill", "setup", "decode"):
        events.append(("m", phase))
        for _ in range(rng.randrange(3, 8)):
            for _ in range(rng.randrange(0, 6)):  # plain traffic
                if live and rng.random() < 0.4:
                    events.append(("f", live.pop(rng.randrange(len(live)))))
                else:
                    events.append(("a", nxt, _size(rng, large), f"x{rng.randrange(4)}|op"))
                    live.append(nxt)
                    nxt += 1
            tpl = _template(rng, large and rng.random() < 0.5)
            k = sum(1 for t in tpl if t[0] == "a")
            real = list(range(nxt, nxt + k))  # one real iteration
            nxt += k
            events += [("a", real[p], n, lab) for p, (_, n, lab) in
                       enumerate(t for t in tpl if t[0] == "a")]
            freed_now = {t[2] for t in tpl if t[0] == "f" and t[1] == "this"}
            events += [("f", real[p]) for p in sorted(freed_now)]
            copies = rng.randrange(1, 40)
            events.append(("r", tpl, copies, nxt, tuple(real)))
            last = range(nxt + (copies - 1) * k, nxt + copies * k)
            kept = [nxt + c * k + p for c in range(copies) for p in range(k)
                    if p not in freed_now and ("f", "prev", p) not in tpl]
            kept += [real[p] for p in range(k) if p not in freed_now
                     and ("f", "prev", p) not in tpl]
            nxt += copies * k
            carried = [last[t[2]] for t in tpl if t[0] == "f" and t[1] == "prev"]
            rng.shuffle(kept)
            events += [("f", x) for x in carried]
            live += kept
    return events


@pytest.mark.parametrize("expandable", [False, True])
@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_replay_equals_the_plain_replay_on_random_streams(seed: int, large: bool,
                                                          expandable: bool) -> None:
    events = _stream(seed, large)
    assert any(ev[0] == "r" for ev in events)
    _same(replay(events, expandable), plain_replay(events, expandable))


def test_a_closed_form_repeat_keeps_its_peak_at_the_last_copy() -> None:
    """A loop keeping one 1,024 B tensor per iteration among a 4 KiB transient: its peak is
    the last copy's transient on top of every kept tensor, and all kept tensors are listed."""
    tpl = (("f", "prev", 0), ("a", 4096, "t|mul"), ("a", 1024, "k|mm"))
    events = [("m", "p"), ("a", 0, 4096, "t|mul"), ("a", 1, 1024, "k|mm"),
              ("r", tpl, 100, 2, (0, 1)), ("f", 2 + 99 * 2)]
    got = replay(events)["p"]
    assert got.peak == 4096 + 101 * 1024
    assert got.at_peak == {"t|mul": (1, 4096), "k|mm": (101, 101 * 1024)}
    _same(replay(events), plain_replay(events))
    # the closed form costs its template twice and one step per tensor it leaves alive
    assert replay_cost(events) == 3 + 2 * 3 + 99 + 1 + 1


def test_a_replay_past_its_limit_is_refused_by_its_count() -> None:
    """Folded loops can leave millions of events: the replay counts its steps before it
    starts and refuses past its limit, naming both; without a limit the same events replay."""
    events = [("m", "prefill")]
    for i in range(40_000):
        events += [("a", i, 4 << 20, "x|op")] + ([("f", i - 1)] if i else [])
    assert replay_cost(events) == 80_000
    with pytest.raises(ReplayTooLong, match=r"takes 80,000 steps, past the 79,999"):
        replay(events, limit=79_999)
    assert replay(events, limit=80_000)["prefill"].peak == 2 * (4 << 20)


def test_a_folded_mamba_trace_replays_as_the_full_trace(monkeypatch) -> None:
    """Mamba's selective scan, folded (one repeat event per layer and forward, its per-token
    outputs kept in a list) and replayed, at batch 1 (small-pool transients: closed form) and
    batch 12 (large-pool transients: iteration by iteration), gives what the loop run in full
    (every token's ops on meta) gives through the plain replay: peaks, starts, and the
    tensors alive at each peak."""
    transformers = pytest.importorskip("transformers")
    import attnmem.trace.loops as loops
    from attnmem.trace.inference import record

    cfg = transformers.MambaConfig(hidden_size=256, num_hidden_layers=2, vocab_size=101,
                                   pad_token_id=None)
    text = json.dumps({**cfg.to_dict(), "architectures": ["MambaForCausalLM"]}, sort_keys=True)
    for b in (1, 12):
        folded = record(text, b, 300, 3, "eager", "bf16").events
        with monkeypatch.context() as m:
            m.setattr(loops, "FOLD_MIN", 10**9)
            full = record(text, b, 300, 3, "eager", "bf16").events
        assert sum(ev[0] == "r" for ev in folded) >= 2
        assert not any(ev[0] == "r" for ev in full)
        assert len(full) > 3 * len(folded)
        _same(replay(folded), plain_replay(full))
