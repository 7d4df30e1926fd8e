"""The bundled Triton FlashAttention against the eager fp32 reference.

Tolerance comes from the data (as in Dao-AILab/flash-attention's tests): the kernel's error
against a high-precision reference must be at most twice the error of plain PyTorch eager in
the same low precision, plus a small absolute floor. Inputs are fresh random draws every
time; every buffer the kernel allocates is poisoned with NaN first (the kernels allocate
through one helper, ``attnmem.kernels.flash.common.empty``, which the poisoning replaces), so an element
that the kernel fails to write shows up as a mismatch; a deliberately broken kernel that skips
one tile's store proves that it does.

Without a GPU the kernels run under Triton's CPU interpreter. Triton decides
interpret-or-compile when its own library and our kernels are decorated, i.e. when triton is
first imported, so the interpreter cases run in ONE child process started with
TRITON_INTERPRET=1 (this file run as a script); each parametrized test then reports its own
case from that run. Nothing in this pytest process is switched to interpreter mode. The
interpreter has no bf16: those runs use fp16 and fp32. The full grid of shapes runs on a GPU
as tests marked ``gpu`` (tests/kernels/test_flash_attention_gpu.py); the harness both files
use (the tolerance rule, the poisoning) is tests/kernels/_flash_check.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

# tests/kernels/_flash_check.py: the shared harness (the interpreter child runs this file as a
# script, from this folder)
from _flash_check import (  # noqa: E402
    GPU_CONFIG,
    HAS_CUDA,
    HOPPER,
    check_against_reference,
    inputs,
    poison_empty,
)

from attnmem.kernels.flash.config import KernelConfig, Tiles  # noqa: E402


# ---------------------------------------------------------------------------------------------
# import, errors
# ---------------------------------------------------------------------------------------------
def test_import_touches_no_gpu_or_triton():
    code = (
        "import sys, attnmem.kernels\n"
        "assert 'triton' not in sys.modules, 'import attnmem.kernels pulled in triton'\n"
        "assert callable(attnmem.kernels.attention_reference)\n"
        "import attnmem.kernels.flash.api, torch\n"
        "assert not torch.cuda.is_initialized(), 'importing the kernel initialised CUDA'\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr


def test_errors_name_the_argument(fa, monkeypatch):
    """Runs in this process on CPU: every check happens before any kernel launch."""
    dev = "cuda" if HAS_CUDA else "cpu"
    q = torch.randn(1, 4, 8, 16, device=dev, dtype=torch.float16)
    kv = torch.randn(1, 2, 8, 16, device=dev, dtype=torch.float16)
    cases = [
        (ValueError, "4-d", (q[0], kv, kv)),
        (TypeError, "dtype", (q, kv.float(), kv)),
        (TypeError, "float16, bfloat16 or float32", (q.int(), kv, kv)),
        (ValueError, "multiple of key/value heads", (q, kv[:, :1].expand(1, 3, 8, 16), kv[:, :1]
                                                     .expand(1, 3, 8, 16))),
        (ValueError, "head_dim must be from 16 to 256", (q[..., :8], kv[..., :8], kv[..., :8])),
        (ValueError, "one head dim", (q, kv[..., :15], kv[..., :15])),
        (ValueError, "one batch size", (q, torch.cat([kv, kv]), torch.cat([kv, kv]))),
        (TypeError, "torch.Tensor", (q.tolist(), kv, kv)),
    ]
    for exc, words, args in cases:
        with pytest.raises(exc, match=words):
            fa.flash_attention(*args)
    with pytest.raises(ValueError, match="scale must be"):
        fa.flash_attention(q, kv, kv, scale=-1.0)
    q_big = torch.randn(1, 4, 8, 272, device=dev, dtype=torch.float16)
    with pytest.raises(ValueError, match="head_dim"):
        fa.flash_attention(q_big, q_big[:, :2], q_big[:, :2])
    # CPU tensors are refused unless the kernels run under the interpreter.
    monkeypatch.setattr(fa, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="must be CUDA tensors"):
        fa.flash_attention(q.cpu(), kv.cpu(), kv.cpu())


def test_memory_formulas_match_the_docstring(fa):
    # 1 x 32 heads x 4096 x 128, fp16: O 32 MiB + lse 0.5 MiB.
    assert fa.forward_bytes(1, 32, 4096, 128, 2) == 32 * 4096 * (128 * 2 + 4)
    two_kernel = 2 * 32 * 3072 * 128 * 2 + 2 * 8 * 3072 * 128 * 2 + 8 * 32 * 3072
    # GQA with 8 key/value heads at s = 3,072 (below the Hopper region): 8 x 24 = 192 dK/dV
    # programs, the two-kernel backward, with the whole group of 4 split over programs (2 gives
    # 384 < 1,024): partial dK, dV sums 2*B*H_kv*4*s*d*e
    partial = 2 * 8 * 4 * 3072 * 128 * 2
    assert fa.forward_backward_bytes(1, 32, 8, 3072, 3072, 128, 2) == two_kernel + partial
    assert fa.forward_backward_bytes(1, 32, 8, 3072, 3072, 128, 2, split=1) == two_kernel
    # the atomic-dQ backward (by default from s = 2,049 at d = 64 and 128, 16-bit, with at
    # least 2,048 dK/dV programs: here 16 x 8 x 24, so no split) adds its fp32 buffer
    buffer = 16 * 32 * 3072 * 128 * 4
    assert fa.forward_backward_bytes(16, 32, 8, 3072, 3072, 128, 2) == 16 * two_kernel + buffer
    assert fa.forward_backward_bytes(16, 32, 8, 3072, 3072, 128, 2, atomic=False) == (
        16 * two_kernel)
    # 1,536 dK/dV programs: below 2,048, and outside the Hopper region (2 x 3,072 = 6,144
    # queries per call, under its 8,192): the two-kernel backward, no buffer
    mha = 4 * 32 * 3072 * 128 * 2 + 8 * 32 * 3072
    assert fa.forward_backward_bytes(2, 32, 32, 3072, 3072, 128, 2) == 2 * mha
    # the same 1,536 programs over 8 x 3,072 queries: the Hopper region (from s = 512 on at least
    # 512 programs and 8,192 queries), its fp32 buffer and no split
    assert fa.forward_backward_bytes(8, 32, 8, 3072, 3072, 128, 2) == (
        8 * two_kernel + 8 * 32 * 3072 * 128 * 4)
    # so does the Hopper region (s >= 4,096 and 8 x 32 = 256 programs), with no split
    four = 2 * 32 * 4096 * 128 * 2 + 2 * 8 * 4096 * 128 * 2 + 8 * 32 * 4096
    assert fa.forward_backward_bytes(1, 32, 8, 4096, 4096, 128, 2) == four + 32 * 4096 * 128 * 4
    assert fa.forward_backward_bytes(1, 32, 32, 2048, 2048, 128, 2) == (  # s = 2,048: no buffer
        4 * 32 * 2048 * 128 * 2 + 8 * 32 * 2048)
    assert fa.forward_backward_bytes(1, 32, 32, 4096, 4096, 96, 2) == (  # d = 96: no buffer
        4 * 32 * 4096 * 96 * 2 + 8 * 32 * 4096)
    assert "2*B*H*s_q*d*e + 2*B*H_kv*s_k*d*e + 8*B*H*s_q" in fa.flash_attention.__doc__
    assert "4*B*H*s_q*d" in fa.flash_attention.__doc__
    assert "2*B*H_kv*S*s_k*d*e" in fa.flash_attention.__doc__


def test_kernels_allocate_only_through_common_empty():
    """The poisoning patches `attnmem.kernels.flash.common.empty`; that reaches every buffer only if
    the kernels' host code allocates nothing another way. Allowed besides: ``new_zeros`` (the
    atomic-dQ buffer must start at zero) and ``.to(dtype)`` (the cast writes every element)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for name in ("api.py", "route.py", "fwd.py", "bwd.py", "fwd_sm90.py"):
        with open(os.path.join(root, "attnmem", "kernels", "flash", name)) as f:
            src = f.read()
        for call in ("torch.empty", "empty_like", ".new_empty(", "empty_strided", " empty("):
            assert call not in src, f"attnmem/kernels/flash/{name} allocates with {call!r}"
        assert "common.empty(" in src or name in ("api.py", "route.py")


