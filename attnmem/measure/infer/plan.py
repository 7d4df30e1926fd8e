"""Plans: the cross product of the command line (``expand``), the bundled H200 reference sweep
(``reference_plan``, ``--plan h200``) and torch's own SDPA choice where a forced backend found
no kernel (``sdpa_plan``, ``--plan h200-sdpa``), and the architectures outside calc's rules
(``unruled_plan``, ``--plan h200-unruled``, issue 42 item 6: predicted by the meta-device
trace). No torch or transformers at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from attnmem.measure.infer.config import InferConfig


def expand(models: Iterable[str], prompt_lens: Iterable[int], attentions: Iterable[str], *,
           caches: Iterable[str] = ("dynamic",), prefill_chunks: Iterable[int | None] = (None,),
           batch: int = 1, new_tokens: int = 8, layers: int | None = None) -> list[InferConfig]:
    """The cross product, grouped by model and attention (one build each) and each series
    short to long (so an OOM skips the longer prompts)."""
    lens = sorted(set(int(s) for s in prompt_lens))
    return [InferConfig(m, s, a, batch, new_tokens, c, p, layers)
            for m in models for a in attentions for c in caches for p in prefill_chunks
            for s in lens]


#: The reference sweep, one block a line, most important first (a --budget cuts from the
#: bottom): (model, attentions, prompt lengths, batch, new tokens, cache, prefill chunk).
#: Trim it by deleting lines. Rows of one model and attn_implementation are kept together so
#: that each is built once (the SDPA backends share a build).
_SDPA3 = ("sdpa_flash", "sdpa_efficient")
REFERENCE_BLOCKS: tuple[tuple[str, tuple[str, ...], tuple[int, ...], int, int, str, int | None],
                        ...] = (
    # Llama 3.1 8B, full depth: GQA, 128k vocab; the core grid.
    ("llama3.1-8b", _SDPA3, (1000, 4096, 16384, 32000, 65536), 1, 8, "dynamic", None),
    ("llama3.1-8b", ("sdpa_flash",), (3000, 12000, 100000, 120000), 1, 8, "dynamic", None),
    ("llama3.1-8b", ("sdpa_flash",), (16384,), 1, 64, "dynamic", None),  # decode growth
    ("llama3.1-8b", ("sdpa_flash",), (16384,), 1, 1, "dynamic", None),  # prefill only
    ("llama3.1-8b", _SDPA3, (8192,), 4, 8, "dynamic", None),
    ("llama3.1-8b", _SDPA3, (2048,), 8, 8, "dynamic", None),
    ("llama3.1-8b", ("sdpa_efficient",), (4096, 16384), 1, 8, "static", None),
    ("llama3.1-8b", ("sdpa_flash",), (4096,), 1, 8, "static", None),  # flash: mask refused?
    ("llama3.1-8b", ("sdpa_efficient",), (8192, 32000), 1, 8, "dynamic", 2048),
    ("llama3.1-8b", ("sdpa_efficient",), (32000,), 1, 8, "static", 2048),
    ("llama3.1-8b", ("triton",), (1000, 4096, 16384, 32000, 65536), 1, 8, "dynamic", None),
    ("llama3.1-8b", ("triton",), (8192,), 4, 8, "dynamic", None),
    ("llama3.1-8b", ("triton",), (2048,), 8, 8, "dynamic", None),
    ("llama3.1-8b", ("triton",), (4096,), 1, 8, "static", None),  # refused: a mask
    ("llama3.1-8b", ("triton",), (8192,), 1, 8, "dynamic", 2048),  # refused: s_q != s_k
    ("llama3.1-8b", ("eager",), (1000, 4096, 16384, 32000), 1, 8, "dynamic", None),
    ("llama3.1-8b", ("eager",), (8192,), 4, 8, "dynamic", None),
    ("llama3.1-8b", ("eager",), (2048,), 8, 8, "dynamic", None),
    ("llama3.1-8b", ("eager",), (4096, 16384), 1, 8, "static", None),
    ("llama3.1-8b", ("eager",), (8192, 32000), 1, 8, "dynamic", 2048),
    # Qwen2.5 7B, full depth: 152k vocabulary, q/k/v bias.
    ("qwen2.5-7b", ("sdpa_flash",), (1000, 8192, 32000), 1, 8, "dynamic", None),
    ("qwen2.5-7b", ("triton",), (1000, 8192, 32000), 1, 8, "dynamic", None),
    ("qwen2.5-7b", ("eager",), (1000, 8192), 1, 8, "dynamic", None),
    # Mistral 7B, full depth: sliding window 4,096 (12,000 is past it).
    ("mistral-7b", _SDPA3, (3000, 12000), 1, 8, "dynamic", None),
    ("mistral-7b", ("sdpa_efficient",), (12000,), 1, 8, "static", None),
    ("mistral-7b", ("sdpa_efficient",), (12000,), 1, 8, "dynamic", 2048),
    ("mistral-7b", ("triton",), (3000, 12000), 1, 8, "dynamic", None),
    ("mistral-7b", ("eager",), (3000, 12000), 1, 8, "dynamic", None),
    # Gemma 3 27B, 12 layers: 10 local (window 1,024) + 2 global, 262k vocabulary, tied.
    ("gemma3-27b-12l", _SDPA3, (1000, 4096, 16384), 1, 8, "dynamic", None),
    ("gemma3-27b-12l", ("sdpa_efficient",), (4096,), 1, 8, "static", None),
    ("gemma3-27b-12l", ("sdpa_efficient",), (16384,), 1, 8, "dynamic", 2048),
    ("gemma3-27b-12l", ("triton",), (1000, 4096, 16384), 1, 8, "dynamic", None),
    ("gemma3-27b-12l", ("eager",), (1000, 4096), 1, 8, "dynamic", None),
    # Qwen3-30B-A3B, 8 layers: MoE (128 experts, 8 active).
    ("qwen3-30b-a3b-8l", ("sdpa_flash",), (1000, 8192, 32000), 1, 8, "dynamic", None),
    ("qwen3-30b-a3b-8l", ("sdpa_flash",), (4096,), 4, 8, "dynamic", None),
    ("qwen3-30b-a3b-8l", ("triton",), (1000, 8192, 32000), 1, 8, "dynamic", None),
    ("qwen3-30b-a3b-8l", ("eager",), (1000, 8192), 1, 8, "dynamic", None),
    # DeepSeek-V2-Lite, full depth: MLA (q/k head 192, v head 128), MoE.
    ("deepseek-v2-lite", ("sdpa_efficient", "sdpa_flash"), (1000, 8192, 32000), 1, 8,
     "dynamic", None),
    ("deepseek-v2-lite", ("sdpa_efficient",), (8192,), 1, 8, "static", None),
    ("deepseek-v2-lite", ("sdpa_efficient",), (32000,), 1, 8, "dynamic", 2048),
    ("deepseek-v2-lite", ("triton",), (1000,), 1, 8, "dynamic", None),  # v head 128 != 192
    ("deepseek-v2-lite", ("eager",), (1000, 8192), 1, 8, "dynamic", None),
    # Llama 3.2 1B, full depth: tied embeddings, d = 64.
    ("llama3.2-1b", ("sdpa_flash",), (1000, 16384, 65536), 1, 8, "dynamic", None),
    ("llama3.2-1b", ("sdpa_flash",), (4096,), 8, 8, "dynamic", None),
    ("llama3.2-1b", ("triton",), (1000, 16384, 65536), 1, 8, "dynamic", None),
    ("llama3.2-1b", ("eager",), (1000, 16384), 1, 8, "dynamic", None),
)


#: Added after the first H200 run (session of 2026-12-01): torch's own SDPA choice where a
#: forced backend found no kernel (every mask: static caches, prefill chunks after the first,
#: windows shorter than the prompt; the memory-efficient backend under enable_gqa), the
#: decode-dominated shapes, and our kernel's first row again with its full-shape warm-up.
SDPA_BLOCKS: tuple[tuple[str, tuple[str, ...], tuple[int, ...], int, int, str, int | None],
                   ...] = (
    ("llama3.1-8b", ("sdpa",), (4096, 16384), 1, 8, "static", None),
    ("llama3.1-8b", ("sdpa",), (8192, 32000), 1, 8, "dynamic", 2048),
    ("llama3.1-8b", ("sdpa",), (32000,), 1, 8, "static", 2048),
    ("llama3.1-8b", ("sdpa",), (5000,), 2, 32, "dynamic", None),
    ("mistral-7b", ("sdpa",), (12000,), 1, 8, "dynamic", None),
    ("mistral-7b", ("sdpa",), (12000,), 1, 8, "static", None),
    ("mistral-7b", ("sdpa",), (12000,), 1, 8, "dynamic", 2048),
    ("gemma3-27b-12l", ("sdpa",), (4096, 16384), 1, 8, "dynamic", None),
    ("gemma3-27b-12l", ("sdpa",), (3000,), 2, 8, "dynamic", None),
    ("gemma3-27b-12l", ("sdpa",), (4096,), 1, 8, "static", None),
    ("gemma3-27b-12l", ("sdpa",), (16384,), 1, 8, "dynamic", 2048),
    ("qwen3-30b-a3b-8l", ("sdpa",), (6000,), 2, 16, "dynamic", None),
    ("deepseek-v2-lite", ("sdpa",), (8192,), 1, 8, "dynamic", None),
    ("qwen2.5-7b", ("sdpa",), (7777,), 3, 8, "dynamic", None),
    ("llama3.2-1b", ("triton",), (1000,), 1, 8, "dynamic", None),
    ("llama3.2-1b", ("sdpa", "eager"), (128,), 64, 512, "dynamic", None),
    ("llama3.2-1b", ("sdpa",), (128,), 64, 512, "static", None),
)


def sdpa_plan() -> list[InferConfig]:
    """``SDPA_BLOCKS`` alone (about 3 minutes of an H200)."""
    plan: list[InferConfig] = []
    for model, attentions, lens, batch, new, cache, chunk in SDPA_BLOCKS:
        plan += expand([model], lens, attentions, caches=[cache], prefill_chunks=[chunk],
                       batch=batch, new_tokens=new)
    return plan


def reference_plan() -> list[InferConfig]:
    """The H200 reference sweep (issue 29, item 5): ``REFERENCE_BLOCKS`` in order, each block's
    prompts short to long; about 7 minutes of an H200 (estimated: two prefills per row at about
    the model's 2 x params x tokens FLOPs plus attention, 21 model builds of a few seconds,
    the first triton rows' compilation). Expected refusals, recorded as unavailable rows at
    the cost of a warm-up: SDPA's flash backend wherever transformers materialises a mask (a
    static cache, a later prefill chunk, a sliding window shorter than the prompt) or the
    value head differs from the query head (MLA), and our kernel with any materialised mask or
    fewer queries than keys (static cache, chunked prefill)."""
    plan: list[InferConfig] = []
    for model, attentions, lens, batch, new, cache, chunk in REFERENCE_BLOCKS:
        plan += expand([model], lens, attentions, caches=[cache], prefill_chunks=[chunk],
                       batch=batch, new_tokens=new)
    # SDPA_BLOCKS' rows join their model's build (each model built once per attention, in the
    # order of first appearance); a row in both lists runs once.
    rows = {c.label(): c for c in plan + sdpa_plan()}
    order = {k: i for i, k in reversed(list(enumerate(c.build_key() for c in rows.values())))}
    return sorted(rows.values(), key=lambda c: order[c.build_key()])


#: The architectures outside calc's rules (issue 42, item 6), most important first: the dense
#: families (cheap builds, traces under a second), gpt-oss (calc gives only a lower bound),
#: then the large MoEs and the hybrid (a trace of seconds to tens of seconds each).
UNRULED_MODELS = ("olmo2-7b", "granite-7b", "smollm3-3b", "gpt-oss-20b-8l", "glm4.5-air-4l",
                  "minimax-m2-4l", "llama4-scout-4l", "qwen3-next-80b-4l")
#: Classes without SDPA (transformers refuses attn_implementation="sdpa" for them): eager only.
EAGER_ONLY = ("gpt-oss-20b-8l",)


def unruled_plan() -> list[InferConfig]:
    """The architectures outside calc's rules (issue 42, item 6; ``--plan h200-unruled``),
    predicted by the meta-device trace (attnmem.measure.infer.predict), dynamic cache, 8 new
    tokens, each model's rows together (one build per attention), models in
    ``UNRULED_MODELS``' order, so that ``--budget`` cuts the last models' rows:
    SDPA (torch's own backend) and eager at prompts 1,000 and 8,192 (batch 1), then one
    batch-4 row (SDPA, 2,048). gpt-oss has no SDPA in transformers: eager only (its batch-4
    row eager). 38 rows."""
    plan: list[InferConfig] = []
    for model in UNRULED_MODELS:
        attentions = ("eager",) if model in EAGER_ONLY else ("sdpa", "eager")
        plan += expand([model], (1000, 8192), attentions)
        plan += expand([model], (2048,), attentions[:1], batch=4)
    return plan


PLANS: dict[str, Callable[[], list[InferConfig]]] = {"h200": reference_plan,
                                                      "h200-sdpa": sdpa_plan,
                                                      "h200-unruled": unruled_plan}
