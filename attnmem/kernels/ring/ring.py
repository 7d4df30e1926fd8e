"""Ring attention (context parallelism) over the bundled FlashAttention kernel.

The sequence is split over the c ranks of a process group; each rank keeps its own queries
and passes its key/value block around the ring, one hop per step, so that after c steps every
query has met every key (Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise
Transformers", arXiv 2310.01889, Algorithm 1). Each step's partial output is merged into the
running one by its log-sum-exp (the online softmax of FlashAttention, Dao et al. 2022,
arXiv 2205.14135, section 3.1, applied across blocks). The backward sends the key/value
blocks around once more and the partial dK, dV travel WITH their block, so that after the
last hop every rank receives the complete dK, dV of its own block (as zhuzilin's
ring-flash-attention and torch's ``_templated_ring_attention_backward`` do).

Causal attention is load-balanced by zigzag sharding: the sequence is cut into 2c chunks and
rank r holds chunks r and 2c-1-r (Llama 3 paper, Dubey et al. 2024, arXiv 2407.21783,
section 3.3.2 "context parallelism"; zhuzilin/ring-flash-attention's zigzag ring). Then:
- step 0 (its own block): one causal call on the local shard (top-left alignment gives
  exactly the two diagonal chunks and the chunk below them);
- a block from a rank j < r: every local query sees the block's FIRST chunk, none of its
  second: all queries x first half of the keys, no mask;
- a block from a rank j > r: only the local SECOND chunk of queries sees it, in full:
  second half of the queries x all keys, no mask.
Every step past the first is the same work, s/c x s/(2c) per rank.

What one rank allocates (attnmem/calc/context_parallel.py mirrors this timeline tensor by tensor;
R = B*H*m query rows, KV = B*H_kv*m*d elements of one key block, m = s/c, e = element bytes):
- forward: the incoming key/value pair of the next step (double buffering: the current
  received pair and the next one, 2*KV*e each), an fp32 running output (R*d*4) and log-sum-exp
  (R*4), each step's output and log-sum-exp from the kernel plus two row vectors of the merge,
  then the output cast to the input dtype;
- backward: an fp32 dQ accumulator (R*d*4), the second half of the log-sum-exp made
  contiguous (causal), the key/value pairs in flight as in the forward, the fp32 dK, dV that
  travel (the pair being sent and the pair being received, 2*KV*4 each), each step's kernel
  backward (delta, dq, dk, dv and its dispatch-dependent buffers, attnmem.calc.dispatch), and at the
  end dQ, dK, dV cast to the input dtype.
With c = 1 the call is `flash_attention` itself.
"""

from __future__ import annotations

import math

import torch

_ROWS_DIM = 2  # (B, H, s, d): the sequence axis


# ---- sharding -------------------------------------------------------------------------------

def _check_split(seq_len: int, world_size: int, causal: bool) -> int:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a whole number of at least 1, got {world_size!r}")
    parts = 2 * world_size if causal else world_size
    if seq_len % parts:
        what = ("2·world_size chunks (zigzag: rank r holds chunks r and 2c-1-r)" if causal
                else "world_size chunks")
        raise ValueError(f"seq_len {seq_len} must divide into {what}: {parts} does not divide "
                         f"it; accepted: multiples of {parts}")
    return seq_len // parts


def zigzag_shard(x: torch.Tensor, rank: int, world_size: int, dim: int = _ROWS_DIM
                 ) -> torch.Tensor:
    """Rank ``rank``'s zigzag shard of x: chunks rank and 2c-1-rank of 2c equal chunks along
    ``dim``, concatenated (a new contiguous tensor)."""
    n = _check_split(x.shape[dim], world_size, True)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be from 0 to {world_size - 1}, got {rank}")
    first = x.narrow(dim, rank * n, n)
    second = x.narrow(dim, (2 * world_size - 1 - rank) * n, n)
    return torch.cat([first, second], dim=dim)