def test_poisoning_fills_every_allocation_path(fa):
    """Inside poison_empty, the kernels' helper and the torch allocators it could be bypassed
    with (torch.empty, torch.empty_like, Tensor.new_empty) all return NaN; outside, they are
    restored."""
    from attnmem.kernels.flash import common

    x = torch.zeros(2, 3)
    real = (common.empty, torch.empty, torch.empty_like, torch.Tensor.new_empty)
    with poison_empty():
        made = [common.empty(x, (4,)), common.empty(x, (2,), torch.float64), torch.empty(3),
                torch.empty_like(x), x.new_empty((5,))]
        assert all(t.isnan().all() for t in made)
        assert common.empty(x, (3,), torch.int32).dtype == torch.int32  # integers kept as they are
    assert (common.empty, torch.empty, torch.empty_like, torch.Tensor.new_empty) == real


def test_kernel_config_is_checked_once_with_named_errors(fa):
    """KernelConfig refuses a bad value when it is built, naming the field, the value and what
    is accepted; a call refuses anything else given as its config (a dict among them)."""

    cases = [
        (dict(tiles=(128, 100, 8, 3)), "block_n must be one of 16, 32, 64, 128, 256 or None, "
                                       "got 100"),
        (dict(tiles=(64, 64, 3, 2)), "num_warps must be one of"),
        (dict(tiles=(64, 64, 4)), "tiles: tiles must be Tiles"),
        (dict(use_desc=1), "use_desc must be True, False or None, got 1"),
        (dict(atomic_dq="yes"), "atomic_dq must be True, False or None"),
        (dict(kv_split=0), "kv_split must be a positive int or None, got 0"),
        (dict(sm90=True, sm90_consumers=4), "sm90_consumers must be one of 2, 3 or None, got 4"),
        (dict(sm90_stages=3), "sm90_stages apply to the Hopper forward only: set sm90=True"),
    ]
    for kwargs, words in cases:
        with pytest.raises(ValueError, match=words.replace("(", r"\(")):
            KernelConfig(**kwargs)
    with pytest.raises(ValueError, match="tiles: tiles must be Tiles, a .* tuple, or None"):
        KernelConfig(tiles={"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2})
    with pytest.raises(ValueError, match=r"config must be a KernelConfig or None, got \[64"):
        KernelConfig.of([64, 64, 4, 2])
    c = KernelConfig(sm90=True)
    assert KernelConfig.of(None) is None and KernelConfig.of(c) is c
    assert KernelConfig(tiles=(64, 32, 4, 2)).tiles == Tiles(64, 32, 4, 2)
    assert Tiles(64, 32, 4, 2).meta() == {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4,
                                          "num_stages": 2}
    q = torch.zeros(1, 2, 8, 16)
    with pytest.raises(ValueError, match="config must be a KernelConfig or None, got {'SM90'"):
        fa.flash_attention(q, q, q, config={"SM90": False})  # before any launch


def test_the_environment_configures_nothing():
    """KernelConfig is the only way to choose: the switches the kernel once read from the
    environment change nothing now, even when set before the import (a fresh process)."""
    import subprocess
    import sys

    from attnmem.kernels.flash import config

    assert dataclasses.asdict(config.SETTINGS) == dataclasses.asdict(config.Settings())
    env = {**os.environ, "FLASH_ATTN_TUNE": "1", "FLASH_ATTN_DESC": "0", "FLASH_ATTN_SM90": "0",
           "FLASH_ATTN_DIRECT_LAUNCH": "0", "FLASH_ATTN_SM90_BWD": "0"}
    code = ("import dataclasses; from attnmem.kernels.flash import config; "
            "print(dataclasses.asdict(config.SETTINGS) == dataclasses.asdict(config.Settings()))")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_stored_h200_tiles_apply_on_hopper_16bit_only(fa, monkeypatch):
    """The stored H200 choices apply to 16-bit inputs on a Hopper GPU only, and can be
    switched off (SETTINGS.retune); a malformed call falls back to tuning instead of failing."""
    from types import SimpleNamespace

    from attnmem.kernels.flash.config import SETTINGS

    fwd = sys.modules["attnmem.kernels.flash.fwd"]
    q16 = SimpleNamespace(device=SimpleNamespace(type="cuda"), element_size=lambda: 2)
    args = {"Q": q16, "seq_bucket": 4096}
    meta = {"BLOCK_D": 128, "CAUSAL": False}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    hit = fwd.pretuned("fwd", args, meta)
    want = fwd.TUNED_H200[("fwd", 2, 128, False, 4096)]
    assert hit is not None and (hit.kwargs["BLOCK_M"], hit.kwargs["BLOCK_N"], hit.num_warps,
                                hit.num_stages) == want
    pruned = fwd.prune_fwd([], args, **meta)
    assert [c.kwargs for c in pruned] == [hit.kwargs]
    # the stored choice sets the descriptors' tiles like every other config (else the kernel
    # would be compiled for a placeholder tile and skip keys)
    assert pruned[0].pre_hook is fwd.set_tiles
    assert all(c.pre_hook is fwd.set_tiles for c in fwd.fwd_kernel_tuned.configs)
    assert fwd.pretuned("fwd", {**args, "seq_bucket": 256}, meta) is None  # not stored
    assert fwd.pretuned("fwd", {"seq_bucket": 4096}, meta) is None  # malformed: tune
    monkeypatch.setattr(SETTINGS, "retune", True)
    assert fwd.pretuned("fwd", args, meta) is None
    monkeypatch.setattr(SETTINGS, "retune", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert fwd.pretuned("fwd", args, meta) is None  # not a Hopper part
    for (kernel, _, _, _, _), (bm, bn, warps, stages) in fwd.TUNED_H200.items():
        assert kernel in ("fwd", "dkdv", "dq") and bm in (32, 64, 128) and bn in (32, 64, 128)
        assert warps in (4, 8) and stages in (2, 3, 4, 5)


def test_descriptors_only_for_layouts_that_flatten_into_rows(fa):
    """K/V go through tensor descriptors only when (batch, head, seq) flatten into rows with a
    16-byte row stride; asking for them elsewhere is refused with a message, not misread."""
    fwd = sys.modules["attnmem.kernels.flash.fwd"]
    if fwd.TensorDescriptor is None:
        pytest.skip("this Triton has no tensor descriptors")
    x = torch.zeros(2, 4, 40, 64, dtype=torch.float16)
    assert fwd.rows_view(x) == (2 * 4 * 40, 64)
    assert fwd.rows_view(x.transpose(1, 2).contiguous().transpose(1, 2)) is None  # (B, s, H, d)
    assert fwd.rows_view(x[:, :, :20]) is None  # heads 40 rows apart, 20 used
    assert fwd.rows_view(x[:1, :1, :20]) == (20, 64)  # one head: any row count
    assert fwd.rows_view(torch.zeros(1, 2, 8, 100, dtype=torch.float16)[..., :36]) is None  # 200 B rows
    route = importlib.import_module("attnmem.kernels.flash.route")
    assert route.descriptors_usable(x, x, 64, True)
    assert not route.descriptors_usable(x, x, 64, False)
    assert not route.descriptors_usable(x, x, 80, True)  # padded head dim: pointers
    assert not route.descriptors_usable(x, x, 64, None)  # CPU tensor, no forcing: pointers
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float16)
    kt = torch.zeros(1, 16, 2, 64, dtype=torch.float16).transpose(1, 2)
    with pytest.raises(ValueError, match="use_desc=True"):
        route.attention_forward(q, kt, kt, False, 0.125,
                                KernelConfig(tiles=Tiles(16, 16, 4, 1), use_desc=True,
                                             sm90=False, atomic_dq=False))


# ---------------------------------------------------------------------------------------------
# which kernels run real tensors; the Hopper forward's compile
# ---------------------------------------------------------------------------------------------
def test_forward_choice_rules():
    """Which forward runs real CPU tensors: the Triton kernel whatever the config says, except
    that sm90=True, where the Gluon kernel cannot run, says why instead of running something
    else."""
    route = importlib.import_module("attnmem.kernels.flash.route")
    q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)

    def kernel(config):
        return route.forward_route(route.Call.of(q, q, False, None), config,
                                   route.probe(q, q, q)).kernel

    assert kernel(KernelConfig(sm90=False)) == "triton"
    assert kernel(None) == "triton"  # CPU tensors
    assert kernel(KernelConfig()) == "triton"
    with pytest.raises(ValueError, match="sm90=True"):
        kernel(KernelConfig(sm90=True))


def test_bulk_dq_adds_need_cuda_and_pow2_head_dim():
    """Bulk reduce-adds of dQ need a CUDA tensor (never under the interpreter), a head dim that
    is a power of two, and are refused when a config turns them off."""
    from attnmem.kernels.flash.route import dq_tma_usable

    cpu = torch.empty(1, 1, 1, 64)
    assert not dq_tma_usable(cpu, 64)
    assert not dq_tma_usable(cpu, 80, force=None)
    if HOPPER:
        gpu = torch.empty(1, 1, 1, 64, device="cuda")
        assert dq_tma_usable(gpu, 64) and dq_tma_usable(gpu, 128)
        assert not dq_tma_usable(gpu, 80) and not dq_tma_usable(gpu, 64, force=False)


def test_backward_choice_rules(monkeypatch):
    """Which backward route.attention_backward launches, with the launches recorded instead of
    run (CPU tensors, no kernel): the atomic-dQ one by `atomic_by_default`, a config's
    atomic_dq first; tiles alone leave the choice to the rule."""
    from attnmem.kernels.flash import bwd as bwd
    from attnmem.kernels.flash import route

    launched = []
    monkeypatch.setattr(bwd, "launch", lambda tuned, plain, name, *a, **k: launched.append(name))
    monkeypatch.setattr(bwd, "DELTA_LAUNCHER", lambda grid, key, args, kw: launched.append("delta"))

    def names(B, H, H_kv, s, d, dtype=torch.float16, config=None, **kw):
        q, do, o = (torch.zeros(B, H, s, d, dtype=dtype) for _ in range(3))
        k, v = (torch.zeros(B, H_kv, s, d, dtype=dtype) for _ in range(2))
        lse2 = torch.zeros(B, H, s)
        launched.clear()
        dq, dk, dv = route.attention_backward(do, q, k, v, o, lse2, False, 0.1, config, **kw)
        assert dq.dtype == dtype and dq.shape == q.shape and dk.shape == k.shape
        return launched[:]

    atomic, two = ["delta", "dkdv_atomic"], ["dq", "dkdv"]
    assert names(1, 32, 32, 4096, 64) == atomic  # 32 x 64 = 2,048 dK/dV programs
    assert names(1, 32, 32, 2048, 64) == two  # not longer than 2,048
    assert names(1, 32, 32, 3072, 128) == two  # 32 x 24 = 768 programs
    assert names(4, 32, 32, 3072, 128) == atomic  # 3,072
    assert names(1, 32, 32, 4096, 128) == atomic  # the Hopper region (1,024 programs of 128)
    assert names(1, 32, 8, 3072, 64) == two  # GQA split over 4: 8 x 4 x 48 = 1,536
    assert names(1, 32, 8, 4096, 128) == atomic  # the region: 8 x 32 = 256 programs, no split
    assert names(1, 32, 4, 4096, 128) == two  # 4 x 32 = 128: Triton's split 8, two kernels
    assert names(1, 32, 32, 4096, 80) == two  # head dim
    assert names(1, 32, 32, 4096, 64, torch.float32) == two  # dtype
    assert names(1, 32, 32, 4096, 64, config=KernelConfig(atomic_dq=False)) == two
    assert names(1, 2, 2, 100, 64, config=KernelConfig(atomic_dq=True)) == atomic
    assert names(1, 32, 32, 4096, 64, config=GPU_CONFIG) == two  # tiles, atomic_dq=False
    tiles = GPU_CONFIG.tiles
    assert names(1, 32, 32, 4096, 64, config=KernelConfig(tiles=tiles)) == atomic
    assert names(1, 32, 32, 4096, 64, config=KernelConfig(dkdv_tiles=tiles,
                                                          atomic_dq=False)) == two
    assert names(1, 32, 32, 4096, 64, config=KernelConfig(sm90=True)) == atomic  # forward only
    # deterministic mode keeps the deterministic backward (a config's switch still wins)
    torch.use_deterministic_algorithms(True)
    try:
        assert names(1, 32, 32, 4096, 64) == two
        assert names(1, 32, 32, 4096, 64, config=KernelConfig(atomic_dq=True)) == atomic
    finally:
        torch.use_deterministic_algorithms(False)


def test_gqa_split_of_the_dkdv_grid(monkeypatch):
    """The GQA split of the dK/dV grid (`kv_split`, a config's kv_split), with the launches
    recorded instead of run: the third grid axis, the partial sums' shape, the refusals."""
    from attnmem.kernels.flash import bwd as bwd
    from attnmem.kernels.flash import route

    grids = []
    monkeypatch.setattr(bwd, "launch", lambda tuned, plain, name, meta, bucket, cfg, args, grid,
                        **k: grids.append((name, grid({"BLOCK_N": 128, "BLOCK_M": 64}),
                                           args[6].shape)))
    monkeypatch.setattr(bwd, "DELTA_LAUNCHER", lambda grid, key, args, kw: None)

    def dkdv(B, H, H_kv, s, config=None):
        q, do, o = (torch.zeros(B, H, s, 64, dtype=torch.float16) for _ in range(3))
        k, v = (torch.zeros(B, H_kv, s, 64, dtype=torch.float16) for _ in range(2))
        grids.clear()
        dq, dk, dv = route.attention_backward(do, q, k, v, o, torch.zeros(B, H, s), True, 0.1,
                                            config)
        assert dk.shape == k.shape and dv.shape == v.shape
        return [g[1:] for g in grids if g[0].startswith("dkdv")][0]

    # (key blocks, B * H_kv, split), and the tensor the programs write
    assert dkdv(1, 32, 32, 4096) == ((32, 32, 1), (1, 32, 4096, 64))  # MHA: no split
    assert dkdv(1, 32, 8, 3072) == ((24, 8, 4), (1, 32, 3072, 64))  # 8 x 24 blocks: x4
    assert dkdv(1, 32, 8, 4096) == ((32, 8, 1), (1, 8, 4096, 64))  # the Hopper region: none
    assert dkdv(1, 32, 8, 16384) == ((128, 8, 1), (1, 8, 16384, 64))  # 1,024 blocks already
    assert dkdv(1, 32, 8, 4096, KernelConfig(kv_split=2)) == ((32, 8, 2), (1, 16, 4096, 64))
    assert dkdv(1, 32, 8, 4096, KernelConfig(kv_split=1)) == ((32, 8, 1), (1, 8, 4096, 64))
    for bad in (3, 8):  # not a divisor of the group: refused at the call, which knows it
        with pytest.raises(ValueError, match=f"kv_split must be a positive divisor of the "
                                             f"GQA group H / H_kv = 32 / 8 = 4, got {bad!r}"):
            dkdv(1, 32, 8, 4096, KernelConfig(kv_split=bad))
    for bad in (0, 2.0, True, "2"):  # not a positive int: refused when the config is built
        with pytest.raises(ValueError, match=r"kv_split must be a positive int or None"):
            dkdv(1, 32, 8, 4096, KernelConfig(kv_split=bad))


def test_where_the_sm90_forward_is_the_default():
    """Where the Gluon forward is the default: d = 128 at every length (two warpgroups, two
    stages), d = 64 only when both lengths exceed 2,048, or 4,096 with a causal mask (three
    warpgroups, two stages)."""
    route = importlib.import_module("attnmem.kernels.flash.route")
    if route.gluon_missing():
        pytest.skip("this Triton has no Gluon")
    k90 = route.fwd_sm90
    assert k90 is not None, route.SM90_IMPORT_ERRORS
    for causal in (False, True):
        assert k90.default_schedule(128, 1, 1, causal) == (2, 2)
        assert k90.default_schedule(128, 16384, 300, causal) == (2, 2)
        assert k90.default_schedule(64, 2048, 16384, causal) is None
        assert k90.default_schedule(64, 16384, 2048, causal) is None
        assert k90.default_schedule(64, 4097, 8192, causal) == (3, 2)
        assert k90.default_schedule(80, 8192, 8192, causal) is None
    assert k90.default_schedule(64, 2049, 4096, False) == (3, 2)
    assert k90.default_schedule(64, 2049, 4096, True) is None


def test_sm90_forward_compiles_without_spills():
    """The Gluon forward compiles for sm_90 on this machine (no GPU needed: Triton's compiler
    and ptxas run on the CPU), without register spills and within the 227 KiB of shared
    memory one block may use."""
    pytest.importorskip("triton.experimental.gluon")  # only a Triton without Gluon skips
    from attnmem.kernels.dev import compile_sm90 as mod
    for args in (("bf16", 128, True, 128, 2), ("fp16", 64, False, 128, 3, 3),
                 ("fp16", 80, True, 128, 2)):
        # the default tile at d = 128; three warpgroups at 64; d = 80 in 128-wide tiles
        ck = mod.compile_variant(*args)
        regs, spills = mod._ptxas_usage(ck.asm["ptx"])
        assert spills == "0", f"{args}: ptxas reports {spills} bytes of spill stores ({regs} regs)"
        assert ck.metadata.shared <= 227 * 1024
        assert ck.asm["ptx"].count("wgmma.wait_group.sync.aligned 1") >= 1  # the overlap


# ---------------------------------------------------------------------------------------------
# interpreter (CPU) subset: small shapes, fp32 and fp16
# ---------------------------------------------------------------------------------------------
INTERP_CASES = [
    # B, H, H_kv, s_q, s_k, d, causal, dtype
    (1, 2, 2, 1, 1, 16, False, torch.float32),
    (1, 2, 2, 1, 1, 16, True, torch.float16),
    (2, 2, 2, 17, 17, 16, True, torch.float32),
    (1, 4, 1, 17, 17, 80, False, torch.float16),
    (1, 4, 1, 97, 97, 16, True, torch.float16),
    (2, 2, 2, 97, 97, 64, False, torch.float32),
    (1, 8, 1, 33, 33, 96, True, torch.float32),
    (1, 2, 2, 64, 64, 32, True, torch.float16),
    (1, 4, 2, 17, 97, 16, True, torch.float32),  # s_q < s_k, top-left causal
    (1, 4, 2, 97, 17, 48, True, torch.float16),  # s_q > s_k
    (1, 2, 1, 40, 70, 24, False, torch.float32),
    (1, 2, 2, 1, 97, 16, True, torch.float32),  # a single query row: sees key 0 only
]


def _strided_case(fa):
    check_against_reference(fa, 2, 4, 2, 33, 33, 32, True, torch.float32, "cpu",
                            layout="bshd", scale=0.3)


def _stride0_grad_case(fa):
    """out.sum().backward() hands the kernel an expanded (stride-0) dO."""
    from attnmem.kernels.flash.reference import attention_reference

    q, k, v, _ = inputs(1, 2, 1, 9, 9, 16, torch.float32, "cpu")
    fa.flash_attention(q, k, v, causal=True).sum().backward()
    q2, k2, v2 = (t.detach().double().requires_grad_() for t in (q, k, v))
    attention_reference(q2, k2, v2, causal=True).sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-5, rtol=1e-4)


