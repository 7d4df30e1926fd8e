"""attnmem.calc.AttentionCall: one attention call validated once and passed down through attnmem.calc.peak,
attnmem.calc.fit, attnmem.calc.sweep and attnmem.calc.context_parallel; and attnmem.calc.allocator.TensorReplay, the one
replay of labelled tensors both attnmem.calc.peak and attnmem.calc.context_parallel run."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import attnmem.calc
import attnmem.calc.attention_call
from attnmem.calc import AttentionCall
from attnmem.calc.allocator import CachingAllocator, TensorReplay

ROOT = Path(__file__).resolve().parents[2]

CALLS = [
    ("triton", 1, 32, 8192, 128, "bf16", True, True, 8),
    ("sdpa_flash", 2, 16, 3000, 64, "fp16", False, True, None),
    ("naive", 1, 8, 1000, 80, "fp32", True, False, 2),
    ("sdpa_efficient", 1, 32, 4096, 128, "bfloat16", False, True, 8),
    ("fa4", 1, 32, 16384, 128, "bf16", True, True, None),
]


@pytest.mark.parametrize("args", CALLS)
def test_a_call_gives_the_numbers_its_arguments_give(args: tuple) -> None:
    call = AttentionCall(*args)
    for fn in (attnmem.calc.attention_peak_bytes, attnmem.calc.attention_peak_terms,
               attnmem.calc.attention_peak_breakdown, attnmem.calc.attention_reserved_bytes):
        assert fn(call) == fn(*args), fn.__name__
        assert fn(call, expandable=True) == fn(*args, expandable=True), fn.__name__
    impl, b, h, _, d, dtype, causal, bw, kv = args
    assert attnmem.calc.max_seq_len(call, 40 * attnmem.calc.GIB) == attnmem.calc.max_seq_len(
        impl, 40 * attnmem.calc.GIB, b, h, d, dtype, causal, bw, kv)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_ring_takes_a_call_too(world_size: int) -> None:
    args = ("triton", 1, 32, 65536, 128, "bf16", True, True)
    call = AttentionCall(*args, kv_heads=8)
    assert attnmem.calc.context_parallel_peak_bytes(call, world_size=world_size) == \
        attnmem.calc.context_parallel_peak_bytes(*args, world_size, 8)
    assert attnmem.calc.context_parallel_memory(call, world_size=world_size, rank=0) == \
        attnmem.calc.context_parallel_memory(*args, world_size, 8, rank=0)
    assert attnmem.calc.context_parallel_terms(call, world_size=world_size) == \
        attnmem.calc.context_parallel_terms(*args, world_size, 8)


def test_the_call_is_canonical_and_frozen() -> None:
    call = AttentionCall("triton", 1.0, 32, 4096.0, 128, "bfloat16", kv_heads=8.0)
    assert (call.batch, call.seq_len, call.dtype, call.kv_heads) == (1, 4096, "bf16", 8)
    assert call == AttentionCall("triton", 1, 32, 4096, 128, "bf16", kv_heads=8)
    assert (call.b, call.h, call.h_kv, call.s, call.d, call.e) == (1, 32, 8, 4096, 128, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.seq_len = 1  # type: ignore[misc]
    assert call.with_seq_len(100) == dataclasses.replace(call, seq_len=100)


@pytest.mark.parametrize("kw, named", [
    ({"impl": "flash3"}, "unknown implementation 'flash3'"),
    ({"batch": 0}, "batch must be a whole number from 1"),
    ({"heads": 2.5}, "heads must be a whole number"),
    ({"seq_len": -1}, "seq_len must be a whole number from 1"),
    ({"head_dim": None}, "head_dim must be a whole number"),
    ({"dtype": "fp12"}, "fp12"),
    ({"impl": "sdpa_flash", "dtype": "fp32"}, "sdpa_flash does not run fp32 inputs"),
    ({"causal": 1}, "causal must be True or False"),
    ({"backward": "yes"}, "backward must be True or False"),
    ({"kv_heads": 3}, "must be a multiple of kv_heads"),
    ({"kv_heads": 64}, "kv_heads must be a whole number from 1 to 32"),
])
def test_a_bad_value_is_named_when_the_call_is_made(kw: dict, named: str) -> None:
    args = dict(impl="triton", batch=1, heads=32, seq_len=4096, head_dim=128, dtype="bf16")
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(".", r"\.")):
        AttentionCall(**{**args, **kw})
    with pytest.raises(ValueError, match="seq_len must be a whole number"):
        AttentionCall(**args).with_seq_len(0)


def test_a_call_and_separate_arguments_are_not_both_taken() -> None:
    call = AttentionCall("triton", 1, 32, 4096, 128, "bf16")
    with pytest.raises(ValueError, match=r"either an AttentionCall or .* got .*'seq_len': 8"):
        attnmem.calc.attention_peak_bytes(call, seq_len=8)
    with pytest.raises(ValueError, match="not both"):
        attnmem.calc.context_parallel_peak_bytes(call, 1, world_size=2)


def test_a_search_checks_the_call_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """max_seq_len and sweep_seq_len check the shape once; each step checks the new length
    only (the call is passed down, not rebuilt from its arguments)."""
    checked: list[str] = []
    real = attnmem.calc.attention_call.check_int

    def counting(name, value, lo=1, hi=None):
        checked.append(name)
        return real(name, value, lo, hi)

    monkeypatch.setattr(attnmem.calc.attention_call, "check_int", counting)
    attnmem.calc.attention_call._call_lru.cache_clear()  # a remembered call would not be checked at all
    shape_names = {"batch", "heads", "head_dim", "kv_heads"}  # not the per-call options
    got = attnmem.calc.max_seq_len("sdpa_cudnn", 20 * attnmem.calc.GIB, 3, 24, 96, "fp16", True, True, 6)
    assert got > 0
    assert sorted(n for n in checked if n in shape_names) == [
        "batch", "head_dim", "heads", "kv_heads"], checked
    assert checked.count("seq_len") > 10  # one per step of the search
    checked.clear()
    attnmem.calc.attention_call._call_lru.cache_clear()
    attnmem.calc.sweep_seq_len(["triton", "naive"], [128, 256, 512], 5, 24, 96, "fp16", kv_heads=6)
    assert sorted(n for n in checked if n in shape_names) == [
        "batch", "batch", "head_dim", "head_dim", "heads", "heads", "kv_heads", "kv_heads"]


# --- one shape class, one replay ------------------------------------------------------------

def test_calc_has_one_call_shape_and_one_replay() -> None:
    """No second call-shape class beside AttentionCall (attnmem.calc.inference_step's sizes are a
    model's, _StepDims), and one replay class (TensorReplay, with peak's record of a
    replay's result)."""
    found: dict[str, set[str]] = {"shape": set(), "replay": set()}
    for path in sorted((ROOT / "attnmem" / "calc").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for word, names in found.items():
                if isinstance(node, ast.ClassDef) and word in node.name.lower():
                    names.add(f"{path.name}:{node.name}")
    assert found["shape"] == set(), found
    assert found["replay"] == {"allocator.py:TensorReplay", "peak.py:_ReplayResult"}, found


def test_tensor_replay_counts_blocks_above_its_start_and_keeps_the_peak_set() -> None:
    a = CachingAllocator(expandable=True)
    a.malloc(10_000)  # there before: not counted
    rp = TensorReplay(a)
    rp.alloc("x", "x", 1000)  # 1,024 B block
    rp.alloc("y", "y and z", 100, 0)  # 512 B; a size 0 allocates nothing
    rp.free("x")
    rp.alloc("w", "w", 600)  # 1,024 B: 1,536 B live again, not above the peak
    assert rp.peak == 1536
    assert rp.at_peak == [("x", 1000, 1024, 1), ("y and z", 100, 512, 1)]
    rp.alloc("v", "v", 1)
    assert rp.peak == 2048
    rp.rename("y", "y2", label="renamed")  # moves to the end
    rp.relabel("w", "w2")  # stays in place
    assert [(k, v[0]) for k, v in rp.alive.items()] == [
        ("w", "w2"), ("v", "v"), ("y2", "renamed")]
    with pytest.raises(AssertionError, match="allocated twice"):
        rp.alloc("v", "v", 1)
    rp.free("w", "v", "y2")
    assert a.allocated == 10_240


@pytest.mark.parametrize("impl, kv_heads", [("triton", 2), ("triton", 8), ("sdpa_flash", 8),
                                             ("sdpa_efficient", 8), ("sdpa_cudnn", 8)])
@pytest.mark.parametrize("causal", [False, True])
def test_the_rings_replay_is_the_expandable_allocators(monkeypatch: pytest.MonkeyPatch,
                                                       impl: str, kv_heads: int,
                                                       causal: bool) -> None:
    """TensorReplay without an allocator (what the ring uses) gives the peak and the tensors
    at the peak that a CachingAllocator with expandable segments gives, rank by rank."""
    import attnmem.calc.context_parallel as cp

    call = AttentionCall(impl, 1, 8, 6 * 1024 + 96, 72, "bf16", causal, True, kv_heads)
    fast = {r: cp._replay(call, 6, r) for r in range(6)}
    monkeypatch.setattr(cp, "TensorReplay",
                        lambda: TensorReplay(CachingAllocator(expandable=True)))
    for r in range(6):
        slow = cp._replay(call, 6, r)
        assert (slow.peak, slow.at_peak) == (fast[r].peak, fast[r].at_peak), r


def test_tensor_replay_without_an_allocator_rounds_each_tensor() -> None:
    rp = TensorReplay()
    rp.alloc("x", "x", 1000, 1)
    rp.alloc("y", "y", 0)
    rp.free("x")
    rp.alloc("z", "z", 513)
    assert (rp.peak, rp.at_peak, rp.allocated) == (1536, [("x", 1001, 1536, 2)], 1024)


def test_the_ring_counts_with_the_allocators_rounding(monkeypatch: pytest.MonkeyPatch) -> None:
    """attnmem.calc.context_parallel counts its tensors with attnmem.calc.allocator's rule (a different
    rounding there changes the ring's numbers)."""
    import attnmem.calc.allocator as allocator
    import attnmem.calc.context_parallel as cp

    args = ("triton", 1, 3, 8000, 40, "bf16", True, True, 4)  # sizes not multiples of 4 kB
    before = cp.context_parallel_peak_bytes(*args)
    monkeypatch.setattr(allocator, "round_size", lambda n: 4096 * -(-n // 4096))
    assert cp.context_parallel_peak_bytes(*args) != before
