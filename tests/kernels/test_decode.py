"""The split-KV decode path (attnmem/kernels/flash/decode.py) and its memory model.

Semantics under test: s_q new queries per sequence against a cache of k, v tensors whose
first kv_len rows are valid (one number, or one per sequence); with ``causal`` query i sees
keys 0 .. kv_len - s_q + i (bottom-right, a KV cache's mask), else every valid key. The
oracle is a float64 softmax over exactly those keys; the kernel's error must stay within
twice the same reference computed in the inputs' dtype plus a floor (tests/_tolerance.py).

Without a GPU the kernels run under Triton's CPU interpreter in ONE child process (this file
run as a script; TRITON_INTERPRET=1 before triton is imported). Each case draws fresh random
inputs (its own seed), every buffer the kernel allocates is NaN-filled (tests/_poison.py),
and the cache rows past the valid length are NaN: a kernel that reads them, or leaves an
output or partial element unwritten, shows. The interpreter cases are fp16 and fp32: Triton
3.9's interpreter computes bfloat16 dot products wrongly (our forward too: 8e8 errors on a
32 x 16 bf16 call), so bf16 is checked by the GPU tests. Small key tiles (16, 32) give
several tiles per chunk and chunks per sequence at these lengths.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _poison import poison_empty  # noqa: E402  (tests/_poison.py)
from _tolerance import within as _within  # noqa: E402  (tests/_tolerance.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_CUDA = torch.cuda.is_available()
FLOOR = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def reference(q, k, v, kv_len, causal, dtype=torch.float64):
    """softmax over each sequence's valid keys (bottom-right causal), computed in ``dtype``;
    a row that sees no key is 0."""
    B, H, s_q, d = q.shape
    G = H // k.shape[1]
    out = torch.zeros(B, H, s_q, d, dtype=dtype, device=q.device)
    for b in range(B):
        n = (k.shape[2] if kv_len is None else
             int(kv_len) if isinstance(kv_len, int) else int(kv_len[b]))
        kk = k[b, :, :n].to(dtype).repeat_interleave(G, 0)
        vv = v[b, :, :n].to(dtype).repeat_interleave(G, 0)
        s = (q[b].to(dtype) @ kk.transpose(-1, -2)) / math.sqrt(d)
        if causal:
            i = torch.arange(s_q, device=q.device)[:, None]
            j = torch.arange(n, device=q.device)[None, :]
            s = s.masked_fill(j > n - s_q + i, float("-inf"))
        p = torch.softmax(s.float() if dtype != torch.float64 else s, -1).nan_to_num(0.0)
        out[b] = (p.to(dtype) @ vv)
    return out


def make(B, H, H_kv, s_q, cache, d, dtype, device, seed, kv_len=None):
    """Fresh q, k, v (seeded per case); cache rows past each valid length set to NaN."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, s_q, d, generator=g).to(device, dtype)
    k = torch.randn(B, H_kv, cache, d, generator=g).to(device, dtype)
    v = torch.randn(B, H_kv, cache, d, generator=g).to(device, dtype)
    lens = ([cache] * B if kv_len is None else [int(kv_len)] * B if isinstance(kv_len, int)
            else [int(x) for x in kv_len])
    for b, n in enumerate(lens):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    return q, k, v


def check(B, H, H_kv, s_q, cache, d, kv_len, causal, dtype, device, seed, splits=None,
          block_n=None, layout="bhsd", combine=None):
    """decode_attention against the float64 reference within twice the same-dtype error."""
    from attnmem.kernels.flash.decode import decode_attention

    q, k, v = make(B, H, H_kv, s_q, cache, d, dtype, device, seed, kv_len)
    if layout == "bshd":  # the cache stored (B, S, H_kv, d), viewed (B, H_kv, S, d)
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    lens = kv_len
    if isinstance(kv_len, list):
        lens = torch.tensor(kv_len, dtype=torch.int32, device=device)
    with torch.no_grad():
        out = decode_attention(q, k, v, lens, causal, splits=splits, block_n=block_n,
                               combine=combine)
    assert out.shape == (B, H, s_q, d) and out.dtype == dtype
    ref = reference(q, k, v, kv_len, causal)
    base = reference(q, k, v, kv_len, causal, dtype=dtype)
    _within("out", out, ref, base, FLOOR[dtype])