# The same cases with K/V read through tensor descriptors (TMA on a GPU; emulated by the
# interpreter): head dims that are powers of two, contiguous layouts, ragged tails and GQA.
INTERP_DESC = KernelConfig(tiles=Tiles(32, 32, 4, 1), use_desc=True, sm90=False, atomic_dq=False)
INTERP_DESC_CASES = [
    (1, 4, 2, 97, 97, 64, True, torch.float16),
    (2, 2, 2, 70, 70, 32, False, torch.float32),
    (1, 4, 1, 17, 130, 16, True, torch.float32),
    (1, 2, 2, 130, 33, 16, False, torch.float16),
]

# The atomic-dQ backward (KernelConfig.atomic_dq; attnmem/kernels/flash/bwd.py): causal and not,
# ragged tails, s_q != s_k, GQA, a padded head dim.
INTERP_ATOMIC = KernelConfig(tiles=Tiles(32, 32, 4, 1), sm90=False, atomic_dq=True)
INTERP_ATOMIC_CASES = [
    (1, 4, 2, 97, 97, 32, True, torch.float16),
    (2, 2, 2, 70, 40, 16, False, torch.float32),
    (1, 4, 1, 17, 130, 80, True, torch.float32),
]
# GQA groups split over dK/dV programs by a config (the default splits small grids by the whole
# group, which the GQA cases above run): a share of 2 of 4 query heads, two-kernel and atomic
INTERP_SPLIT_CASES = [
    (KernelConfig(kv_split=2), (1, 8, 2, 97, 60, 32, True, torch.float16)),
    (KernelConfig(kv_split=2, atomic_dq=True), (2, 4, 1, 33, 70, 16, False, torch.float32)),
]

