"""The kernels' tuning data: the search spaces the autotuner tries, and the choices stored for
an H200 (timed by attnmem/kernels/dev/tune_fwd.py / tune_bwd; the measurements are in
attnmem/kernels/flash/NOTES.md). Plain data: no triton, no torch.

Every tile entry is (BLOCK_M, BLOCK_N, num_warps, num_stages).
"""

from __future__ import annotations

from attnmem.calc import dispatch

# The portable forward. On Hopper its good region is BLOCK_M = 128 with 8 warps (two
# warpgroups share the query tile) and 3-4 pipeline stages for the K/V loads; the smaller tile
# serves short sequences and the large head dims, where shared memory runs out first.
FWD_SPACE = [
    (128, 128, 8, 3),
    (128, 128, 8, 2),
    (128, 64, 8, 3),
    (128, 64, 8, 4),
    (64, 64, 4, 3),
]
# dK/dV programs hold two fp32 (BLOCK_N, d) accumulators, so they favour a long key tile and
# short query steps; dQ programs hold one (BLOCK_M, d) accumulator and favour the opposite.
DKDV_SPACE = [
    (64, 128, 8, 2),
    (64, 128, 8, 3),
    (32, 128, 8, 2),
    (32, 128, 4, 3),
    (64, 64, 4, 2),
    (32, 64, 4, 3),
]
DQ_SPACE = [
    (128, 64, 8, 2),
    (128, 64, 8, 3),
    (128, 32, 4, 2),
    (64, 64, 4, 3),
]

# The stored H200 choices, keyed by (kernel, element bytes, BLOCK_D, causal, length bucket);
# element bytes 2 covers fp16 and bf16 (same tiles, same tensor-core rate, same shared
# memory). Timed with fp16, B = 1, H = 32; the forward's from the 2,048 bucket up with tensor
# descriptors. On a Hopper GPU a hit skips tuning, so a fresh process starts at full speed
# (SETTINGS.retune, set by the tuning tools, tunes anyway); other GPUs always tune.
TUNED_H200: dict[tuple[str, int, int, bool, int], tuple[int, int, int, int]] = {
    ("fwd", 2, 64, False, 1024): (128, 64, 8, 5),
    ("fwd", 2, 64, False, 2048): (128, 64, 8, 3),
    ("fwd", 2, 64, False, 4096): (128, 64, 4, 3),
    ("fwd", 2, 64, False, 8192): (128, 64, 4, 3),
    ("fwd", 2, 64, False, 16384): (128, 64, 8, 3),
    ("fwd", 2, 64, True, 1024): (64, 64, 4, 3),
    ("fwd", 2, 64, True, 2048): (64, 64, 4, 3),
    ("fwd", 2, 64, True, 4096): (64, 128, 4, 3),
    ("fwd", 2, 64, True, 8192): (128, 64, 8, 4),
    ("fwd", 2, 64, True, 16384): (128, 64, 8, 3),
    ("fwd", 2, 128, False, 1024): (128, 64, 8, 3),
    ("fwd", 2, 128, False, 2048): (64, 64, 4, 3),
    ("fwd", 2, 128, False, 4096): (128, 128, 8, 3),
    ("fwd", 2, 128, False, 8192): (128, 128, 8, 3),
    ("fwd", 2, 128, False, 16384): (128, 128, 8, 3),
    ("fwd", 2, 128, True, 1024): (64, 64, 4, 3),
    ("fwd", 2, 128, True, 2048): (64, 64, 4, 3),
    ("fwd", 2, 128, True, 4096): (128, 128, 8, 3),
    ("fwd", 2, 128, True, 8192): (128, 128, 8, 3),
    ("fwd", 2, 128, True, 16384): (128, 128, 8, 3),
    ("dkdv", 2, 64, False, 1024): (32, 128, 4, 3),
    ("dkdv", 2, 64, False, 2048): (32, 128, 4, 3),
    ("dkdv", 2, 64, False, 4096): (32, 128, 4, 3),
    ("dkdv", 2, 64, False, 8192): (32, 128, 4, 3),
    ("dkdv", 2, 64, False, 16384): (32, 64, 4, 3),
    ("dkdv", 2, 64, True, 1024): (64, 64, 4, 3),
    ("dkdv", 2, 64, True, 2048): (64, 64, 4, 3),
    ("dkdv", 2, 64, True, 4096): (64, 64, 4, 3),
    ("dkdv", 2, 64, True, 8192): (64, 128, 8, 3),
    ("dkdv", 2, 64, True, 16384): (64, 128, 8, 3),
    ("dkdv", 2, 128, False, 1024): (64, 128, 8, 3),
    ("dkdv", 2, 128, False, 2048): (64, 128, 8, 3),
    ("dkdv", 2, 128, False, 4096): (64, 128, 8, 3),
    ("dkdv", 2, 128, False, 8192): (64, 128, 8, 3),
    ("dkdv", 2, 128, False, 16384): (64, 128, 8, 3),
    ("dkdv", 2, 128, True, 1024): (32, 64, 4, 4),
    ("dkdv", 2, 128, True, 2048): (32, 64, 4, 4),
    ("dkdv", 2, 128, True, 4096): (64, 128, 8, 3),
    ("dkdv", 2, 128, True, 8192): (64, 128, 8, 3),
    ("dkdv", 2, 128, True, 16384): (64, 128, 8, 3),
    ("dq", 2, 64, False, 1024): (128, 32, 4, 3),
    ("dq", 2, 64, False, 2048): (64, 64, 4, 3),
    ("dq", 2, 64, False, 4096): (64, 64, 4, 3),
    ("dq", 2, 64, False, 8192): (64, 64, 4, 3),
    ("dq", 2, 64, False, 16384): (64, 64, 4, 3),
    ("dq", 2, 64, True, 1024): (64, 64, 4, 3),
    ("dq", 2, 64, True, 2048): (64, 64, 4, 3),
    ("dq", 2, 64, True, 4096): (64, 64, 4, 3),
    ("dq", 2, 64, True, 8192): (64, 64, 4, 3),
    ("dq", 2, 64, True, 16384): (64, 64, 4, 3),
    ("dq", 2, 128, False, 1024): (128, 64, 8, 3),
    ("dq", 2, 128, False, 2048): (128, 64, 8, 3),
    ("dq", 2, 128, False, 4096): (128, 64, 8, 3),
    ("dq", 2, 128, False, 8192): (128, 64, 8, 2),
    ("dq", 2, 128, False, 16384): (128, 64, 8, 3),
    ("dq", 2, 128, True, 1024): (128, 64, 8, 3),
    ("dq", 2, 128, True, 2048): (128, 64, 8, 3),
    ("dq", 2, 128, True, 4096): (128, 64, 8, 3),
    ("dq", 2, 128, True, 8192): (128, 64, 8, 3),
    ("dq", 2, 128, True, 16384): (128, 64, 8, 3),
}

# The atomic-dQ backward's dK/dV tiles when none are given, by padded head dim (its key block
# is the one attnmem.calc.dispatch counts programs with). d = 256 keeps a small tile (untimed).
ATOMIC_TILES = {
    64: {"BLOCK_M": 64, "BLOCK_N": dispatch.ATOMIC_KEY_BLOCK[64], "num_warps": 4,
         "num_stages": 3},
    128: {"BLOCK_M": 64, "BLOCK_N": dispatch.ATOMIC_KEY_BLOCK[128], "num_warps": 8,
          "num_stages": 3},
    256: {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
}