# (B, H, H_kv, s_q, cache, d, kv_len, causal, dtype, splits, block_n)
#  kv_len: None (the whole cache), an int (a static cache's valid length) or a list (per
#  sequence, passed as an int32 tensor); none of the lengths is a multiple of the tile
CASES = {
    "mha_1q_d64": (2, 4, 4, 1, 203, 64, None, True, torch.float16, None, 32),
    "gqa4_1q_static": (2, 8, 2, 1, 300, 64, 229, True, torch.float16, None, 32),
    "gqa8_1q_d128": (1, 8, 1, 1, 177, 128, None, True, torch.float16, 3, 32),
    "gqa8_8q_causal": (1, 16, 2, 8, 250, 64, 211, True, torch.float16, None, 16),
    "gqa4_8q_full": (2, 8, 2, 8, 150, 32, 133, False, torch.float16, 4, 16),
    "mha_8q_causal_fp32": (1, 2, 2, 8, 97, 16, None, True, torch.float32, 3, 16),
    "d80_gqa4_8q": (1, 8, 2, 8, 150, 80, 121, True, torch.float16, 3, 32),
    "d96_1q": (2, 4, 1, 1, 100, 96, 77, True, torch.float16, 2, 16),
    "d192_gqa4": (1, 4, 1, 3, 90, 192, 83, True, torch.float16, 2, 16),
    "d256_gqa8_8q": (1, 8, 1, 8, 70, 256, 69, True, torch.float16, None, 16),
    "per_seq_lengths": (3, 8, 2, 2, 120, 32, [120, 37, 2], True, torch.float16, 3, 16),
    "per_seq_full": (2, 4, 4, 1, 64, 16, [5, 64], False, torch.float32, 4, 16),
    "one_chunk_direct": (2, 8, 2, 4, 100, 64, 99, True, torch.float16, 1, 32),
    "more_chunks_than_tiles": (1, 4, 1, 1, 40, 16, 33, True, torch.float32, 9, 16),
    "prefill_rows_blocks": (1, 4, 2, 40, 100, 32, 93, True, torch.float32, 2, 16),
    "default_plan_tile": (1, 8, 2, 8, 300, 64, 290, True, torch.float16, None, None),
    # the fused combine: chunk counts that are not a multiple of its step of 4 (19: forced,
    # FORCE_COMBINE), two row blocks (two counters per sequence), rows that see no key at
    # all (kv_len < s_q)
    "fused_19_chunks": (1, 4, 1, 1, 300, 32, 297, True, torch.float32, 19, 16),
    "fused_two_row_blocks": (1, 8, 2, 40, 100, 32, 93, True, torch.float32, 3, 16),
    "fused_rows_without_keys": (2, 4, 2, 3, 50, 16, [1, 50], True, torch.float32, 4, 16),
    # the default rule on both sides of its threshold (fused at 2-4 chunks): 2 programs, 8
    # and 10 tiles of 16 keys -> 4 chunks (fused) and 5 (the combine kernel)
    "default_4_chunks_fused": (1, 8, 2, 4, 128, 32, 113, True, torch.float16, None, 16),
    "default_5_chunks_kernel": (1, 8, 2, 4, 160, 32, 150, True, torch.float16, None, 16),
}
#: cases whose combine is forced (the default rule would not fuse 19 chunks)
FORCE_COMBINE = {"fused_19_chunks": "fused"}
#: cases run again with the second-kernel combine (combine="kernel", the A/B's other arm)
KERNEL_COMBINE = ("gqa4_8q_full", "per_seq_lengths", "fused_19_chunks",
                  "fused_two_row_blocks", "fused_rows_without_keys", "d256_gqa8_8q")