# Cases whose KernelConfig is built in the child process, from these fields.
INTERP_TYPED_CASES = [
    (dict(tiles=(32, 32, 4, 1), use_desc=True), (1, 4, 2, 97, 97, 64, True, torch.float16)),
    (dict(atomic_dq=True, kv_split=2), (2, 4, 1, 33, 70, 16, False, torch.float32)),
]

INTERP_IDS = ([f"case{i}" for i in range(len(INTERP_CASES))] + ["strided", "stride0_grad"]
              + [f"desc{i}" for i in range(len(INTERP_DESC_CASES))]
              + [f"atomic{i}" for i in range(len(INTERP_ATOMIC_CASES))]
              + [f"split{i}" for i in range(len(INTERP_SPLIT_CASES))]
              + [f"typed{i}" for i in range(len(INTERP_TYPED_CASES))]
              + ["atomic_padded_rows"])


def _padded_rows_case(fa) -> None:
    """The atomic-dQ backward inside calc's Hopper region holds the Gluon backward's padded
    buffer (s_q rounded up to its query block: 97 -> 128 rows at d = 64, attnmem.calc.dispatch.
    sm90_dq_rows), so its bytes match calc wherever it runs instead; dQ must still be right
    with the padded rows between heads. The region is forced for this small shape."""
    from unittest import mock

    from attnmem.calc import dispatch

    shapes = []
    zeros = torch.Tensor.new_zeros

    def spy(t, size, *a, **kw):
        shapes.append(tuple(size))
        return zeros(t, size, *a, **kw)

    with mock.patch.object(dispatch, "sm90_region", lambda *a: True), \
            mock.patch.object(torch.Tensor, "new_zeros", spy):
        check_against_reference(fa, 2, 4, 2, 97, 97, 64, True, torch.float16, "cpu",
                                config=INTERP_ATOMIC)
    assert (2, 4, 128, 64) in shapes, shapes