def zigzag_unshard(shards: list[torch.Tensor], dim: int = _ROWS_DIM) -> torch.Tensor:
    """The full tensor from the c zigzag shards (rank order)."""
    c = len(shards)
    if c == 0:
        raise ValueError("zigzag_unshard needs at least one shard")
    halves = [s.chunk(2, dim=dim) for s in shards]
    return torch.cat([halves[r][0] for r in range(c)]
                     + [halves[r][1] for r in reversed(range(c))], dim=dim)


def shard(x: torch.Tensor, rank: int, world_size: int, causal: bool, dim: int = _ROWS_DIM
          ) -> torch.Tensor:
    """The shard that `ring_attention` expects on ``rank``: zigzag when causal, else the
    rank-th of c contiguous chunks."""
    if not causal:
        m = _check_split(x.shape[dim], world_size, False)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be from 0 to {world_size - 1}, got {rank}")
        return x.narrow(dim, rank * m, m).contiguous()
    return zigzag_shard(x, rank, world_size, dim)


def unshard(shards: list[torch.Tensor], causal: bool, dim: int = _ROWS_DIM) -> torch.Tensor:
    """Inverse of `shard` over all ranks."""
    return zigzag_unshard(shards, dim) if causal else torch.cat(list(shards), dim=dim)


# ---- communication --------------------------------------------------------------------------

class P2PRing:
    """Send tensors to the next rank and receive the previous rank's, with
    torch.distributed point-to-point operations (batch_isend_irecv: NCCL or gloo)."""

    def __init__(self, group=None):
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        to_global = (lambda r: r) if group is None else (
            lambda r: dist.get_global_rank(group, r))
        self._next = to_global((self.rank + 1) % self.size)
        self._prev = to_global((self.rank - 1) % self.size)

    def begin(self, phase: str) -> None:
        """A pass starts ("fwd" or "bwd"); nothing to do for real communication."""

    def mark(self, phase: str, step: int, where: str) -> None:
        """Hook around each step's local work (the one-rank simulator times steps)."""

    def start(self, tensors: tuple[torch.Tensor, ...], kind: str):
        """Start sending ``tensors`` to the next rank; receive as many from the previous one
        into fresh buffers (torch.empty_like). Returns a handle for `wait`."""
        dist = self._dist
        recvs = tuple(torch.empty_like(t) for t in tensors)
        ops = [dist.P2POp(dist.isend, t, self._next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, self._prev, self.group) for b in recvs]
        return dist.batch_isend_irecv(ops), tensors, recvs

    def wait(self, handle) -> tuple[torch.Tensor, ...]:
        """Wait for a `start`: the sent tensors may be freed after it; returns the received."""
        reqs, _sent, recvs = handle
        for req in reqs:
            req.wait()
        return recvs


# ---- the passes -----------------------------------------------------------------------------

def _kernels():
    """attention_forward, attention_backward of the bundled kernel, as routed by
    attnmem.kernels.flash.route (imported on first use: triton reads TRITON_INTERPRET when it is
    first imported)."""
    from attnmem.kernels.flash.route import attention_backward, attention_forward

    return attention_forward, attention_backward


def _config(q: torch.Tensor):
    """The KernelConfig of a ring step: on CPU tensors (Triton's interpreter) one small fixed
    tile with the portable forward and the two-kernel backward, as flash_attention runs
    there; None (the kernel's own rules) on a GPU."""
    if q.device.type == "cpu":
        from attnmem.kernels.flash.config import KernelConfig, Tiles

        return KernelConfig(tiles=Tiles(32, 32, 4, 1), sm90=False, atomic_dq=False)
    return None


def step_kind(rank: int, world_size: int, step: int, causal: bool) -> str:
    """What rank ``rank`` computes at ring step ``step`` (it then holds the block of rank
    (rank - step) mod c): "causal" (step 0 of a causal ring: the local shard with the mask),
    "full" (all queries x all keys), "kv_half" (all queries x the block's first chunk: the
    block came from a lower rank) or "q_half" (the second chunk of queries x all keys: from
    a higher rank)."""
    if not causal:
        return "full"
    if step == 0:
        return "causal"
    src = (rank - step) % world_size
    return "kv_half" if src < rank else "q_half"