def _allocations() -> dict:
    """The kernel's allocations in order (bytes, from common.empty) and its launches, for the
    default combine (against the step list attnmem.calc.attention_steps.triton_decode_steps
    replays) and either combine forced (against decode_buffers of plan_for's plan)."""
    import attnmem.kernels.flash.decode as dec
    from attnmem.calc.attention_steps import _A, triton_decode_steps
    from attnmem.kernels.flash import common
    from attnmem.kernels.flash.decode import decode_attention, decode_buffers, plan_for

    got = {}
    # (B, H, H_kv, s_q, kv_len, d): B·H_kv = 2 programs over 8, 10 and 6 tiles of 128 keys
    # (4 chunks: fused; 5: the combine kernel; 3), two row blocks in the fourth (3 chunks),
    # and an unsplit plan
    for shape in ((1, 4, 2, 1, 1000, 64), (1, 4, 2, 1, 1200, 64), (1, 4, 2, 8, 700, 64),
                  (1, 8, 2, 40, 700, 32), (2, 4, 4, 1, 100, 16)):
        B, H, H_kv, s_q, kv, d = shape
        for combine in (None, "fused", "kernel"):
            sizes: list[int] = []
            launches: list[str] = []
            real, real_launch = common.empty, dec.launch

            def record(*a, real=real, sizes=sizes, **k):
                t = real(*a, **k)
                sizes.append(t.numel() * t.element_size())
                return t

            def record_launch(*a, real_launch=real_launch, launches=launches):
                launches.append(a[2])  # the launch's name: "decode" or "decode_combine"
                return real_launch(*a)

            common.empty, dec.launch = record, record_launch
            try:
                q, k, v = make(B, H, H_kv, s_q, kv, d, torch.float16, "cpu", 5)
                with torch.no_grad():
                    decode_attention(q, k, v, kv, combine=combine)
            finally:
                common.empty, dec.launch = real, real_launch
            plan = plan_for(B, H, H_kv, s_q, kv, d, combine=combine)
            if combine is None:
                steps = [s for s in triton_decode_steps(B, H, H_kv, s_q, kv, d, "fp16")
                         if isinstance(s, _A)]
                want = [n for s in steps for n in s.sizes]
            else:
                want = [n for _, n in decode_buffers(plan, B, H, H_kv, s_q, d, 2)]
            got[f"{shape} {combine}"] = {"kernel": sizes, "calc": want, "launches": launches,
                                         "splits": plan.splits, "fused": plan.fused,
                                         "row_blocks": plan.row_blocks, "combine": combine}
    return got


def _ab_probe() -> dict:
    """attnmem.kernels.dev.ab_decode's run on the CPU: every candidate's output checked by
    the probe's own timer stand-in (fp32 reference, relative L2 error <= 2e-2) at shapes
    where old and new cut differently (B = 1, 8,192 keys: 32 and 16 chunks; B = 16, 1,024
    keys: 4 and none), fp16 (the interpreter's bf16 is wrong)."""
    from attnmem.kernels.dev import ab_decode
    from attnmem.measure.bench.decode import DecodeShape

    def timer(call, ref):
        try:
            with torch.no_grad():
                got = call()
        except RuntimeError as exc:  # SDPA's CUDA backends on the CPU
            return math.nan, f"unsupported: {exc}"
        rel = float((got.float() - ref).norm() / ref.norm())
        return (1.0, "ok") if rel <= ab_decode.REL_ERR_MAX else (math.nan, f"wrong: {rel:.2g}")

    shapes = [DecodeShape(1, 8192, 1, dtype="fp16"), DecodeShape(16, 1024, 8, dtype="fp16")]
    rows = ab_decode.run(shapes, 1, False, 5, log=lambda *a: None, device="cpu", timer=timer)
    return {"rows": [{k: r[k] for k in ("batch", "cache", "new", "impl", "status", "chunks",
                                        "fused", "same_as")} for r in rows],
            "report": ab_decode.report(rows, [])}


def _interp_worker() -> None:
    from _interp import quick_interpreter

    quick_interpreter()
    import attnmem.kernels.flash.api as api

    assert api.interpreting(), "TRITON_INTERPRET=1 did not take effect"
    results: dict[str, object] = {}
    runs = {name: (lambda c=c, i=i, name=name: check(*c[:8], c[8], "cpu", 100 + i, c[9], c[10],
                                                     combine=FORCE_COMBINE.get(name)))
            for i, (name, c) in enumerate(CASES.items())}
    runs["strided_bshd_cache"] = lambda: check(2, 8, 2, 1, 130, 64, 111, True, torch.float16,
                                               "cpu", 7, 3, 32, layout="bshd")
    for i, name in enumerate(KERNEL_COMBINE):
        c = CASES[name]
        runs[f"{name}/kernel"] = (lambda c=c, i=i: check(*c[:8], c[8], "cpu", 200 + i, c[9],
                                                         c[10], combine="kernel"))
    for name, run in runs.items():
        try:
            with poison_empty():
                run()
            results[name] = "ok"
        except BaseException as exc:  # reported by the test of that case
            results[name] = f"{type(exc).__name__}: {exc}"
    try:
        results["allocations"] = _allocations()
    except BaseException as exc:
        results["allocations"] = f"{type(exc).__name__}: {exc}"
    try:
        results["ab_probe"] = _ab_probe()
    except BaseException as exc:
        results["ab_probe"] = f"{type(exc).__name__}: {exc}"
    print("DECODE_RESULTS " + json.dumps(results), flush=True)


