"""Plans: the cross product of the command line (``expand``), and the bundled H200 reference
sweep (``reference_plan``, ``--plan h200``). No torch or transformers at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kernels.measure.train.config import TrainConfig


def expand(models: Iterable[str], seq_lens: Iterable[int], attentions: Iterable[str],
           precisions: Iterable[str], checkpointings: Iterable[bool], *, batch: int = 1,
           layers: int | None = None, steps: int = 3) -> list[TrainConfig]:
    """The cross product; each series runs short to long (so an OOM skips the longer ones)."""
    seq = sorted(set(int(s) for s in seq_lens))
    return [TrainConfig(m, s, a, p, bool(c), batch, layers, steps)
            for m in models for p in precisions for c in checkpointings for a in attentions
            for s in seq]


#: Lengths of the reference sweep: non-powers of two among them (1,000, 3,000, 12,000).
REF_LENGTHS = (1000, 3000, 8192, 12000, 32768)


def reference_plan() -> list[TrainConfig]:
    """The H200 reference sweep (item 5 of issue 17), most important first, so that a time
    budget cuts the least important rows.

    0. Coverage first: every architecture with sdpa_flash and triton in bf16 at 1,000 and
       8,192 tokens without checkpointing, so that even a short run measures GQA and MHA,
       tied and untied embeddings, 100k+ vocabularies and sliding windows. Then:
    1. llama3-8b-2l (GQA, 128k vocab, untied): eager, sdpa_flash, sdpa_cudnn, triton x bf16,
       amp_bf16 x checkpointing off/on x s = 1,000 ... 32,768; FlashAttention-4 in bf16 at
       1,000, 8,192, 32,768 (unavailable rows where it is not installed).
    2. llama3-8b-4l, the same model with 4 layers, bf16 and amp_bf16, checkpointing off/on, at
       1,000, 3,000, 8,192 (per-layer cost = 4l - 2l; linear in L).
    3. Every other architecture (MHA: llama2-7b, phi3-mini; tied: llama3.2-1b, qwen3-4b,
       gemma 2/3; sliding window: mistral, phi3, gemma 2/3): sdpa_flash and triton in bf16
       with checkpointing off/on at 1,000, 3,000, 8,192 (triton runs a window shorter than s
       with its causal sliding window; it refuses Gemma 2's soft-capping: an unavailable row,
       no time spent), eager in bf16 at 1,000 and 8,192.
    4. The same architectures in amp_bf16 (checkpointing off) with sdpa_flash and triton, and
       sdpa_cudnn in bf16.
    5. The long end: 12,000 and 32,768 for every other architecture, sdpa_flash and triton,
       bf16, checkpointing on and off.
    """
    plan: list[TrainConfig] = []
    main4 = ("sdpa_flash", "triton", "sdpa_cudnn", "eager")
    plan += expand(["llama3-8b-2l"], REF_LENGTHS, main4, ["bf16", "amp_bf16"], [False, True])
    plan += expand(["llama3-8b-2l"], (1000, 8192, 32768), ("fa4",), ["bf16"], [False, True])
    plan += expand(["llama3-8b-4l"], (1000, 3000, 8192), ("sdpa_flash", "triton", "eager"),
                   ["bf16", "amp_bf16"], [False, True])
    others = ("llama2-7b-2l", "qwen2.5-7b-2l", "qwen3-4b-2l", "llama3.2-1b-2l", "mistral-7b-2l",
              "gemma3-27b-2l", "gemma2-9b-2l", "phi3-mini-2l")
    plan += expand(others, (1000, 3000, 8192), ("sdpa_flash", "triton"), ["bf16"],
                   [False, True])
    plan += expand(others, (1000, 8192), ("eager",), ["bf16"], [False])
    plan += expand(others, (1000, 8192), ("sdpa_flash", "triton"), ["amp_bf16"], [False])
    plan += expand(others, (1000, 8192), ("sdpa_cudnn",), ["bf16"], [False])
    plan += expand(others, (12000, 32768), ("sdpa_flash", "triton"), ["bf16"], [False, True])
    first = expand(["llama3-8b-2l", *others], (1000, 8192), ("sdpa_flash", "triton"), ["bf16"],
                   [False])
    def key(c: TrainConfig) -> tuple:
        return (c.model, c.seq_len, c.attention, c.precision, c.checkpointing)

    seen = {key(c) for c in first}
    return first + [c for c in plan if key(c) not in seen]


PLANS: dict[str, Callable[[], list[TrainConfig]]] = {"h200": reference_plan}
