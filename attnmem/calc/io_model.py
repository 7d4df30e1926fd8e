"""HBM traffic of standard attention vs FlashAttention, and the tile schedule the explainer draws.

Source: Dao, Fu, Ermon, Rudra, Ré, "FlashAttention: Fast and Memory-Efficient Exact Attention
with IO-Awareness" (arXiv 2205.14135), Theorem 2: standard attention makes Θ(N·d + N²) HBM
accesses, FlashAttention Θ(N²·d²/M) for an on-chip SRAM of M elements. The functions here count
those accesses concretely (bytes, one forward pass, per batch × head, then × B·H):

Standard attention (the paper's Algorithm 0):
  read Q, K (2·N·d) → write S = QKᵀ (N²) → read S (N²) → write P = softmax(S) (N²)
  → read P (N²) and V (N·d) → write O (N·d).          Total: 4·N·d + 4·N² elements.
  With a causal mask the full N×N matrices are still materialized (the mask is applied to S).

FlashAttention, the loop order of FlashAttention-2 and of Triton's fused-attention tutorial
(the bundled kernel): the outer loop walks the T_r = ceil(N/B_r) query blocks; each keeps its
Q_i, running max m, running sum ℓ and output accumulator on chip and streams every K_j, V_j
block past it. So Q is read once, O and the fp32 log-sum-exp written once, and K, V are read
once per query block: T_r passes (fewer when causal: tiles wholly above the diagonal are
skipped). With B_r ≈ M/(4d) this is 2·N·d·T_r ≈ 8·N²·d²/M elements: Theorem 2's Θ(N²d²/M).

The small worked example of the online softmax (Milakov & Gimelshein 2018, arXiv 1805.02867)
uses pure-Python math on a deterministic score matrix, so the explainer's numbers are exact and
testable: after the last tile the running (m, ℓ) equal the row's true max and softmax
denominator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from attnmem.calc.units import ceil_bytes, check_bool, check_bytes_per_element, check_int

#: Bytes of one stored log-sum-exp value (FlashAttention keeps them in fp32).
LSE_BYTES = 4


def _check(name: str, value: object, lo: int = 1, hi: int = 10**9) -> int:
    """A whole number in [lo, hi] (integral floats such as 4096.0 accepted), else ValueError."""
    return check_int(name, value, lo, hi)


def _per_element(bytes_per_element: object) -> Fraction:
    """Exact bytes per element (a number in (0, 64] read as typed, or a dtype name)."""
    return check_bytes_per_element(bytes_per_element)


def _bytes(elements: int, e: Fraction) -> int:
    """Whole bytes of `elements` values of e bytes each (rounded up once)."""
    return ceil_bytes(elements * e)


@dataclass(frozen=True)
class IOBreakdown:
    """HBM bytes moved by one attention forward pass, split by what is moved (all in bytes)."""

    approach: str  # "standard" or "flash"
    read_q_bytes: int
    read_kv_bytes: int
    read_scores_bytes: int  # S and P read back (standard only)
    write_scores_bytes: int  # S and P written (standard only)
    write_out_bytes: int  # O (+ the fp32 log-sum-exp for flash)
    kv_passes: int  # how many times K and V are read in full (flash: T_r; standard: 1)

    @property
    def total_bytes(self) -> int:
        return (
            self.read_q_bytes
            + self.read_kv_bytes
            + self.read_scores_bytes
            + self.write_scores_bytes
            + self.write_out_bytes
        )

    def rows(self) -> list[tuple[str, int]]:
        """(label, bytes) pairs for a table or a stacked bar."""
        return [
            ("read Q", self.read_q_bytes),
            ("read K, V", self.read_kv_bytes),
            ("write S and P (s×s)", self.write_scores_bytes),
            ("read S and P back (s×s)", self.read_scores_bytes),
            ("write O" + (" + log-sum-exp" if self.approach == "flash" else ""), self.write_out_bytes),
        ]


def standard_io(
    batch: int, heads: int, seq_len: int, head_dim: int, bytes_per_element: float | Fraction
) -> IOBreakdown:
    """HBM bytes of standard attention's forward pass: (4·N·d + 4·N²)·e per (batch, head).

    Dao et al. 2022, Algorithm 0 and Theorem 2 (Θ(N·d + N²) accesses).
    """
    bh = _check("batch", batch) * _check("heads", heads)
    n = _check("seq_len", seq_len)
    d = _check("head_dim", head_dim, 1, 65_536)
    e = _per_element(bytes_per_element)
    nd = bh * n * d
    nn = bh * n * n
    return IOBreakdown(
        approach="standard",
        read_q_bytes=_bytes(nd, e),
        read_kv_bytes=_bytes(2 * nd, e),
        read_scores_bytes=_bytes(2 * nn, e),
        write_scores_bytes=_bytes(2 * nn, e),
        write_out_bytes=_bytes(nd, e),
        kv_passes=1,
    )


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """Σ_{i=0}^{n-1} floor((a·i + b) / m) for n ≥ 0, m ≥ 1, a, b ≥ 0, in O(log m) steps.

    The classic Euclid-like reduction (as in the AtCoder Library's floor_sum); it keeps the
    causal tile counts below O(1) per call even for s = 10^8 with 16-row blocks.
    """
    total = 0
    while True:
        if a >= m:
            total += (n - 1) * n // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            return total
        n, b = divmod(y_max, m)
        m, a = a, m


def _causal_blocks_before(i0: int, bq: int, bk: int) -> int:
    """Σ over query blocks i < i0 (all full) of the key blocks block i visits:
    floor(((i+1)·B_r - 1) / B_c) + 1 each."""
    return floor_sum(i0, bk, bq, bq - 1) + i0


def kv_blocks_read(seq_len: int, block_q: int, block_k: int, causal: bool) -> int:
    """How many K (and V) blocks the flash loop loads in total, over all query blocks.

    Without a mask every query block reads all T_c = ceil(N/B_c) key blocks; with a causal mask
    query block i (rows i·B_r .. min(N, (i+1)·B_r) - 1) reads key blocks up to the one holding
    its last row. Closed form (floor_sum), exact; tests compare it with tile_schedule.
    """
    n = _check("seq_len", seq_len)
    bq = _check("block_q", block_q)
    bk = _check("block_k", block_k)
    causal = check_bool("causal", causal)
    t_r = -(-n // bq)
    t_c = -(-n // bk)
    if not causal:
        return t_r * t_c
    return _causal_blocks_before(t_r - 1, bq, bk) + t_c  # the last query block reads all T_c


def flash_io(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    bytes_per_element: float | Fraction,
    block_q: int = 128,
    block_k: int = 64,
    causal: bool = False,
) -> IOBreakdown:
    """HBM bytes of a FlashAttention(-2) forward pass with B_r = block_q, B_c = block_k.

    Q read once, O written once plus one fp32 log-sum-exp per row, K and V read once per query
    block (T_r = ceil(N/B_r) passes; causal skips tiles above the diagonal). The last key block
    may be partial: its bytes count only the rows that exist.
    """
    bh = _check("batch", batch) * _check("heads", heads)
    n = _check("seq_len", seq_len)
    d = _check("head_dim", head_dim, 1, 65_536)
    e = _per_element(bytes_per_element)
    bq = _check("block_q", block_q)
    bk = _check("block_k", block_k)
    causal = check_bool("causal", causal)
    t_r = -(-n // bq)
    kv_rows = _kv_rows_read(n, bq, bk, causal)
    return IOBreakdown(
        approach="flash",
        read_q_bytes=_bytes(bh * n * d, e),
        read_kv_bytes=_bytes(2 * bh * kv_rows * d, e),
        read_scores_bytes=0,
        write_scores_bytes=0,
        write_out_bytes=_bytes(bh * n * d, e) + bh * n * LSE_BYTES,
        kv_passes=t_r,
    )


def _kv_rows_read(n: int, bq: int, bk: int, causal: bool) -> int:
    """Key rows loaded in total: Σ over query blocks of the key rows that block visits.

    Causal: block i visits key blocks 0 .. b_i; their rows are min(N, (b_i + 1)·B_c), which is N
    exactly when b_i is the last key block. b_i is non-decreasing in i, so the blocks before the
    first one that reaches the last key block are summed in closed form, the rest count N each.
    """
    t_r = -(-n // bq)
    if not causal:
        return t_r * n
    t_c = -(-n // bk)
    # first query block whose last row lies in the last key block: (i+1)·B_r - 1 ≥ (T_c - 1)·B_c
    i0 = min(t_r - 1, max(0, -(-((t_c - 1) * bk + 1) // bq) - 1))
    return bk * _causal_blocks_before(i0, bq, bk) + (t_r - i0) * n


def tile_onchip_bytes(block_q: int, block_k: int, head_dim: int,
                      bytes_per_element: float | Fraction) -> int:
    """Bytes one FlashAttention step holds on chip (shared memory and registers together).

    Q_i (B_r × d), K_j and V_j (B_c × d each) in the input dtype; the score tile S_ij
    (B_r × B_c), the output accumulator (B_r × d) and the running m, ℓ (B_r each) in fp32, as
    the FlashAttention-2 / Triton kernels keep them. Independent of s: this is why the s × s
    matrix never needs to exist. (Dao et al. 2022, Algorithm 1: blocks sized to fit SRAM.)
    """
    bq = _check("block_q", block_q)
    bk = _check("block_k", block_k)
    d = _check("head_dim", head_dim, 1, 65_536)
    inputs = _bytes((bq + 2 * bk) * d, _per_element(bytes_per_element))
    return inputs + 4 * (bq * bk + bq * d + 2 * bq)


def theorem2_flash_elements(seq_len: int, head_dim: int, sram_elements: int) -> float:
    """Dao et al. Theorem 2's estimate of flash K/V traffic, 8·N²·d²/M elements per (b, h),
    for B_r = M/(4d) (the paper's block size). Order of magnitude only: for comparison."""
    n = _check("seq_len", seq_len)
    d = _check("head_dim", head_dim, 1, 65_536)
    m = _check("sram_elements", sram_elements, 1, 10**9)
    return 8 * n * n * d * d / m


# --- the tile schedule and the online softmax, for the step slider -------------------------


@dataclass(frozen=True)
class Tile:
    """One B_r × B_c tile of the score matrix in the order the flash loop visits it."""

    qi: int  # query block index (row of tiles)
    kj: int  # key block index (column of tiles)
    q_start: int  # first query row (inclusive)
    q_end: int  # last query row + 1
    k_start: int  # first key column (inclusive)
    k_end: int  # last key column + 1
    skipped: bool  # causal: wholly above the diagonal, never loaded or computed
    diagonal: bool  # causal: straddles the diagonal, so it is partly masked
    step: int | None  # 0-based position among computed tiles; None when skipped


def tile_schedule(seq_len: int, block_q: int, block_k: int, causal: bool) -> list[Tile]:
    """Every tile, row-major (query block outer, key block inner: FlashAttention-2 order).

    Skipped tiles (causal, k_start > q_end - 1) are listed with step=None so a picture can grey
    them out; the others are numbered 0, 1, 2, ... in the order they are computed.
    """
    n = _check("seq_len", seq_len, 1, 1_000_000)
    bq = _check("block_q", block_q)
    bk = _check("block_k", block_k)
    causal = check_bool("causal", causal)
    if -(-n // bq) * -(-n // bk) > 1_000_000:
        raise ValueError(
            f"seq_len {n:,} with blocks {bq}×{bk} makes more than 1,000,000 tiles; "
            "the schedule is for pictures: use larger blocks or kv_blocks_read")
    tiles: list[Tile] = []
    step = 0
    for qi in range(-(-n // bq)):
        q0, q1 = qi * bq, min(n, (qi + 1) * bq)
        for kj in range(-(-n // bk)):
            k0, k1 = kj * bk, min(n, (kj + 1) * bk)
            skipped = causal and k0 > q1 - 1
            diagonal = causal and not skipped and k1 - 1 > q0
            tiles.append(
                Tile(qi, kj, q0, q1, k0, k1, skipped, diagonal, None if skipped else step)
            )
            if not skipped:
                step += 1
    return tiles


def example_scores(n: int, seed: int = 0) -> list[list[float]]:
    """A deterministic n × n score matrix (values in about [-3, 3], two decimals) for the
    worked example: no randomness, so the explainer shows the same numbers every time."""
    _check("n", n, 1, 256)
    return [
        [round(3 * math.sin(1.3 * i + 0.7 * j + 0.37 * seed) * math.cos(0.4 * j - 0.2 * i), 2)
         for j in range(n)]
        for i in range(n)
    ]


@dataclass(frozen=True)
class RowState:
    """Online-softmax state of one query row after a tile: running max m, running sum ℓ."""

    row: int
    m: float  # max of the scores seen so far in this row (-inf before any)
    l: float  # noqa: E741  Σ exp(score - m) over the scores seen so far


@dataclass(frozen=True)
class StepState:
    """What is on chip at one step: the tile, and each of its query rows' (m, ℓ) after it."""

    tile: Tile
    rows: tuple[RowState, ...]


def online_softmax_trace(
    scores: list[list[float]], block_q: int, block_k: int, causal: bool
) -> list[StepState]:
    """Run the online softmax tile by tile; one StepState per computed tile.

    For each row, with a tile's (unmasked) scores x: m' = max(m, max x);
    ℓ' = ℓ·exp(m - m') + Σ exp(x - m'). Masked entries (causal, key > query) are left out.
    Milakov & Gimelshein 2018; Dao et al. 2022, Algorithm 1, lines 9-12.
    """
    if not isinstance(scores, list) or any(not isinstance(r, list) for r in scores):
        raise ValueError("scores must be a square matrix given as a list of lists of numbers")
    n = len(scores)
    if n == 0 or any(len(r) != n for r in scores):
        raise ValueError(f"scores must be a square matrix (n × n, n ≥ 1), got {n} rows")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
               for r in scores for x in r):
        raise ValueError("scores must hold finite numbers")
    causal = check_bool("causal", causal)
    state: dict[int, tuple[float, float]] = {r: (-math.inf, 0.0) for r in range(n)}
    trace: list[StepState] = []
    for tile in tile_schedule(n, block_q, block_k, causal):
        if tile.skipped:
            continue
        rows = []
        for r in range(tile.q_start, tile.q_end):
            xs = [scores[r][c] for c in range(tile.k_start, tile.k_end) if not (causal and c > r)]
            m, l = state[r]  # noqa: E741
            if xs:
                m_new = max(m, max(xs))
                l = l * math.exp(m - m_new) + sum(math.exp(x - m_new) for x in xs)  # noqa: E741
                m = m_new
            state[r] = (m, l)
            rows.append(RowState(r, m, l))
        trace.append(StepState(tile, tuple(rows)))
    return trace


def softmax_row_stats(scores: list[list[float]], causal: bool) -> list[tuple[float, float]]:
    """(max, Σ exp(x - max)) of each row computed directly: what the trace must end with."""
    causal = check_bool("causal", causal)
    out = []
    for r, row in enumerate(scores):
        xs = row[: r + 1] if causal else row
        m = max(xs)
        out.append((m, sum(math.exp(x - m) for x in xs)))
    return out