def ring_forward(q, k, v, causal: bool, scale: float, comm):
    """Rank comm.rank's ring forward: (O in q's dtype, lse2 fp32 (B, H, m), base 2)."""
    attention_forward, _ = _kernels()
    c, rank = comm.size, comm.rank
    cfg = _config(q)
    n = q.shape[_ROWS_DIM] // 2
    comm.begin("fwd")
    acc_o = acc_lse = None
    cur = (k, v)
    for t in range(c):
        handle = comm.start(cur, "kv") if t + 1 < c else None
        comm.mark("fwd", t, "begin")
        kind = step_kind(rank, c, t, causal)
        ck, cv = cur
        if kind == "kv_half":
            ck, cv = ck[:, :, :n], cv[:, :, :n]
        qs = q[:, :, n:] if kind == "q_half" else q
        o_b, lse_b = attention_forward(qs, ck, cv, kind == "causal", scale, cfg)
        if t == 0:
            acc_o = o_b.to(torch.float32, copy=True)  # the running output, fp32
            acc_lse = lse_b
        else:
            if kind == "q_half":
                ao, al = acc_o[:, :, n:], acc_lse[:, :, n:]
            else:
                ao, al = acc_o, acc_lse
            # merge by log-sum-exp (base 2): l = log2(2^a + 2^b); o = o*2^(a-l) + o_b*2^(b-l)
            new = torch.logaddexp2(al, lse_b)
            w = torch.sub(al, new).exp2_()
            ao.mul_(w.unsqueeze(-1))
            torch.sub(lse_b, new, out=w).exp2_()
            ao.addcmul_(o_b, w.unsqueeze(-1))
            al.copy_(new)
            del new, w, ao, al
        del o_b, lse_b, ck, cv
        comm.mark("fwd", t, "end")
        if handle is not None:
            cur = comm.wait(handle)
            del handle
    del cur
    out = acc_o.to(q.dtype)
    del acc_o
    return out, acc_lse


def ring_backward(do, q, k, v, o, lse2, causal: bool, scale: float, comm):
    """Rank comm.rank's ring backward: (dq, dk, dv) in the inputs' dtype."""
    _, attention_backward = _kernels()
    c, rank = comm.size, comm.rank
    cfg = _config(q)
    n = q.shape[_ROWS_DIM] // 2
    comm.begin("bwd")
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    # the kernel reads the log-sum-exp as a contiguous (B, H, rows) array
    lse_hi = lse2[:, :, n:].contiguous() if causal else None
    cur = (k, v)
    dkv = dhandle = None
    for t in range(c):
        handle = comm.start(cur, "kv") if t + 1 < c else None
        comm.mark("bwd", t, "begin")
        kind = step_kind(rank, c, t, causal)
        ck, cv = cur
        if kind == "kv_half":
            ck, cv = ck[:, :, :n], cv[:, :, :n]
        if kind == "q_half":
            args = (do[:, :, n:], q[:, :, n:], ck, cv, o[:, :, n:], lse_hi)
        else:
            args = (do, q, ck, cv, o, lse2)
        dq_b, dk_b, dv_b = attention_backward(*args, kind == "causal", scale, cfg)
        del args, ck, cv
        (dq_acc[:, :, n:] if kind == "q_half" else dq_acc).add_(dq_b)
        del dq_b
        if t == 0:
            dkv = (dk_b.to(torch.float32, copy=True), dv_b.to(torch.float32, copy=True))
        else:
            dkv = comm.wait(dhandle)  # this block's dK, dV so far; the pair we sent is done
            del dhandle
            if kind == "kv_half":
                dkv[0][:, :, :n].add_(dk_b)
                dkv[1][:, :, :n].add_(dv_b)
            else:
                dkv[0].add_(dk_b)
                dkv[1].add_(dv_b)
        del dk_b, dv_b
        dhandle = comm.start(dkv, "dkv")  # on to the next rank, with its block
        dkv = None
        comm.mark("bwd", t, "end")
        if handle is not None:
            cur = comm.wait(handle)
            del handle
    del cur
    dkv = comm.wait(dhandle)  # after c hops: our own block's complete dK, dV
    del dhandle
    dk = dkv[0].to(k.dtype)
    dv = dkv[1].to(v.dtype)
    del dkv
    dq = dq_acc.to(q.dtype)
    del dq_acc
    return dq, dk, dv


