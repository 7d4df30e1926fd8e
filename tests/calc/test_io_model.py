"""attnmem.calc.io_model: HBM traffic counts (Dao et al. 2022, Theorem 2) and the explainer's tile schedule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmem.calc.io_model import (
    LSE_BYTES,
    example_scores,
    flash_io,
    floor_sum,
    kv_blocks_read,
    online_softmax_trace,
    softmax_row_stats,
    standard_io,
    theorem2_flash_elements,
    tile_onchip_bytes,
    tile_schedule,
)


def test_standard_io_counts_algorithm_0() -> None:
    # N = 4096, d = 128, fp16, B = 1, H = 32: (4·N·d + 4·N²)·2·32 bytes.
    io = standard_io(1, 32, 4096, 128, 2)
    n, d = 4096, 128
    assert io.total_bytes == (4 * n * d + 4 * n * n) * 2 * 32 == 4_429_185_024
    assert io.write_scores_bytes == io.read_scores_bytes == 2 * n * n * 2 * 32
    assert io.kv_passes == 1


def test_flash_io_reads_kv_once_per_query_block() -> None:
    n, d, bq = 4096, 128, 128
    io = flash_io(1, 1, n, d, 2, block_q=bq, block_k=64)
    t_r = math.ceil(n / bq)
    assert io.kv_passes == t_r == 32
    assert io.read_kv_bytes == 2 * t_r * n * d * 2
    assert io.read_q_bytes == n * d * 2
    assert io.write_out_bytes == n * d * 2 + n * LSE_BYTES
    assert io.read_scores_bytes == io.write_scores_bytes == 0


def test_flash_moves_less_and_grows_slower_than_standard() -> None:
    for n in (1024, 4096, 16384):
        assert flash_io(1, 8, n, 64, 2).total_bytes < standard_io(1, 8, n, 64, 2).total_bytes
    # Doubling N: standard ~×4 (N² term dominates), flash K/V traffic ×4 too but from a
    # much smaller base; their ratio approaches 4·N² / (2·N·d·N/B_r) = 2·B_r/d.
    big = 1 << 16
    ratio = standard_io(1, 1, big, 64, 2).total_bytes / flash_io(1, 1, big, 64, 2, 128, 64).total_bytes
    assert ratio == pytest.approx(2 * 128 / 64, rel=0.05)


def test_causal_skips_about_half_the_kv_reads() -> None:
    full = flash_io(1, 1, 4096, 64, 2, 128, 128, causal=False).read_kv_bytes
    causal = flash_io(1, 1, 4096, 64, 2, 128, 128, causal=True).read_kv_bytes
    t = 32
    assert causal / full == pytest.approx((t * (t + 1) / 2) / (t * t))


def test_theorem2_estimate_matches_the_count_for_the_papers_block_size() -> None:
    n, d, m = 8192, 64, 4 * 64 * 128  # M such that B_r = M / (4d) = 128
    counted = flash_io(1, 1, n, d, 1, block_q=128, block_k=128).read_kv_bytes  # 1 byte/elem
    assert counted == pytest.approx(theorem2_flash_elements(n, d, m))


def test_partial_last_block_counts_only_existing_rows() -> None:
    io = flash_io(1, 1, 100, 8, 1, block_q=64, block_k=64)
    assert io.kv_passes == 2 and io.read_kv_bytes == 2 * 2 * 100 * 8
    assert kv_blocks_read(100, 64, 64, causal=False) == 4
    assert kv_blocks_read(100, 64, 64, causal=True) == 3


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4096"])
def test_bad_shapes_raise_value_error(bad: object) -> None:
    with pytest.raises(ValueError, match="seq_len"):
        standard_io(1, 1, bad, 64, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        flash_io(1, 1, 64, 64, 2, block_q=bad)  # type: ignore[arg-type]


def test_tile_schedule_causal_skips_upper_triangle() -> None:
    tiles = tile_schedule(16, 4, 4, causal=True)
    assert len(tiles) == 16
    assert sum(t.skipped for t in tiles) == 6  # T(T-1)/2 for T = 4
    assert [t.step for t in tiles if not t.skipped] == list(range(10))
    assert all(t.diagonal == (t.qi == t.kj) for t in tiles if not t.skipped)
    assert not any(t.skipped for t in tile_schedule(16, 4, 4, causal=False))


def test_example_scores_are_deterministic() -> None:
    assert example_scores(8) == example_scores(8)
    assert len(example_scores(12)) == 12 and all(len(r) == 12 for r in example_scores(12))


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 24), bq=st.integers(1, 8), bk=st.integers(1, 8), causal=st.booleans())
def test_online_softmax_ends_at_the_true_max_and_denominator(n: int, bq: int, bk: int, causal: bool) -> None:
    scores = example_scores(n, seed=n + bq)
    trace = online_softmax_trace(scores, bq, bk, causal)
    final: dict[int, tuple[float, float]] = {}
    for state in trace:
        for r in state.rows:
            final[r.row] = (r.m, r.l)
            assert r.l >= 1.0 - 1e-12 or r.m == -math.inf  # the max term contributes exp(0) = 1
    for row, (m, s) in enumerate(softmax_row_stats(scores, causal)):
        assert final[row][0] == m
        assert final[row][1] == pytest.approx(s, rel=1e-12)
    assert len(trace) == sum(not t.skipped for t in tile_schedule(n, bq, bk, causal))


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 5000), bq=st.integers(1, 256), bk=st.integers(1, 256), causal=st.booleans())
def test_kv_block_count_matches_the_schedule(n: int, bq: int, bk: int, causal: bool) -> None:
    if math.ceil(n / bq) * math.ceil(n / bk) > 20_000:
        return
    tiles = tile_schedule(n, bq, bk, causal)
    assert kv_blocks_read(n, bq, bk, causal) == sum(not t.skipped for t in tiles)


def _kv_rows_loop(n: int, bq: int, bk: int, causal: bool) -> int:
    """Reference: the loop the closed form replaces."""
    total = 0
    for i in range(math.ceil(n / bq)):
        last = min(n, (i + 1) * bq) - 1
        visited = last // bk + 1 if causal else math.ceil(n / bk)
        total += min(n, visited * bk)
    return total


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 3000), bq=st.integers(1, 300), bk=st.integers(1, 300), causal=st.booleans())
def test_closed_form_kv_rows_match_the_loop(n: int, bq: int, bk: int, causal: bool) -> None:
    got = flash_io(1, 1, n, 1, 1, bq, bk, causal).read_kv_bytes
    assert got == 2 * _kv_rows_loop(n, bq, bk, causal)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 200), m=st.integers(1, 200), a=st.integers(0, 500), b=st.integers(0, 500))
def test_floor_sum_matches_brute_force(n: int, m: int, a: int, b: int) -> None:
    assert floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))


def test_huge_shapes_are_fast() -> None:
    import time

    t0 = time.perf_counter()
    io = flash_io(65_536, 100_000, 100_000_000, 65_536, 4, block_q=16, block_k=16, causal=True)
    assert kv_blocks_read(100_000_000, 16, 16, causal=True) == 6_250_000 * 6_250_001 // 2
    assert io.total_bytes > 0 and time.perf_counter() - t0 < 0.1


def test_tile_onchip_bytes() -> None:
    # B_r = 128, B_c = 64, d = 128, fp16: (128 + 2·64)·128·2 + 4·(128·64 + 128·128 + 2·128)
    assert tile_onchip_bytes(128, 64, 128, 2) == 65_536 + 4 * (8_192 + 16_384 + 256) == 164_864
    assert tile_onchip_bytes(64, 64, 64, 2) < tile_onchip_bytes(128, 64, 64, 2)


def test_bytes_per_element_is_exact_and_arguments_are_checked() -> None:
    assert standard_io(1, 1, 1000, 1, 0.3).read_q_bytes == 300  # 0.3 is 3/10, not 2/7
    assert standard_io(1, 1, 4096, 128, "fp16").total_bytes == standard_io(1, 1, 4096, 128, 2).total_bytes
    assert standard_io(1.0, 32.0, 4096.0, 128.0, 2) == standard_io(1, 32, 4096, 128, 2)
    with pytest.raises(ValueError, match="bytes_per_element"):
        standard_io(1, 1, 10, 1, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="causal"):
        flash_io(1, 1, 10, 1, 2, causal="false")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="causal"):
        kv_blocks_read(10, 2, 2, None)  # type: ignore[arg-type]