class SkipOneTile:
    """Stands in for one kernel's launcher (`common.LAUNCHERS`) and launches it with one
    program fewer along the grid's first axis: one tile of the output (a query block of O and
    lse2, or a key block of dK/dV) is never stored. A broken kernel, for the poisoning check."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, grid, key, args, kwargs):
        self.inner((grid[0] - 1, *grid[1:]), None, args, kwargs)


# (kernel whose launches skip a tile, config, case): each must FAIL the poisoned check with NaN
BROKEN_CASES = {
    "broken_fwd": ("fwd", None, (1, 2, 2, 97, 97, 16, False, torch.float32)),
    "broken_dkdv_split": ("dkdv", KernelConfig(kv_split=2),
                          (1, 4, 1, 33, 97, 16, True, torch.float32)),
    "broken_dq": ("dq", None, (1, 2, 2, 97, 97, 16, True, torch.float16)),
}


def _broken_case(fa, kernel, config, case):
    """The case with `kernel` launched through `SkipOneTile`, under the poisoning; returns the
    failure message (an AssertionError if the check passed anyway)."""
    from attnmem.kernels.flash import common
    from attnmem.kernels.flash.launcher import DirectLauncher

    fn = {"fwd": "attnmem.kernels.flash.fwd:fwd_kernel", "dq": "attnmem.kernels.flash.bwd:bwd_dq_kernel",
          "dkdv": "attnmem.kernels.flash.bwd:bwd_dkdv_kernel"}[kernel].split(":")
    plain = getattr(importlib.import_module(fn[0]), fn[1])
    saved = common.LAUNCHERS.get(kernel)
    common.LAUNCHERS[kernel] = SkipOneTile(DirectLauncher(plain))
    try:
        with poison_empty():
            check_against_reference(fa, *case, "cpu", config=config)
    except BaseException as exc:  # pytest.fail raises a BaseException subclass
        return f"{type(exc).__name__}: {exc}"
    finally:
        if saved is None:
            del common.LAUNCHERS[kernel]
        else:
            common.LAUNCHERS[kernel] = saved
    raise AssertionError(f"{kernel}: a kernel that skips a tile passed the poisoned check")


def _interp_worker() -> None:
    """Child process (TRITON_INTERPRET=1): run every interpreter case, print JSON results."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _interp import quick_interpreter

    quick_interpreter()  # tests/_interp.py: the interpreter without two redundant costs
    fa = importlib.import_module("attnmem.kernels.flash.api")
    assert fa.interpreting(), "TRITON_INTERPRET=1 did not take effect"
    runs = [lambda c=c: check_against_reference(fa, *c, "cpu") for c in INTERP_CASES]
    runs += [lambda: _strided_case(fa), lambda: _stride0_grad_case(fa)]
    runs += [lambda c=c: check_against_reference(fa, *c, "cpu", config=INTERP_DESC)
             for c in INTERP_DESC_CASES]
    runs += [lambda c=c: check_against_reference(fa, *c, "cpu", config=INTERP_ATOMIC)
             for c in INTERP_ATOMIC_CASES]
    runs += [lambda cfg=cfg, c=c: check_against_reference(fa, *c, "cpu", config=cfg)
             for cfg, c in INTERP_SPLIT_CASES]
    runs += [lambda cfg=cfg, c=c: check_against_reference(fa, *c, "cpu",
                                                          config=fa.KernelConfig(**cfg))
             for cfg, c in INTERP_TYPED_CASES]
    runs += [lambda: _padded_rows_case(fa)]
    results = {}
    for name, run in zip(INTERP_IDS, runs, strict=True):
        try:
            with poison_empty():
                run()
            results[name] = "ok"
        except BaseException as exc:  # pytest.fail raises a BaseException subclass
            results[name] = f"{type(exc).__name__}: {exc}"
    for name, (kernel, config, case) in BROKEN_CASES.items():
        try:
            results[name] = _broken_case(fa, kernel, config, case)
        except BaseException as exc:
            results[name] = f"passed: {exc}"
    print("INTERP_RESULTS " + json.dumps(results))