class RingAttentionFunction(torch.autograd.Function):
    """Forward saves q, k, v (the caller's), O and the merged lse2; backward runs the ring
    again with the dK, dV travelling."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, comm):
        o, lse2 = ring_forward(q, k, v, causal, scale, comm)
        ctx.save_for_backward(q, k, v, o, lse2)
        ctx.causal, ctx.scale, ctx.comm = causal, scale, comm
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse2 = ctx.saved_tensors
        dq, dk, dv = ring_backward(do, q, k, v, o, lse2, ctx.causal, ctx.scale, ctx.comm)
        return dq, dk, dv, None, None, None


def _check_local(q, k, v, causal: bool, world_size: int) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-d tensor (batch, heads, local seq, head_dim), "
                             f"got {getattr(t, 'shape', type(t).__name__)}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"k, v must be (B, H_kv, m, d) with q's B and d, got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads must be a multiple of key/value heads (GQA), got "
                         f"H={q.shape[1]}, H_kv={k.shape[1]}")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"each rank holds as many keys as queries (s/c each), got q "
                         f"{q.shape[2]}, k {k.shape[2]}")
    if causal and world_size > 1 and q.shape[2] % 2:
        raise ValueError(f"causal ring attention needs zigzag shards of two equal chunks: "
                         f"local length {q.shape[2]} is odd (accepted: even lengths, from "
                         "`shard(x, rank, c, causal=True)`)")


def ring_attention_with(comm, q, k, v, causal: bool = False, scale: float | None = None):
    """`ring_attention` over any communicator with rank, size, begin, mark, start, wait (the
    process group's `P2PRing`, or the one-device simulator of attnmem/kernels/ring/measure_one_rank)."""
    _check_local(q, k, v, causal, comm.size)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if comm.size == 1:
        from attnmem.kernels.flash.api import flash_attention

        return flash_attention(q, k, v, causal=causal, scale=scale)
    # what is sent must be dense; inputs that already are are not copied
    k, v = k.contiguous(), v.contiguous()
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return RingAttentionFunction.apply(q, k, v, bool(causal), float(scale), comm)
    return ring_forward(q, k, v, bool(causal), float(scale), comm)[0]


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   group=None, scale: float | None = None) -> torch.Tensor:
    """Exact attention over a sequence split across the ranks of ``group`` (default: the
    whole world; without an initialised process group, one rank).

    Each rank passes its local shards: q (B, H, m, d), k and v (B, H_kv, m, d) with
    m = s/c (GQA: H % H_kv == 0), cut by `shard` (zigzag when causal: chunks r and 2c-1-r of
    2c; contiguous otherwise); returns this rank's output rows (B, H, m, d), in the same
    layout. Differentiable in q, k, v (dk, dv are the gradients of THIS rank's key block,
    contributions of every rank summed). NCCL for CUDA tensors (each rank's tensors on its
    own device, torch.cuda.set_device(local_rank) before the first call), gloo for CPU
    tensors (where the kernel runs under Triton's interpreter). ``scale`` defaults to
    1/sqrt(d). Every rank must call it with the same shapes, ``causal`` and ``scale``.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        class _One:
            rank, size = 0, 1
        return ring_attention_with(_One(), q, k, v, causal, scale)
    return ring_attention_with(P2PRing(group), q, k, v, causal, scale)
