"""What the forward and the backward share: sizes and buckets, the tile helpers inside the
kernels, the stored-tile lookup and autotuner options, the one launch path (with its cache of
chosen configs and direct launchers), and the one allocation helper.

Host helpers are plain integer arithmetic: triton's own go through its constexpr wrapper,
which short calls feel on the launch path.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from attnmem.kernels.flash.config import SETTINGS
from attnmem.kernels.flash.launcher import DirectLauncher
from attnmem.kernels.flash.tuned import TUNED_H200

LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)
SMEM_BYTES = 220 * 1024  # usable shared memory per block on H100/H200 is 227 KiB

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton < 3.4: no host-side tensor descriptors
    TensorDescriptor = None


@dataclass(frozen=True)
class Packed:
    """Packed sequences of one call (`api.flash_attention` with ``cu_seqlens``), checked:
    int32 cumulative starts of the queries and keys on the inputs' device (n_seq + 1 entries,
    0 first, strictly increasing, the packed totals last) and the longest query and key
    sequence (host ints: they size the grids). The layout of FlashAttention-2's varlen
    interface (flash_attn_varlen_func: cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int

    @property
    def n_seq(self) -> int:
        return self.cu_q.shape[0] - 1


def pow2_at_least(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive integers (grid sizes)."""
    return -(-a // b)


def block_d(d: int) -> int:
    """Head dim padded to the next power of two (at least 16, the smallest dot size)."""
    return max(16, pow2_at_least(d))


def seq_bucket(s: int) -> int:
    """Length bucket for the autotuner's key: powers of two from 256 up to 16384."""
    return min(16384, max(256, pow2_at_least(s)))


def empty(like: torch.Tensor, shape: tuple, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Uninitialised contiguous memory of ``shape`` on ``like``'s device, in ``dtype`` (default
    ``like``'s). Every buffer the kernels write is allocated here, called as ``common.empty``
    so that one patch reaches every caller: the tests fill it with NaN, so an element a kernel
    fails to write shows. ``Tensor.new_empty`` takes the
    device and dtype from ``like`` without parsing them, cheaper than torch.empty."""
    if dtype is None:
        return like.new_empty(shape)
    return like.new_empty(shape, dtype=dtype)


def triton_configs(space: list[tuple[int, int, int, int]]) -> list[triton.Config]:
    """triton.Config objects of (BLOCK_M, BLOCK_N, num_warps, num_stages) entries."""
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
        for bm, bn, w, st in space
    ]


def autotune_options() -> dict:
    """Options of triton.autotune that exist in this Triton: keep the timings on disk
    (cache_results, in TRITON_CACHE_DIR), where this Triton has the option."""
    params = inspect.signature(triton.autotune).parameters
    opts = {}
    if "cache_results" in params:
        opts["cache_results"] = True
    return opts


def pretuned(kernel: str, named_args: dict, kwargs: dict) -> triton.Config | None:
    """The stored H200 choice (`tuned.TUNED_H200`) for this call of ``kernel`` ("fwd", "dq"
    or "dkdv"), if there is one and the GPU is a Hopper part; None means "tune"."""
    if SETTINGS.retune:
        return None
    try:
        q = named_args["Q"]
        if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device) != (9, 0):
            return None
        key = (kernel, q.element_size(), kwargs["BLOCK_D"], bool(kwargs["CAUSAL"]),
               int(named_args["seq_bucket"]))
    except (KeyError, AttributeError, RuntimeError):  # anything unexpected: just tune
        return None
    hit = TUNED_H200.get(key)
    return None if hit is None else triton_configs([hit])[0]


# ---- helpers inside the kernels --------------------------------------------------------------
@triton.jit
def mm(a, b, IEEE: tl.constexpr):
    """a @ b with fp32 accumulation; exact fp32 products when the inputs are fp32 (IEEE)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def mma(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b, accumulated by the tensor cores into acc itself.

    Writing ``acc + mm(a, b)`` instead makes the compiler hold a second fp32 tile of acc's
    size for the product and then add the two: one more (BLOCK, d) fp32 tile of live registers
    and BLOCK * d extra adds per step, which is what the forward's inner loop cannot afford.
    """
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def tile_mask(rows, n_rows, offs_d, HEAD_DIM, EVEN_D: tl.constexpr):
    """(len(rows), BLOCK_D) mask of a tile: rows below n_rows, and where d was padded to a
    power of two, columns below HEAD_DIM."""
    mask = rows[:, None] < n_rows
    if not EVEN_D:
        mask = mask & (offs_d[None, :] < HEAD_DIM)
    return mask


@triton.jit
def load_pair(a_ptrs, b_ptrs, rows, n_rows, offs_d, HEAD_DIM,
              MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """Two tiles over the same rows (K and V, or Q and dO), read as zero past the last row
    (only checked when MASKED: unmasked blocks lie wholly inside) and in the padded columns."""
    if MASKED:
        mask = tile_mask(rows, n_rows, offs_d, HEAD_DIM, EVEN_D)
        a = tl.load(a_ptrs, mask=mask, other=0.0)
        b = tl.load(b_ptrs, mask=mask, other=0.0)
    elif EVEN_D:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    else:
        d_mask = offs_d[None, :] < HEAD_DIM
        a = tl.load(a_ptrs, mask=d_mask, other=0.0)
        b = tl.load(b_ptrs, mask=d_mask, other=0.0)
    return a, b


@triton.jit
def query_tile(H, GROUP, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """This program's query block and head: (first row, batch * H + query head, batch, query
    head, key/value head).

    Causal: the last query blocks do the most work (they see the most keys), so they are
    handed out first; the short ones then fill the gaps at the end of the grid. Grid axis 1
    runs over batch x query heads; query head h reads key/value head h // GROUP (GQA)."""
    if CAUSAL:
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    else:
        start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    h = bh % H
    return start_m, bh, bh // H, h, h // GROUP


@triton.jit
def key_range(start_m, s_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(full_hi, hi) for the query tile starting at row start_m.

    full_hi: end of the key blocks that every row of the tile sees entirely (no mask needed);
    hi:      end of the keys that any row of the tile sees (top-left causal alignment).
    Keys [full_hi, hi) are the diagonal and ragged-tail blocks that need a mask. The forward
    and the dQ kernel split their key loops the same way with it.
    """
    s_k_full = (s_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        full_hi = tl.minimum(s_k_full, (start_m // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(s_k, start_m + BLOCK_M)
    else:
        full_hi = s_k_full
        hi = s_k
    return full_hi, hi


@triton.jit
def window_key_range(start_m, s_k, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(lo, full_lo, full_hi, hi) for the query tile starting at row start_m under a causal
    sliding window of ``window`` keys (query i sees key j iff j <= i and i - j < window, in the
    top-left alignment of `key_range`).

    lo:      first key block any row of the tile sees (row start_m sees keys from
             start_m - window + 1 on), rounded down to a block;
    [full_lo, full_hi): the key blocks that every row of the tile sees whole (the last row
             sees keys from start_m + BLOCK_M - window on; the first row keys up to start_m):
             no mask needed there; empty (full_lo == full_hi) when the window is shorter than
             the tile;
    hi:      end of the keys that any row of the tile sees.
    Keys [lo, full_lo) are the window's lower edge and [full_hi, hi) the diagonal and ragged
    tail: both need a mask. Every bound is a multiple of BLOCK_N except hi (which may be
    s_k); lo <= full_lo <= full_hi, and all the ranges are empty when lo >= hi (a tile of
    rows whose windows lie past the keys, s_q > s_k). Key blocks below lo are never visited:
    the work of a tile is O(BLOCK_M + window) keys instead of O(start_m).
    """
    s_k_full = (s_k // BLOCK_N) * BLOCK_N
    lo = (tl.maximum(start_m - window + 1, 0) // BLOCK_N) * BLOCK_N
    hi = tl.minimum(s_k, start_m + BLOCK_M)
    first_full = tl.cdiv(tl.maximum(start_m + BLOCK_M - window, 0), BLOCK_N) * BLOCK_N
    causal_full = tl.minimum(s_k_full, (start_m // BLOCK_N) * BLOCK_N)
    full_lo = tl.maximum(lo, tl.minimum(first_full, causal_full))
    full_hi = tl.maximum(full_lo, causal_full)
    return lo, full_lo, full_hi, hi


@triton.jit
def varlen_rows(CU_Q, CU_K, seq, h, total_q):
    """Where packed sequence ``seq`` lies (`api.flash_attention` with ``cu_seqlens``): its
    first query row q0 (int64) and query count s_q, its first key row k0 (int64) and key count
    s_k, read from the int32 cumulative starts CU_Q and CU_K (n_seq + 1 entries each, the
    layout of FlashAttention-2's varlen interface), and the offset of its first row in a
    (1, H, total_q) per-row vector (lse2, delta) for query head h. Inside a sequence every
    kernel works as on one (batch, head) of length s_q x s_k, so no tile crosses a sequence
    boundary."""
    start_q = tl.load(CU_Q + seq)
    s_q = tl.load(CU_Q + seq + 1) - start_q
    start_k = tl.load(CU_K + seq)
    s_k = tl.load(CU_K + seq + 1) - start_k
    q0 = start_q.to(tl.int64)
    return q0, s_q, start_k.to(tl.int64), s_k, h.to(tl.int64) * total_q + q0


# ---- the launch path ---------------------------------------------------------------------------
# The config chosen per (kernel, element size, head dim, causal, bucket, TMA, window) in this
# process, with the keyword arguments of a launch under it (the WINDOW constexpr among them, so
# a windowed call never reuses an unwindowed launch's kwargs). After the first call of a key
# the kernel is launched with it directly: the autotuner's own dispatch costs tens of
# microseconds of Python per launch, which short sequences would feel. fp16 and bf16 share one
# entry (same tiles, same tensor-core rate, same shared memory), so the second dtype compiles
# one config, not all.
CHOSEN: dict[tuple, tuple[dict, dict, tuple]] = {}
LAUNCHERS: dict[str, DirectLauncher] = {}  # one per kernel name ("fwd", "dq", "dkdv", ...)


def launch(tuned, plain, name: str, meta: dict, bucket: int, tiles: dict | None, args: tuple,
           grid, prepare=None, spec: tuple | None = None) -> None:
    """Launch ``plain`` with ``tiles`` (`config.Tiles.meta()`), or with the autotuner
    ``tuned``'s choice for this key when ``tiles`` is None.

    ``prepare(tiles)``, when given, runs before a direct launch (the autotuner runs the
    configs' own pre_hook): the forward uses it to give its tensor descriptors their tiles.
    ``spec``, when given, determines everything the JIT specialises on in ``args`` other
    than what ``meta`` and the tiles fix (dtypes, strides, alignment, head counts): the
    compiled kernel is then launched without the JIT's dispatch (`launcher.DirectLauncher`).
    """
    launcher = LAUNCHERS.get(name)  # by name: hashing a JITFunction is slow
    if launcher is None:
        launcher = LAUNCHERS[name] = DirectLauncher(plain)
    if tiles is not None:
        if prepare is not None:
            prepare(tiles)
        key = None if spec is None else (name, spec, tuple(meta.items()),
                                         tuple(tiles.items()))
        launcher(grid(tiles), key, args, {**meta, **tiles})
        return
    ckey = (name, args[0].element_size(), meta["HEAD_DIM"], meta["CAUSAL"], bucket,
            meta.get("USE_DESC", False), meta.get("WINDOW", False))
    chosen = CHOSEN.get(ckey)
    if chosen is not None:
        cfg, kwargs, cfg_key = chosen
        if prepare is not None:
            prepare(cfg)
        launcher(grid(cfg), None if spec is None else (ckey, spec, cfg_key), args, kwargs)
        return
    tuned[grid](*args, **meta)
    best = getattr(tuned, "best_config", None)
    if best is not None:
        cfg = best.all_kwargs()
        CHOSEN[ckey] = (cfg, {**meta, **cfg}, tuple(cfg.items()))