@pytest.fixture(scope="module")
def interp_results() -> dict[str, str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--interp-worker"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=500)
    for line in res.stdout.splitlines():
        if line.startswith("INTERP_RESULTS "):
            return json.loads(line[len("INTERP_RESULTS "):])
    pytest.fail(f"interpreter worker failed (rc {res.returncode}):\n{res.stderr[-4000:]}")


@pytest.mark.skipif(HAS_CUDA, reason="interpreter subset: the GPU runs the full grid instead")
@pytest.mark.parametrize("case", INTERP_IDS)
def test_interpreter_cases_match_the_reference(interp_results, case):
    """Small shapes under the CPU interpreter: s 1/17/97, d 16..96, GQA, s_q != s_k, strides."""
    if interp_results[case] != "ok":
        pytest.fail(f"{case}: {interp_results[case]}")


@pytest.mark.skipif(HAS_CUDA, reason="runs under the CPU interpreter")
@pytest.mark.parametrize("case", list(BROKEN_CASES))
def test_poisoning_catches_a_skipped_tile(interp_results, case):
    """A kernel launched with one program too few (the forward's O and lse2, the dQ kernel's
    dQ and delta, the split dK/dV kernel's partial sums each lose one tile) fails the
    poisoned check, and fails it with NaN: the unwritten elements are the poison, not
    whatever the allocator left there."""
    msg = interp_results[case]
    assert not msg.startswith("passed"), msg
    nan = [int(n) for n in __import__("re").findall(r"NaN: (\d+)", msg)]
    assert nan and nan[0] > 0, msg


if __name__ == "__main__" and "--interp-worker" in sys.argv:
    _interp_worker()