@pytest.fixture(scope="module")
def interp() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--interp-worker"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    for line in res.stdout.splitlines():
        if line.startswith("DECODE_RESULTS "):
            return json.loads(line[len("DECODE_RESULTS "):])
    pytest.fail(f"interpreter worker failed (rc {res.returncode}):\n{res.stderr[-4000:]}")


@pytest.mark.skipif(HAS_CUDA, reason="interpreter subset: the GPU tests below run instead")
@pytest.mark.parametrize("case", [*CASES, "strided_bshd_cache",
                                  *(f"{n}/kernel" for n in KERNEL_COMBINE)])
def test_decode_matches_float64_reference_under_interpreter(interp, case):
    """1 and 8 (and 2, 3, 4, 40) new queries, GQA ratios 1, 2, 4, 8, d 16-256 (80, 96, 192
    padded), causal and full, valid lengths as the whole cache, one number below it (a static
    cache) and one per sequence, forced chunk counts (more than the tiles too) and the
    default plan, a strided (B, S, H, d) cache; outputs NaN-poisoned, cache tails NaN; the
    fused combine (default: its counters come from a NaN-poisoned buffer, so a counter left
    unzeroed leaves O unwritten) and, for some cases, the second-kernel combine."""
    assert interp[case] == "ok", interp[case]


@pytest.mark.skipif(HAS_CUDA, reason="interpreter subset")
def test_kernel_allocates_what_calc_replays(interp):
    """The decode path's allocations, in order and to the byte, are the step sequence
    attnmem.calc.attention_steps.triton_decode_steps replays (split plans on both sides of
    the fused combine's 4-chunk threshold, unsplit plans, one and two row blocks: the
    counters behind the log2-sum-exps only where fused); either combine forced allocates
    decode_buffers of its plan. The combine kernel is launched exactly where the plan splits
    and does not fuse."""
    got = interp["allocations"]
    assert isinstance(got, dict), got
    default = {k: v for k, v in got.items() if v["combine"] is None}
    # the default rule covered unsplit, fused (4 and 3 chunks) and the combine kernel (5)
    assert {(v["splits"] > 1, v["fused"]) for v in default.values()} == {
        (False, False), (True, True), (True, False)}
    assert {v["splits"]: v["fused"] for v in default.values() if v["splits"] > 1} == {
        3: True, 4: True, 5: False}
    assert any(v["splits"] > 1 and v["row_blocks"] > 1 and v["fused"]
               for v in default.values())
    for shape, v in got.items():
        assert v["kernel"] == v["calc"], (shape, v)
        combined = v["splits"] > 1 and not v["fused"]
        assert v["launches"] == ["decode"] + ["decode_combine"] * combined, (shape, v)
        assert len(v["kernel"]) == (3 if v["splits"] > 1 else 1), (shape, v)
    # forcing the fused combine at 5 chunks adds the counters (5 x 4 rows + 2 counters)
    five = got["(1, 4, 2, 1, 1200, 64) fused"]
    assert five["fused"] and five["kernel"][2] == (4 * 5 + 2) * 4


@pytest.mark.skipif(HAS_CUDA, reason="interpreter subset")
def test_ab_probe_runs_every_candidate_correctly(interp):
    """The A/B probe times what it says: old (4-wave rule, combine kernel), new (one wave,
    the default combine: at 16 chunks the combine kernel), both combines forced at new's
    chunks, old's chunks fused and no split, each output right; a candidate that runs what
    an earlier one runs is not run again but points at it."""
    got = interp["ab_probe"]
    assert isinstance(got, dict), got
    rows = {(r["batch"], r["impl"]): r for r in got["rows"]}
    for impl in ("old", "new", "new_kernel", "new_fused", "old_fused", "s1"):
        assert rows[(1, impl)]["status"] == "ok", rows[(1, impl)]
    assert [rows[(1, c)]["chunks"] for c in ("old", "new", "new_fused", "s1")] == [32, 16, 16, 1]
    # 16 chunks: past the fused combine's 4, so new is new_kernel; new_fused is timed apart
    assert not rows[(1, "new")]["fused"] and not rows[(1, "old")]["fused"]
    assert rows[(1, "new_kernel")]["same_as"] == "new"
    assert rows[(1, "new_fused")]["same_as"] == "" and rows[(1, "new_fused")]["fused"]
    # B = 16: 128 programs, so new runs unsplit, as s1 does; both forced combines are new
    assert (rows[(16, "old")]["chunks"], rows[(16, "new")]["chunks"]) == (4, 1)
    assert rows[(16, "s1")]["same_as"] == "new" and rows[(16, "new_kernel")]["same_as"] == "new"
    assert rows[(16, "new_fused")]["same_as"] == "new"
    assert "| 16 | 1024 | 8 | 4/1 |" in got["report"]


