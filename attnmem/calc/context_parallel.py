"""Context parallelism (ring attention): what each of c GPUs holds, and what it sends.

Ring attention splits the sequence of s tokens over c ranks: rank r keeps m = s/c queries
(with their output and log-sum-exp) and passes its key/value block to rank r+1, receiving
rank r-1's, c-1 times, so that every query meets every key while no rank ever holds more than
two key/value blocks (Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise
Transformers", arXiv 2310.01889, sec. 3 and Algorithm 1: blockwise attention with the
key/value blocks rotating over the ring, overlapped with compute). Partial outputs are merged
by their log-sum-exp (ibid.; the online softmax of FlashAttention, Dao et al. 2022,
arXiv 2205.14135, sec. 3.1). The backward rotates the key/value blocks again and sends the
partial dK, dV along with their block (zhuzilin/ring-flash-attention, ring_flash_attn.py;
torch.distributed.tensor.experimental, _context_parallel/_attention.py,
`_templated_ring_attention_backward`).

Causal attention is load-balanced by zigzag sharding: 2c chunks, rank r holding chunks r and
2c-1-r, so every step past the first costs every rank the same m x m/2 block of work (Llama 3,
Dubey et al. 2024, arXiv 2407.21783, sec. 3.3.2, context parallelism; zhuzilin's
zigzag_ring_flash_attn.py; torch's `_HeadTailLoadBalancer`). s must then be a multiple of 2c.

Two implementations are modelled, tensor by tensor, as replays of what one rank allocates
(each tensor counted as the caching allocator's block: its size rounded up to 512 bytes,
c10/cuda/CUDACachingAllocator.cpp `round_size`):

- "triton": the ring over our kernel, attnmem/kernels/ring/ring.py (`ring_forward`, `ring_backward`,
  which this module mirrors line by line; the kernel's own buffers per step follow
  attnmem.calc.dispatch, the rules the kernel itself calls). Checked against one rank simulated on an
  H200 by ``python -m attnmem.measure.ring.one_rank``.
- "sdpa_flash", "sdpa_efficient", "sdpa_cudnn": PyTorch's own context_parallel (read in the
  torch 2.13 source, _context_parallel/_attention.py; the same algorithm and defaults in an
  earlier pytorch/pytorch revision of that file, 09b101c, where the all-gather is
  all_gather_tensor; torch 2.11 itself not read here; not measured, no multi-GPU machine): its default rotation all-gathers the whole K/V of the group once
  (`_AllGatherRotater`, `_cp_options.rotate_method = ALL_GATHER`), so each rank holds c key/
  value blocks, not two; it merges in fp32 (`convert_to_f32 = True`) with out-of-place
  tensor expressions (`_SDPAMerger`), accumulates dQ, dK, dV in fp32 and sends dK, dV with an
  all-to-all permute each step. Equal query and key/value heads only (the model does not
  follow GQA through the SDPA backends' ring).

What is returned is the EXTRA peak beyond the rank's local inputs (q, k, v of m tokens, and
dO for forward+backward), the convention of attnmem.calc.peak (the measurement procedure of
attnmem/measure/harness.py); `context_parallel_memory` adds the inputs. With c = 1 the ring is the plain call:
attnmem.calc.peak.attention_peak_bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnmem.calc import dispatch
from attnmem.calc.allocator import TensorReplay, round_size
from attnmem.calc.models import ModelConfig, check_model
from attnmem.calc.peak import (
    AttentionCall,
    DtypeNotRun,
    attention_peak_bytes,
    attention_peak_terms,
    call_of,
)
from attnmem.calc.units import (
    MAX_BATCH,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_SEQ_LEN,
    check_bool,
    check_int,
    dtype_bytes,
    dtype_name,
)

CP_IMPLEMENTATIONS: tuple[str, ...] = ("triton", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
CP_IMPL_LABELS: dict[str, str] = {
    "triton": "Ring over our Triton kernel (kernels.ring)",
    "sdpa_flash": "torch context_parallel, SDPA FlashAttention-2",
    "sdpa_efficient": "torch context_parallel, SDPA memory-efficient",
    "sdpa_cudnn": "torch context_parallel, SDPA cuDNN",
}
#: Largest ring the functions accept (the page draws 1 to 64).
MAX_WORLD_SIZE = 4096

Term = tuple[str, int]


def _check_impl(impl: str) -> str:
    if not isinstance(impl, str) or impl not in CP_IMPLEMENTATIONS:
        raise ValueError(f"unknown context-parallel implementation {impl!r}; accepted: "
                         f"{', '.join(CP_IMPLEMENTATIONS)}")
    return impl


def _ring(impl, batch, heads, seq_len, head_dim, dtype, causal, backward, world_size,
          kv_heads) -> tuple[AttentionCall, int]:
    """(the call each rank is part of, over the whole sequence; the number of ranks c),
    checked: an implementation the ring model covers, a dtype its kernel runs (all of them
    16- or 32-bit), and a sequence that splits evenly over the ranks."""
    _check_impl(impl.impl if isinstance(impl, AttentionCall) else impl)
    c = check_int("world_size", world_size, 1, MAX_WORLD_SIZE)
    try:
        call = call_of(impl, batch, heads, seq_len, head_dim, dtype, causal, backward, kv_heads)
    except DtypeNotRun:  # the dtype is a known name: say what the ring runs
        given = impl.dtype if isinstance(impl, AttentionCall) else dtype
        if dtype_bytes(dtype_name(given)) not in (2, 4):
            raise ValueError(f"dtype {given!r}: the ring runs 16- and 32-bit attention; "
                             "accepted: fp16, bf16, fp32, tf32") from None
        raise
    h, s = call.heads, call.seq_len
    if call.impl != "triton" and call.gqa and c > 1:
        raise ValueError(f"kv_heads={call.kv_heads}: the model of torch's context_parallel "
                         f"covers equal query and key/value heads only; accepted: kv_heads = "
                         f"heads ({h}) or None, or impl='triton'")
    if c > 1:
        parts = 2 * c if call.causal else c
        if s % parts:
            what = ("2·world_size chunks for zigzag load balancing (rank r holds chunks r and "
                    "2c-1-r)") if call.causal else "world_size equal shards"
            raise ValueError(f"seq_len {s} must split into {what}: accepted multiples of "
                             f"{parts}, got {s} (world_size={c})")
    return call, c


# ---- the ring schedule ------------------------------------------------------------------------

def ring_step_kind(rank: int, world_size: int, step: int, causal: bool) -> str:
    """What rank r computes at step t, holding the key/value block of rank (r - t) mod c
    (attnmem.kernels.ring.step_kind; torch's `_is_causal_behavior` and its three branches):
    "causal" (step 0 of a causal ring: the local shard with the mask), "full" (no mask, all
    x all), "kv_half" (block from a lower rank: all queries x the block's first chunk),
    "q_half" (from a higher rank: the second query chunk x all keys)."""
    c = check_int("world_size", world_size, 1, MAX_WORLD_SIZE)
    return _kind(check_int("rank", rank, 0, c - 1), c, check_int("step", step, 0, c - 1),
                 check_bool("causal", causal))


def _kind(rank: int, world_size: int, step: int, causal: bool) -> str:
    if not causal:
        return "full"
    if step == 0:
        return "causal"
    return "kv_half" if (rank - step) % world_size < rank else "q_half"


def ring_schedule(world_size: int) -> list[list[int]]:
    """held[r][t]: the rank whose key/value block rank r holds at step t, (r - t) mod c
    (Liu et al. 2023, Algorithm 1: each step passes the block to the next rank)."""
    c = check_int("world_size", world_size, 1, MAX_WORLD_SIZE)
    return [[(r - t) % c for t in range(c)] for r in range(c)]


def zigzag_chunks(rank: int, world_size: int) -> tuple[int, int]:
    """The two of 2c sequence chunks that rank r holds under zigzag sharding: (r, 2c-1-r)."""
    c = check_int("world_size", world_size, 1, MAX_WORLD_SIZE)
    r = check_int("rank", rank, 0, c - 1)
    return r, 2 * c - 1 - r


def _steps(rank: int, c: int, causal: bool) -> list[tuple[str, bool]]:
    """(kind, has_next) per step, consecutive equal middle steps folded into one: they hold
    the same tensors, so the peak is the same (keeps the replay O(1) in c)."""
    out: list[tuple[str, bool]] = []
    for t in range(c):
        step = (_kind(rank, c, t, causal), t + 1 < c)
        if t > 0 and out and len(out) > 1 and out[-1] == step:
            continue
        out.append(step)
    return out


def _torch_steps(rank: int, c: int, causal: bool) -> list[tuple[int, str]]:
    """(t, kind) per step of torch's ring, runs of equal (kind, has_next) cut to two (the
    second of a run already holds what every later one does: the previous step's outputs
    are those of the same kind)."""
    out: list[tuple[int, str]] = []
    keys: list[tuple[str, bool]] = []
    for t in range(c):
        key = (_kind(rank, c, t, causal), t + 1 < c)
        if t > 1 and len(keys) >= 2 and keys[-1] == key and keys[-2] == key:
            continue
        out.append((t, key[0]))
        keys.append(key)
    return out


def _ranks(c: int, causal: bool) -> list[int]:
    """Ranks whose folded schedules cover every distinct one (see _steps): all ranks from 1
    to c-3 fold to the same schedule."""
    if not causal:
        return [0]
    return sorted({0, 1, c - 2, c - 1} & set(range(c)))


# ---- our ring (attnmem/kernels/ring/ring.py), replayed --------------------------------------------------

def _triton_step_fwd(rp: TensorReplay, call: AttentionCall, c: int, kind: str,
                     first: bool) -> None:
    m = call.seq_len // c  # local tokens per rank
    n, e, d = m // 2, call.e, call.d
    rows = call.rows_of(n if kind == "q_half" else m)
    rp.alloc("o_b", "this step's output from the kernel", rows * d * e)
    rp.alloc("lse_b", "this step's log-sum-exp from the kernel (fp32)", rows * 4)
    if first:
        rp.alloc("acc_o", "running output, fp32", call.rows_of(m) * d * 4)
        rp.rename("lse_b", "acc_lse")
        rp.relabel("acc_lse", "running log-sum-exp, fp32")
        rp.free("o_b")
        return
    rp.alloc("new", "merge: new log-sum-exp rows (fp32)", rows * 4)
    rp.alloc("w", "merge: weights of the old and the new rows (fp32)", rows * 4)
    rp.free("new", "w", "o_b", "lse_b")


def _triton_forward(rp: TensorReplay, call: AttentionCall, c: int, rank: int) -> None:
    m = call.seq_len // c
    kv_bytes = call.kv_elements(m) * call.e
    cur = None  # key of the received pair held, None: the rank's own (an input)
    for i, (kind, has_next) in enumerate(_steps(rank, c, call.causal)):
        nxt = f"kv{i}"
        if has_next:
            rp.alloc(nxt + "k", "key block received for the next step", kv_bytes)
            rp.alloc(nxt + "v", "value block received for the next step", kv_bytes)
        if cur is not None:  # the pair in use was received: relabel (same bytes)
            for x in "kv":
                rp.relabel(cur + x, "key/value block of this step (received)")
        _triton_step_fwd(rp, call, c, kind, i == 0)
        if has_next:
            if cur is not None:
                rp.free(cur + "k", cur + "v")
            cur = nxt
    if cur is not None:
        rp.free(cur + "k", cur + "v")
    rp.alloc("out", "output (input dtype)", call.rows_of(m) * call.d * call.e)
    rp.free("acc_o")


def _triton_kernel_bwd(rp: TensorReplay, call: AttentionCall, len_q: int, len_k: int) -> None:
    """attention_backward (attnmem/kernels/flash/bwd.py): delta, dk, dv, the GQA split's partial sums,
    dq (and the atomic-dQ fp32 buffer), as attnmem.calc.dispatch decides them."""
    b, h, h_kv, d, e = call.b, call.h, call.h_kv, call.d, call.e
    rows, keys = call.rows_of(len_q), call.kv_elements(len_k)
    rp.alloc("delta", "kernel backward: delta = rowsum(dO·O), fp32", rows * 4)
    rp.alloc("dk_b", "kernel backward: this step's dk, dv", keys * e)
    rp.alloc("dv_b", "kernel backward: this step's dk, dv", keys * e)
    split = dispatch.kv_split(b, h, h_kv, len_q, len_k, d, e)
    if split > 1:
        lab = f"kernel backward: partial dk, dv of the GQA split over {split} programs"
        rp.alloc("dk_out", lab, split * keys * e)
        rp.alloc("dv_out", lab, split * keys * e)
    if dispatch.atomic_dq(b, h, h_kv, len_q, len_k, d, e):
        # In the Hopper region the fp32 dQ buffer holds whole query blocks
        # (attnmem.calc.dispatch.sm90_dq_rows), whichever backward runs; elsewhere s_q rows.
        dq_rows = (b * h * dispatch.sm90_dq_rows(len_q, d)
                   if dispatch.sm90_region(b, h_kv, len_q, len_k, d, e) else rows)
        rp.alloc("dq32", "kernel backward: fp32 dq buffer of the atomic-dQ backward",
                 dq_rows * d * 4)
        rp.alloc("dq_b", "kernel backward: this step's dq", rows * d * e)
        rp.free("dq32")
    else:
        rp.alloc("dq_b", "kernel backward: this step's dq", rows * d * e)
    rp.free("delta")
    if split > 1:
        rp.free("dk_out", "dv_out")


def _triton_backward(rp: TensorReplay, call: AttentionCall, c: int, rank: int) -> None:
    m = call.seq_len // c
    n, e, d = m // 2, call.e, call.d
    kv_bytes, dkv_bytes = call.kv_elements(m) * e, call.kv_elements(m) * 4
    rp.alloc("dq_acc", "dQ accumulator, fp32", call.rows_of(m) * d * 4)
    if call.causal:
        rp.alloc("lse_hi", "second half of the log-sum-exp made contiguous", call.rows_of(n) * 4)
    cur = None
    dsend = None  # key of the dK/dV pair being sent (with the one being received, "drecv")
    for i, (kind, has_next) in enumerate(_steps(rank, c, call.causal)):
        nxt = f"kv{i}"
        if has_next:
            rp.alloc(nxt + "k", "key block received for the next step", kv_bytes)
            rp.alloc(nxt + "v", "value block received for the next step", kv_bytes)
        if cur is not None:
            for x in "kv":
                rp.relabel(cur + x, "key/value block of this step (received)")
        len_q = n if kind == "q_half" else m
        len_k = n if kind == "kv_half" else m
        _triton_kernel_bwd(rp, call, len_q, len_k)
        rp.free("dq_b")
        if i == 0:
            rp.alloc("dkv_k", "dK, dV of the block in hand (fp32)", dkv_bytes)
            rp.alloc("dkv_v", "dK, dV of the block in hand (fp32)", dkv_bytes)
        else:
            rp.free(dsend + "k", dsend + "v")  # the pair sent last step is done
            rp.rename("drecvk", "dkv_k")
            rp.rename("drecvv", "dkv_v")
        rp.free("dk_b", "dv_b")
        for x in "kv":  # dkv goes out; a pair comes in
            rp.rename("dkv_" + x, f"dsend{i}{x}")
            rp.relabel(f"dsend{i}{x}", "dK, dV being sent to the next rank (fp32)")
            rp.alloc("drecv" + x, "dK, dV being received from the previous rank (fp32)",
                     dkv_bytes)
        dsend = f"dsend{i}"
        if has_next:
            if cur is not None:
                rp.free(cur + "k", cur + "v")
            cur = nxt
    if cur is not None:
        rp.free(cur + "k", cur + "v")
    rp.free(dsend + "k", dsend + "v")
    rp.alloc("dk", "dk, dv returned (input dtype)", kv_bytes)
    rp.alloc("dv", "dk, dv returned (input dtype)", kv_bytes)
    rp.free("drecvk", "drecvv")
    rp.alloc("dq", "dq returned (input dtype)", call.rows_of(m) * d * e)
    rp.free("dq_acc")


# ---- torch's context_parallel (_context_parallel/_attention.py, torch 2.13), replayed -----------

def _sdpa_fwd_outputs(rp: TensorReplay, call: AttentionCall, len_q: int, tag: str) -> None:
    rp.alloc("o_b" + tag, "SDPA output of a step (input dtype)", call.rows_of(len_q) * call.d * call.e)
    # the efficient backend pads its log-sum-exp to 32 rows (B, H, ceil(s/32)*32)
    lse_len = len_q if call.impl != "sdpa_efficient" else -(-len_q // 32) * 32
    rp.alloc("lse_b" + tag, "SDPA log-sum-exp of a step (fp32)", call.rows_of(lse_len) * 4)


def _torch_forward(rp: TensorReplay, call: AttentionCall, c: int, rank: int) -> None:
    """_templated_ring_attention with the ALL_GATHER rotater and _SDPAMerger(convert_to_f32)."""
    m = call.seq_len // c
    n, e, d = m // 2, call.e, call.d
    kv2 = 2 * call.kv_elements(m) * e
    prev = None  # tag of the previous step's SDPA outputs (held by `out, logsumexp` until
    for t, kind in _torch_steps(rank, c, call.causal):  # the next call returns)
        if t == 1:
            rp.free("cat0")  # the all-gather's input, held until its wait
        if t < c - 1:
            rp.alloc(f"cat{t}", "k, v concatenated to send (torch.cat)", kv2)
            if t == 0:
                rp.alloc("gathered", "K/V of all c ranks, all-gathered once (ALL_GATHER rotater)",
                         c * kv2)
            else:
                rp.free(f"cat{t}")  # exchange_buffers returns None: dropped at once
        len_q = n if kind == "q_half" else m
        rows = call.rows_of(len_q)
        tag = str(t)
        _sdpa_fwd_outputs(rp, call, len_q, tag)
        if prev is not None:
            rp.free("o_b" + prev)
            if "lse_b" + prev in rp.alive:
                rp.free("lse_b" + prev)
        rp.alloc("o32", "step output cast to fp32 (convert_to_f32)", rows * d * 4)
        if t == 0:  # the merger keeps the first step's fp32 output and log-sum-exp
            rp.rename("o32", "acc_o")
            rp.relabel("acc_o", "running output, fp32")
            rp.rename("lse_b" + tag, "acc_lse")
            rp.relabel("acc_lse", "running log-sum-exp, fp32")
            prev = tag
            continue
        # out = out - sigmoid(block_lse - lse) * (out - block_out), evaluated left to right
        rp.alloc("t1", "merge temporaries (fp32 rows)", rows * 4)
        rp.alloc("t2", "merge temporaries (fp32 rows)", rows * 4)
        rp.free("t1")
        rp.alloc("t3", "merge temporaries (fp32, output-sized)", rows * d * 4)
        rp.alloc("t4", "merge temporaries (fp32, output-sized)", rows * d * 4)
        rp.free("t2", "t3")
        rp.alloc("t5", "merged output (fp32, a new tensor)", rows * d * 4)
        rp.free("t4")
        # lse = lse - logsigmoid(lse - block_lse)
        rp.alloc("l1", "merge temporaries (fp32 rows)", rows * 4)
        rp.alloc("l2", "merge temporaries (fp32 rows)", rows * 4)
        rp.free("l1")
        rp.alloc("l3", "merged log-sum-exp (fp32 rows)", rows * 4)
        rp.free("l2")
        if kind == "q_half":  # _partial_update: torch.cat into new full tensors
            rp.alloc("cat_l", "running log-sum-exp, fp32", call.rows_of(m) * 4)
            rp.free("acc_lse", "l3")
            rp.rename("cat_l", "acc_lse")
            rp.alloc("cat_o", "merged output re-assembled by torch.cat (fp32)",
                     call.rows_of(m) * d * 4)
            rp.free("acc_o", "t5")
            rp.rename("cat_o", "acc_o")
        else:
            rp.free("acc_o", "acc_lse")
            rp.rename("t5", "acc_o")
            rp.rename("l3", "acc_lse")
        rp.relabel("acc_o", "running output, fp32")
        rp.relabel("acc_lse", "running log-sum-exp, fp32")
        rp.free("o32")
        prev = tag
    rp.alloc("out", "output (input dtype)", call.rows_of(m) * d * e)
    rp.free("acc_o", "o_b" + prev, "gathered")
    if "lse_b" + prev in rp.alive:
        rp.free("lse_b" + prev)


def _sdpa_bwd_internals(rp: TensorReplay, call: AttentionCall, len_q: int, len_k: int,
                        tag: str) -> None:
    """One SDPA backward call of the ring (attnmem.calc.peak's terms for that backend, per step)."""
    rows, keys, d, e = call.rows_of(len_q), call.kv_elements(len_k), call.d, call.e
    rp.alloc("bdelta", "SDPA backward: row sums of dO·O (fp32)", rows * 4)
    rp.alloc("bacc", "SDPA backward: fp32 dq accumulator", rows * d * 4)
    if call.impl == "sdpa_flash":
        rp.alloc("bws", "SDPA backward: fp32 output-sized workspace", rows * d * 4)
    if call.impl == "sdpa_efficient":
        rp.alloc("bws", "SDPA backward: dO copied to the kernel's layout", rows * d * e)
    rp.alloc("gq" + tag, "SDPA backward: this step's dq, dk, dv", rows * d * e)
    rp.alloc("gk" + tag, "SDPA backward: this step's dq, dk, dv", 2 * keys * e)
    rp.free("bdelta", "bacc")
    if call.impl in ("sdpa_flash", "sdpa_efficient"):
        rp.free("bws")


def _torch_backward(rp: TensorReplay, call: AttentionCall, c: int, rank: int) -> None:
    """_templated_ring_attention_backward: fp32 accumulators, K/V all-gathered again, dK/dV
    concatenated and sent by an all-to-all permute every step."""
    m = call.seq_len // c
    n, e, d = m // 2, call.e, call.d
    kv, kv2 = call.kv_elements(m), 2 * call.kv_elements(m) * e
    dkv = 2 * kv * 4
    rp.alloc("gq_acc", "dQ accumulator, fp32 (zeros_like)", call.rows_of(m) * d * 4)
    rp.alloc("gkv0", "dK, dV accumulators, fp32", dkv)
    owner = "gkv0"  # what grad_key, grad_value are (or are views of)
    inbox = None  # the dK, dV received at the previous step
    sent = None  # the dK, dV concatenated and sent at the previous step
    prev = None
    last_cat = None
    for t, kind in _torch_steps(rank, c, call.causal):
        if t < c - 1:
            rp.alloc(f"bcat{t}", "k, v concatenated to send (torch.cat)", kv2)
            if t == 0:
                rp.alloc("gathered", "K/V of all c ranks, all-gathered once (ALL_GATHER rotater)",
                         c * kv2)
            else:
                rp.free(last_cat)  # next_kv reassigned
            last_cat = f"bcat{t}"
        if kind == "q_half":
            rp.alloc(f"lse{t}", "second half of the log-sum-exp made contiguous",
                     call.rows_of(n) * 4)
        tag = str(t)
        _sdpa_bwd_internals(rp, call, n if kind == "q_half" else m,
                            n if kind == "kv_half" else m, tag)
        if prev is not None:
            rp.free("gq" + prev, "gk" + prev)
            if f"lse{prev}" in rp.alive:
                rp.free(f"lse{prev}")
        if t > 0:
            rp.free(sent)  # next_grad_kv = the received buffer
            old, owner = owner, inbox  # grad_key, grad_value: views of it
            rp.free(old)
            if kind == "kv_half":  # _partial_update: two torch.cat
                rp.alloc(f"pc{t}", "dK, dV re-assembled by torch.cat (fp32)", dkv)
                owner = f"pc{t}"
        sent = f"sent{t}"
        rp.alloc(sent, "dK, dV concatenated to send (fp32)", dkv)
        rp.alloc(f"inbox{t + 1}", "dK, dV received by the all-to-all permute (fp32)", dkv)
        if inbox is not None and inbox != owner:
            rp.free(inbox)  # neither next_grad_kv nor the rotater holds it any more
        inbox = f"inbox{t + 1}"
        if kind == "q_half":
            rp.alloc("gq_cat", "dQ re-assembled by torch.cat (fp32)", call.rows_of(m) * d * 4)
            rp.free("gq_acc")
            rp.rename("gq_cat", "gq_acc")
        prev = tag
    rp.alloc("gq", "dq returned (input dtype)", call.rows_of(m) * d * e)
    rp.free("gq_acc")
    rp.alloc("gkv", "dk, dv returned (input dtype)", kv2)


# ---- public -----------------------------------------------------------------------------------

def _replay(call: AttentionCall, c: int, rank: int) -> TensorReplay:
    """One rank's tensors, replayed by attnmem.calc.allocator.TensorReplay as with expandable
    segments: every block is split, so each tensor counts its size rounded up to 512 B
    (`round_size`; the ring is counted without the whole-segment rounding of attnmem.calc.peak)."""
    rp = TensorReplay()
    if call.impl == "triton":
        _triton_forward(rp, call, c, rank)
        if call.backward:
            # returned: O and the log-sum-exp are saved for the backward
            rp.relabel("out", "output, saved for the backward")
            rp.relabel("acc_lse", "log-sum-exp, saved for the backward (fp32)")
            _triton_backward(rp, call, c, rank)
    else:
        _torch_forward(rp, call, c, rank)
        if call.backward:
            _torch_backward(rp, call, c, rank)
    return rp


def _terms(rp: TensorReplay) -> list[Term]:
    """The tensors alive at the rank's peak, (label, counted bytes), one entry per label."""
    out: dict[str, int] = {}
    for label, _, counted, _ in rp.at_peak:
        out[label] = out.get(label, 0) + counted
    return list(out.items())


def _best(call: AttentionCall, c: int, rank: int | None) -> tuple[int, TensorReplay]:
    if rank is not None:
        r = check_int("rank", rank, 0, c - 1)
        return r, _replay(call, c, r)
    best = None
    for r in _ranks(c, call.causal):
        rp = _replay(call, c, r)
        if best is None or rp.peak > best[1].peak:
            best = (r, rp)
    return best


def context_parallel_terms(
    impl: str | AttentionCall, batch: int | None = None, heads: int | None = None,
    seq_len: int | None = None, head_dim: int | None = None, dtype: str | None = None,
    causal: bool = False, backward: bool = False, world_size: int = 1,
    kv_heads: int | None = None, rank: int | None = None,
) -> list[Term]:
    """The tensors alive on one rank at its peak, (label, bytes), summing to
    `context_parallel_peak_bytes`. ``rank`` None: the rank with the largest peak. `impl` may
    be an AttentionCall given alone (world_size and rank as keywords)."""
    call, c = _ring(impl, batch, heads, seq_len, head_dim, dtype, causal, backward, world_size,
                    kv_heads)
    if c == 1:
        return attention_peak_terms(call)
    return _terms(_best(call, c, rank)[1])


def context_parallel_peak_bytes(
    impl: str | AttentionCall, batch: int | None = None, heads: int | None = None,
    seq_len: int | None = None, head_dim: int | None = None, dtype: str | None = None,
    causal: bool = False, backward: bool = False, world_size: int = 1,
    kv_heads: int | None = None, rank: int | None = None,
) -> int:
    """Predicted extra peak bytes on one rank of a c-rank ring attention call over a sequence
    of seq_len tokens (each rank: seq_len/c queries and keys), beyond the rank's local q, k, v
    (and dO): the module docstring says what is counted. ``rank`` None: the largest over the
    ranks (what every GPU must have room for). ValueError for seq_len not divisible by c
    (2c when causal: zigzag). `impl` may be an AttentionCall given alone (world_size and
    rank as keywords)."""
    return sum(b for _, b in context_parallel_terms(
        impl, batch, heads, seq_len, head_dim, dtype, causal, backward, world_size, kv_heads,
        rank))


@dataclass(frozen=True)
class ContextParallelMemory:
    """One rank of a ring attention call, in bytes."""

    world_size: int
    rank: int  # the rank described (the one with the largest peak unless asked)
    local_seq_len: int  # s / c
    inputs_bytes: int  # local q, k, v (and dO with backward)
    peak_extra_bytes: int
    terms: tuple[Term, ...]

    @property
    def total_bytes(self) -> int:
        return self.inputs_bytes + self.peak_extra_bytes


def context_parallel_memory(
    impl: str | AttentionCall, batch: int | None = None, heads: int | None = None,
    seq_len: int | None = None, head_dim: int | None = None, dtype: str | None = None,
    causal: bool = False, backward: bool = False, world_size: int = 1,
    kv_heads: int | None = None, rank: int | None = None,
) -> ContextParallelMemory:
    """What one GPU holds: its inputs (m = s/c tokens of q, k, v and dO) and the extra peak.
    `impl` may be an AttentionCall given alone (world_size and rank as keywords)."""
    call, c = _ring(impl, batch, heads, seq_len, head_dim, dtype, causal, backward, world_size,
                    kv_heads)
    m, e = call.seq_len // c, call.e
    # each input counted as its 512 B-rounded block (attnmem.calc.allocator.round_size)
    inputs = round_size(call.rows_of(m) * call.d * e) + 2 * round_size(call.kv_elements(m) * e)
    if call.backward:
        inputs += round_size(call.rows_of(m) * call.d * e)
    if c == 1:
        terms = attention_peak_terms(call)
        r = 0
    else:
        r, rp = _best(call, c, rank)
        terms = _terms(rp)
    return ContextParallelMemory(c, r, m, inputs, sum(b for _, b in terms), tuple(terms))


@dataclass(frozen=True)
class CommVolume:
    """Bytes one rank sends per attention call (it receives as many)."""

    forward_bytes: int  # (c-1) key/value blocks
    backward_bytes: int  # (c-1) key/value blocks again, plus c hops of fp32 dK, dV
    steps: int  # ring steps per pass: c

    @property
    def total_bytes(self) -> int:
        return self.forward_bytes + self.backward_bytes


def ring_comm_bytes(
    batch: int, heads: int, seq_len: int, head_dim: int, dtype: str, world_size: int,
    kv_heads: int | None = None, backward: bool = True, impl: str = "triton",
) -> CommVolume:
    """Bytes sent per rank per attention call. Forward: (c-1)·2·B·H_kv·(s/c)·d·e, the key
    and value block passed on at every step but the last (Liu et al. 2023, sec. 3: each
    block makes c-1 hops). Backward: the same again (the blocks rotate once more) plus
    c·2·B·H_kv·(s/c)·d·4, the fp32 dK, dV travelling with their block, c hops so that they
    end on their own rank (attnmem/kernels/ring/ring.py; torch's backward sends them every step with
    its all-to-all permute, also in fp32). torch's default all-gather moves the same key/value
    bytes per rank as c-1 ring hops (a ring all-gather). Causal or not does not change it."""
    call, c = _ring(impl, batch, heads, seq_len, head_dim, dtype, False, backward, world_size,
                    kv_heads)
    kv = call.kv_elements(call.seq_len // c)
    fwd = (c - 1) * 2 * kv * call.e
    bwd = ((c - 1) * 2 * kv * call.e + c * 2 * kv * 4) if backward and c > 1 else 0
    return CommVolume(fwd, bwd, c)


def ring_step_flops(batch: int, heads: int, seq_len: int, head_dim: int, world_size: int,
                    causal: bool = True) -> int:
    """FLOPs of one ring step's local work past the first (forward, 4·B·H·len_q·len_k·d):
    m x m/2 with zigzag (either half), m x m without a mask (m = s/c)."""
    b = check_int("batch", batch, 1, MAX_BATCH)
    h = check_int("heads", heads, 1, MAX_HEADS)
    s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    d = check_int("head_dim", head_dim, 1, MAX_HEAD_DIM)
    c = check_int("world_size", world_size, 1, MAX_WORLD_SIZE)
    m = s // c
    return 4 * b * h * m * (m // 2 if causal else m) * d


# ---- training on c GPUs -------------------------------------------------------------------------

#: The phases of attnmem.calc.training_step whose moment holds one attention call's forward transient,
#: and those that hold the larger of its backward extra peak and the MLP's backward.
_FWD_PHASE = "forward: attention of the last layer"
_BWD_PHASES = ("backward of the last layer", "backward of layer 0")


@dataclass(frozen=True)
class ContextParallelTraining:
    """One training step on each of c GPUs holding s/c tokens of every sequence (bytes)."""

    world_size: int
    local_seq_len: int
    step: object  # attnmem.calc.training_step.TrainingStepMemory for s/c tokens on c GPUs
    ring_forward_bytes: int  # one ring attention call's extra peak, forward
    ring_backward_bytes: int  # ... forward + backward
    plain_forward_bytes: int  # what training_step counts for that call (s/c tokens, one GPU)
    plain_backward_bytes: int
    phases: tuple[tuple[str, int], ...]  # training_step's moments with the ring's calls

    @property
    def total_bytes(self) -> int:
        return max(b for _, b in self.phases)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: p[1])[0]

    @property
    def before_step_bytes(self) -> int:
        return self.step.before_step_bytes

    @property
    def activations_bytes(self) -> int:
        return self.step.activations_bytes


def context_parallel_training(
    model: ModelConfig, world_size: int, seq_len: int, batch: int = 1, *,
    impl: str = "triton", precision: str = "bf16", checkpointing: bool = True,
    shard_states: bool = True,
) -> ContextParallelTraining:
    """Peak per GPU of a causal training step with the sequence split over c GPUs.

    Each GPU runs attnmem.calc.training_step on s/c tokens (its zigzag shard; activations, logits and
    loss all scale with the local tokens) with the c GPUs as its parallel group: weights,
    gradients and AdamW state sharded over them with FSDP when ``shard_states`` (as Llama 3
    trains, FSDP over the context-parallel group, arXiv 2407.21783 sec. 3.3.2; torchtitan's
    dp_shard_cp mesh), else replicated with DDP's gradient buckets. Attention is then the ring:
    the step's forward moment gets the ring's forward extra instead of a plain call's over s/c
    tokens, and its backward moments the ring's backward extra where it exceeds the plain
    call's (an upper bound where the MLP's backward was the larger there). training_step's
    saved output and log-sum-exp per layer are the ring's too (s/c rows)."""
    from attnmem.calc.training_step import training_step

    check_model(model)
    c = check_int("world_size", world_size, 1, MAX_WORLD_SIZE)
    b = check_int("batch", batch, 1, MAX_BATCH)
    s = check_int("seq_len", seq_len, 1, MAX_SEQ_LEN)
    check_bool("shard_states", shard_states)
    # the ring's call over s tokens, forward and forward + backward, checked once
    calls = [_ring(impl, b, model.num_heads, s, model.head_dim, "bf16", True, bw, c,
                   model.num_kv_heads)[0] for bw in (False, True)]
    ring = [context_parallel_peak_bytes(call, world_size=c) for call in calls]
    m = s // c
    step = training_step(model, b, m, attention=impl, precision=precision,
                         checkpointing=checkpointing, gpus=c,
                         sharding="fsdp" if shard_states and c > 1 else "none")
    plain = [attention_peak_bytes(call.with_seq_len(m)) for call in calls]
    phases = dict(step.phases)
    if _FWD_PHASE in phases:
        phases[_FWD_PHASE] += ring[0] - plain[0]
    for name in _BWD_PHASES:
        if name in phases:
            phases[name] += max(0, ring[1] - plain[1])
    return ContextParallelTraining(c, m, step, ring[0], ring[1], plain[0], plain[1],
                                   tuple(phases.items()))


def max_context_parallel_seq_len(
    model: ModelConfig, gpu_bytes: int, world_size: int, batch: int = 1, *,
    impl: str = "triton", precision: str = "bf16", checkpointing: bool = True,
    shard_states: bool = True,
) -> int:
    """Longest causal context (a multiple of 2c, zigzag) whose `context_parallel_training`
    peak fits gpu_bytes on each of c GPUs; 0 if none. Exact search over multiples of 2c."""
    from attnmem.calc.fit import largest_fitting

    c = check_int("world_size", world_size, 1, MAX_WORLD_SIZE)
    unit = 2 * c if c > 1 else 1
    if isinstance(gpu_bytes, bool) or not isinstance(gpu_bytes, (int, float)) or not (
            gpu_bytes >= 0):
        raise ValueError(f"gpu_bytes must be a number of bytes >= 0, got {gpu_bytes!r}")
    context_parallel_training(model, c, unit, batch, impl=impl, precision=precision,
                              checkpointing=checkpointing, shard_states=shard_states)

    def cost(k: int) -> int:
        return context_parallel_training(model, c, k * unit, batch, impl=impl,
                                         precision=precision, checkpointing=checkpointing,
                                         shard_states=shard_states).total_bytes

    return unit * largest_fitting(cost, gpu_bytes, hi=MAX_SEQ_LEN // unit)


def max_context_parallel_attention_seq_len(
    impl: str, budget_bytes: int, batch: int, heads: int, head_dim: int, dtype: str,
    causal: bool = True, backward: bool = True, world_size: int = 1,
    kv_heads: int | None = None,
) -> int:
    """Longest s (a multiple of 2c when causal, c otherwise) whose per-rank inputs plus ring
    extra peak (`context_parallel_memory(...).total_bytes`) fit budget_bytes; 0 if none."""
    from attnmem.calc.fit import largest_fitting

    c = check_int("world_size", world_size, 1, MAX_WORLD_SIZE)
    unit = (2 * c if causal else c) if c > 1 else 1
    call, _ = _ring(impl, batch, heads, unit, head_dim, dtype, causal, backward, c, kv_heads)

    def cost(k: int) -> int:  # the ring's rules are checked again at each length
        return context_parallel_memory(call.with_seq_len(k * unit), world_size=c).total_bytes

    return unit * largest_fitting(cost, budget_bytes, hi=MAX_SEQ_LEN // unit)