# ---------------------------------------------------------------------------------------------
# the plan and the memory model (pure)
# ---------------------------------------------------------------------------------------------
def test_plan_fills_one_wave_and_cuts_whole_tiles():
    """The rule: a split grid (row blocks·B·H_kv·S programs) is at most one wave of 132 SMs
    and more than half of one where the cache has the tiles; a grid of more than 66
    programs runs unsplit; chunks of whole tiles, none empty; the first rule (4 waves) is
    still what waves=4 gives."""
    from attnmem.calc.decode_split import DECODE_SMS, decode_plan

    for B in (1, 4, 16, 64):
        for H, H_kv in ((32, 32), (32, 8), (64, 8), (128, 8), (40, 8), (28, 4), (16, 1)):
            for s_q in (1, 8, 40):
                for kv in (300, 1000, 4097, 32768, 131072):
                    for d in (64, 80, 128, 192, 256):
                        p = decode_plan(B, H, H_kv, s_q, kv, d)
                        assert p.split_len % p.block_n == 0
                        assert (p.splits - 1) * p.split_len < kv <= p.splits * p.split_len
                        unsplit = p.row_blocks * B * H_kv
                        tiles = -(-kv // p.block_n)
                        if p.splits > 1:
                            assert unsplit * p.splits <= DECODE_SMS, (B, H, H_kv, s_q, kv, d)
                            assert p.split_len >= 2 * p.block_n
                        if unsplit > DECODE_SMS // 2 or tiles < 4:
                            assert p.splits == 1
                        elif tiles >= 2 * DECODE_SMS:  # enough tiles for any split count
                            assert unsplit * p.splits > DECODE_SMS // 2
                        assert p.block_m >= min(H // H_kv * s_q, 64)
    p = decode_plan(1, 32, 8, 1, 131072, 128)
    # 8 programs: 132 // 8 = 16 chunks of 1,024 / 16 = 64 tiles
    assert (p.splits, p.split_len) == (16, 8192)
    assert decode_plan(16, 32, 8, 1, 1024, 128).splits == 1  # 128 programs: one wave already
    # the first rule: 528 // 8 = 66 chunks wanted, 1,024 tiles cut into whole 16-tile chunks
    p = decode_plan(1, 32, 8, 1, 131072, 128, waves=4)
    assert (p.splits, p.split_len) == (64, 2048)
    assert decode_plan(16, 32, 8, 1, 1024, 128, waves=4).splits == 4


def test_threshold_cases_take_the_path_they_name():
    """The interpreter cases named for the default rule's threshold plan what they say (the
    plan that decode_attention runs with combine None): 4 chunks fused, 5 not."""
    from attnmem.kernels.flash.decode import plan_for

    for name, fused in (("default_4_chunks_fused", True), ("default_5_chunks_kernel", False)):
        B, H, H_kv, s_q, _, d, kv_len, *_, splits, block_n = CASES[name]
        plan = plan_for(B, H, H_kv, s_q, kv_len, d, block_n, splits)
        assert (plan.splits, plan.fused) == (4 if fused else 5, fused), (name, plan)


def test_decode_peak_counts_the_partials():
    """decode_peak_bytes is the output plus, with S > 1 chunks, the fp32 partial outputs and
    the buffer of log2-sum-exps and int32 counters: the allocator's blocks of the sizes
    decode_buffer_bytes gives."""
    from attnmem.calc.allocator import round_size
    from attnmem.calc.decode_split import decode_buffer_bytes, decode_counters, decode_plan
    from attnmem.calc.peak import decode_peak_breakdown, decode_peak_bytes

    # B = 1, H = 32, H_kv = 8, 128k keys, bf16: 16 chunks of the cache, combined by the
    # second kernel (past the fused combine's 4 chunks): no counters
    plan = decode_plan(1, 32, 8, 1, 131072, 128)
    assert plan.splits == 16 and not plan.fused and decode_counters(1, 8, plan) == 0
    o, part, lse = decode_buffer_bytes(1, 32, 8, 1, 131072, 128, 2)
    assert (o, part, lse) == (32 * 128 * 2, 32 * 16 * 128 * 4, 32 * 16 * 4)
    peak = decode_peak_bytes(1, 32, 8, 1, 131072, 128, "bf16", expandable=True)
    assert peak == round_size(o) + round_size(part) + round_size(lse)
    terms = decode_peak_breakdown(1, 32, 8, 1, 131072, 128, "bf16", expandable=True)
    assert sum(t.counted_bytes for t in terms) == peak
    # B = 4: 4 chunks, fused: 32 counters behind the log2-sum-exps
    plan = decode_plan(4, 32, 8, 1, 131072, 128)
    assert plan.splits == 4 and plan.fused and decode_counters(4, 8, plan) == 32
    o, part, lse = decode_buffer_bytes(4, 32, 8, 1, 131072, 128, 2)
    assert lse == (4 * 32 * 4 + 32) * 4
    assert decode_buffer_bytes(4, 32, 8, 1, 131072, 128, 2, fused=False)[2] == 4 * 32 * 4 * 4
    assert decode_peak_bytes(4, 32, 8, 1, 131072, 128, "bf16", expandable=True) == (
        round_size(o) + round_size(part) + round_size(lse))
    # two row blocks (s_q = 40, G = 4: 160 rows of 128, d = 32), 8 tiles: 4 chunks, fused,
    # 2 counters per (b, h_kv); at 4,096 keys 16 chunks: the combine kernel, none
    plan = decode_plan(1, 8, 2, 40, 1024, 32)
    assert plan.row_blocks == 2 and plan.splits == 4 and plan.fused
    assert decode_buffer_bytes(1, 8, 2, 40, 1024, 32, 2)[2] == (8 * 40 * 4 + 2 * 2) * 4
    plan = decode_plan(1, 8, 2, 40, 4096, 32)
    assert plan.splits == 16 and not plan.fused
    assert decode_buffer_bytes(1, 8, 2, 40, 4096, 32, 2)[2] == 8 * 40 * 16 * 4
    # the same rows at d = 64: a 128 x 64 tile, over DECODE_FUSED_MAX_TILE: the combine
    # kernel, no counters, at 4 chunks too
    plan = decode_plan(1, 8, 2, 40, 1024, 64)
    assert plan.splits == 4 and not plan.fused
    assert decode_buffer_bytes(1, 8, 2, 40, 1024, 64, 2)[2] == 8 * 40 * plan.splits * 4
    # B = 16 and 64, H_kv = 8: 128 and 512 programs, no split: the output alone
    for B in (16, 64):
        assert decode_plan(B, 32, 8, 1, 4096, 128).splits == 1
        assert decode_peak_bytes(B, 32, 8, 1, 4096, 128, "fp16", expandable=True) == (
            round_size(B * 32 * 128 * 2))
    # a static cache's length sizes the inputs only
    assert decode_peak_bytes(1, 32, 8, 1, 4000, 128, "bf16", cache_len=8192,
                             expandable=True) == decode_peak_bytes(
        1, 32, 8, 1, 4000, 128, "bf16", expandable=True)


@pytest.mark.parametrize("bad, match", [
    (dict(kv_heads=3), "must divide"), (dict(new_tokens=0), "new_tokens"),
    (dict(head_dim=300), "head_dim"), (dict(dtype="fp8"), "dtype"),
    (dict(cache_len=10), "cache_len"), (dict(kv_len=2.5), "kv_len")])
def test_decode_peak_refuses_bad_input(bad, match):
    from attnmem.calc.peak import decode_peak_bytes

    args = dict(batch=1, heads=8, kv_heads=2, new_tokens=1, kv_len=100, head_dim=64,
                dtype="fp16") | bad
    with pytest.raises(ValueError, match=match):
        decode_peak_bytes(**args)


def test_decode_refuses_bad_input(monkeypatch):
    """Checked before any launch: lengths, shapes, gradients."""
    import attnmem.kernels.flash.decode as dec
    from attnmem.kernels.flash.decode import decode_attention

    monkeypatch.setattr(dec, "_INTERPRETED", True)
    q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 10, 16)
    with pytest.raises(ValueError, match="kv_len must be an int from 1 to the cache length 10"):
        decode_attention(q, k, k, 11)
    with pytest.raises(ValueError, match="int32 of shape"):
        decode_attention(q, k, k, torch.tensor([3]))
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        decode_attention(torch.randn(1, 3, 1, 16), k, k)
    with pytest.raises(ValueError, match="combine must be 'fused', 'kernel' or None"):
        decode_attention(q, k, k, combine="two")
    with pytest.raises(ValueError, match="no backward"):
        decode_attention(q.requires_grad_(), k, k)


def test_ab_probe_report_and_plan():
    """The probe's table and summary on given rows: fastest peer / candidate per shape, the
    median and worst, new / old; and its GPU-free plan of what it would time."""
    from attnmem.kernels.dev.ab_decode import parse_args, parse_shape, report, timing_plan
    from attnmem.measure.bench.decode import DECODE_SHAPES

    def row(b, impl, us, chunks=None, fused=None, same=""):
        return dict(batch=b, cache=1024, new=1, impl=impl, us=us, status="ok", chunks=chunks,
                    fused=fused, same_as=same)

    rows = [row(1, "old", 20.0, 4, False), row(1, "new", 10.0, 4, True),
            row(1, "sdpa_cudnn", 12.0), row(1, "sdpa_flash", 15.0),
            row(4, "old", 40.0, 4, False), row(4, "new", 40.0, 4, False, "old"),
            row(4, "sdpa_cudnn", 30.0), row(4, "sdpa_flash", 50.0)]
    text = report(rows, [dict(impl="new", wall_us=9.5, chunks=4, fused=True)])
    assert "| 1 | 1024 | 1 | 4/4 | 20.0 | 10.0 | 12.0 | 15.0 | 0.60 | 1.20 | 2.00 |" in text
    assert "| 4 | 1024 | 1 | 4/4 | 40.0 | 40.0= | 30.0 | 50.0 | 0.75 | 0.75 | 1.00 |" in text
    assert "- new: fastest peer / new over 2 shapes: median 0.97, worst 0.75, 1 at >= 1.00" in text
    assert "- old: fastest peer / old over 2 shapes: median 0.68, worst 0.60, 0 at >= 1.00" in text
    assert "geometric mean 1.414" in text and "9.5 µs per call" in text
    lines, calls = timing_plan(DECODE_SHAPES, 3, False)
    assert len(lines) == 30 and calls == 462
    assert lines[0] == "B=1 cache=1024 new=1: old (S=4), new (S=4, fused), s1 (S=1)"
    assert parse_args(["--shapes", "4/1024/8"]).shapes[0].label() == "B=4 cache=1024 new=8"
    with pytest.raises(SystemExit):
        parse_args(["--shapes", "4/8/16"])
    with pytest.raises(Exception, match="B/CACHE/NEW"):
        parse_shape("4x1024")


def test_ab_probe_predicts_the_default_from_measured_rows(tmp_path):
    """--predict: per shape the default rule's (chunks, fused) and the time of the earlier
    run's candidate that ran the same; at B = 1, 8k keys (16 chunks: the combine kernel now)
    that is new_kernel's, not the fused new's of that run."""
    from attnmem.kernels.dev.ab_decode import predict, read_rows

    def row(b, cache, impl, us, chunks=None, fused=None):
        return dict(batch=b, cache=cache, new=1, impl=impl, us=us, status="ok", chunks=chunks,
                    fused=fused, same_as="")

    rows = [row(1, 8192, "new", 28.0, 16, True), row(1, 8192, "new_kernel", 26.0, 16, False),
            row(1, 8192, "sdpa_cudnn", 26.0), row(1, 1024, "new", 15.0, 4, True),
            row(1, 1024, "new_kernel", 16.0, 4, False), row(1, 1024, "sdpa_cudnn", 12.0),
            row(1, 32768, "old", 70.0, 64, False), row(1, 32768, "sdpa_cudnn", 63.0)]
    out, text = predict(rows)
    by = {r["cache"]: r for r in out}
    assert (by[8192]["source"], by[8192]["us"], by[8192]["ratio"]) == ("new_kernel", 26.0, 1.0)
    assert (by[1024]["source"], by[1024]["us"]) == ("new", 15.0) and by[1024]["fused"]
    assert by[32768]["source"] == "" and math.isnan(by[32768]["us"])  # 16 chunks not timed
    assert "median 0.90, worst 0.80, 1 at >= 1.00" in text
    assert "not predicted (no candidate timed that path): B=1 cache=32768 new=1" in text
    # the bundled H100 rows: every shape's path was timed
    out, text = predict(read_rows(os.path.join(ROOT, "data", "kernel_speed_decode_ab_h100.csv")))
    assert len(out) == 30 and all(r["source"] for r in out)
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not ab_decode rows"):
        read_rows(str(bad))


# ---------------------------------------------------------------------------------------------
# GPU (the lead runs these)
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("B, H, H_kv, s_q, cache, d, kv_len, dtype", [
    (1, 32, 8, 1, 131072, 128, None, torch.bfloat16),
    (4, 40, 8, 8, 32768, 128, 30001, torch.bfloat16),
    (16, 64, 8, 1, 8192, 64, [8192, 17, 4000, 5] * 4, torch.float16),
    (2, 24, 24, 8, 4096, 80, 4001, torch.bfloat16),
    (8, 32, 2, 1, 16384, 256, None, torch.float16),
    (64, 16, 16, 1, 1024, 96, 999, torch.bfloat16),
    (1, 48, 4, 8, 65536, 192, 65000, torch.bfloat16),
])
def test_gpu_decode_matches_reference(B, H, H_kv, s_q, cache, d, kv_len, dtype):
    with poison_empty():
        check(B, H, H_kv, s_q, cache, d, kv_len, True, dtype, "cuda", 11)


@pytest.mark.gpu
@pytest.mark.parametrize("B, H_kv, s_q, cache, kv_len", [(1, 8, 1, 32768, None),
                                                       (2, 2, 2, 4096, [4096, 1000]),
                                                       (4, 8, 1, 1024, None)])
def test_gpu_fused_combine_is_deterministic(B, H_kv, s_q, cache, kv_len):
    """The fused combine (forced: at 16 chunks the default combines in a second kernel),
    200 calls on the same inputs, buffers NaN-poisoned: every output bit-identical to the
    first (which program takes the last ticket varies from call to call, the order of the
    sum does not) and right. A program that read another chunk's partials before they were
    visible would read NaN or an older call's values."""
    from attnmem.kernels.flash.decode import decode_attention, plan_for

    plan = plan_for(B, 32, H_kv, s_q, cache, 128, combine="fused")
    assert plan.fused and plan.splits > 1
    q, k, v = make(B, 32, H_kv, s_q, cache, 128, torch.bfloat16, "cuda", 13, kv_len)
    lens = None if kv_len is None else torch.tensor(kv_len, dtype=torch.int32, device="cuda")
    with torch.no_grad(), poison_empty():
        outs = [decode_attention(q, k, v, lens, combine="fused") for _ in range(200)]
    first = outs[0]
    assert all(torch.equal(o, first) for o in outs[1:])
    _within("out", first, reference(q, k, v, kv_len, True),
            reference(q, k, v, kv_len, True, dtype=torch.bfloat16), FLOOR[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("B, H, H_kv, s_q, kv, d", [(1, 32, 8, 1, 131072, 128),
                                                   (8, 32, 8, 8, 16384, 128),
                                                   (64, 32, 8, 1, 4096, 128)])
def test_gpu_decode_peak_equals_calc(B, H, H_kv, s_q, kv, d):
    """max_memory_allocated() over one call, inputs allocated before and the cache emptied,
    equals attnmem.calc.peak.decode_peak_bytes."""
    from attnmem.calc.peak import decode_peak_bytes
    from attnmem.kernels.flash.decode import decode_attention

    q, k, v = make(B, H, H_kv, s_q, kv, d, torch.bfloat16, "cuda", 3)
    with torch.no_grad():
        decode_attention(q, k, v)  # compile first
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = decode_attention(q, k, v)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    del out
    assert peak == decode_peak_bytes(B, H, H_kv, s_q, kv, d, "bf16")


if __name__ == "__main__" and "--interp-worker" in sys.argv:
    _interp_worker()
