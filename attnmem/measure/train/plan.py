"""Plans: the cross product of the command line (``expand``, with ``lora_variants`` for
fine-tuning), the bundled H200 reference sweep (``reference_plan``, ``--plan h200``) and the
LoRA / QLoRA sweep (``lora_plan``, ``--plan h200-lora``), the MoE sweep (``moe_plan``,
``--plan h200-moe``), the packed-sequence sweep (``packed_plan``, ``--plan h200-packed``) and
the architectures outside calc's rules (``unruled_plan``, ``--plan h200-unruled``, issue 42
item 6: predicted by the meta-device trace) and the fine-tuning recipes (``recipes_plan``,
``--plan h200-recipes``, issue 43: optimizers, peft's prepare step, Liger, offloading, with
``lever_variants`` for the command line's cross product).
No torch or transformers at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from attnmem.measure.train.config import TrainConfig

FULL: dict[str, Any] = {}  # full training: TrainConfig's defaults


def expand(models: Iterable[str], seq_lens: Iterable[int], attentions: Iterable[str],
           precisions: Iterable[str], checkpointings: Iterable[bool], *, batch: int = 1,
           layers: int | None = None, steps: int = 3,
           finetunes: Sequence[dict[str, Any]] = (FULL,)) -> list[TrainConfig]:
    """The cross product; each series runs short to long (so an OOM skips the longer ones).
    ``finetunes``: TrainConfig keywords of each fine-tuning variant (``lora_variants``);
    full training by default."""
    seq = sorted(set(int(s) for s in seq_lens))
    return [TrainConfig(m, s, a, p, bool(c), batch, layers, steps, **ft)
            for m in models for ft in finetunes for p in precisions for c in checkpointings
            for a in attentions for s in seq]


def lora_variants(ranks: Iterable[int], targets: Iterable[str], base_dtypes: Iterable[str], *,
                  alpha: float | None = None, dropout: float = 0.0,
                  adapter_dtype: str = "fp32") -> list[dict[str, Any]]:
    """TrainConfig keywords of each LoRA variant: ranks × targets × base dtypes (bf16: LoRA,
    nf4 / nf4_dq: QLoRA). ``alpha`` None: 2 × rank (a common choice; no byte depends on it)."""
    return [{"adapter": "lora", "rank": int(r), "alpha": float(2 * r if alpha is None else alpha),
             "targets": t, "lora_dropout": float(dropout), "adapter_dtype": adapter_dtype,
             "base_dtype": b}
            for b in base_dtypes for t in targets for r in ranks]


def lever_variants(optimizers: Iterable[str], kbit: Iterable[bool], liger: Iterable[bool],
                   offload: Iterable[bool]) -> list[dict[str, Any]]:
    """TrainConfig keywords of each recipe variant: optimizers × kbit_prepare × liger ×
    offload_activations (the plain step, AdamW with no lever, is TrainConfig's defaults)."""
    return [{"optimizer": o, "kbit_prepare": bool(k), "liger": bool(g),
             "offload_activations": bool(f)}
            for o in optimizers for k in kbit for g in liger for f in offload]


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


#: Lengths of the LoRA sweep: 1,000 to 16,384, non-powers of two among them.
LORA_LENGTHS = (1000, 3000, 6000, 8192, 12000, 16384)


def lora_plan() -> list[TrainConfig]:
    """The H200 LoRA / QLoRA sweep (issue 34, item 3; ``--plan h200-lora``), most important
    first so that ``--budget`` cuts the least important rows. bf16 with sdpa_flash throughout
    (calc models LoRA without autocast only); rows where bitsandbytes is not installed are
    'unavailable' in no time. About 5 minutes on an H200 (a row: a few seconds at 1k, ~10 s
    at 16k tokens).

    0. Coverage first: llama3-8b-2l (8B widths, 128k vocab) and qwen2.5-7b-2l (152k vocab,
       q/k/v bias), LoRA and QLoRA (nf4), r 16, all-linear and attention, checkpointing off,
       at 1,000 and 8,192 tokens.
    1. llama3-8b-2l: r 8 and 64 × attention / all-linear × bf16 / nf4 × checkpointing
       off / on × 1,000 ... 16,384 (LORA_LENGTHS).
    2. qwen2.5-7b-2l: r 8 and 64 × all-linear / attention × bf16 / nf4, checkpointing
       off / on, at 1,000, 3,000, 8,192, 16,384.
    3. Double quantization (nf4_dq) and bf16 adapters on llama3-8b-2l, r 16, all-linear,
       checkpointing off / on, at 1,000, 6,000, 16,384; dropout 0.05 (its bool masks) at
       1,000 and 8,192.
    4. llama3-8b-4l (per-layer cost = 4l - 2l): LoRA and QLoRA r 16 all-linear, checkpointing
       off / on, at 1,000 and 8,192; eager and triton attention at 1,000 and 8,192 (LoRA r 16
       all-linear, checkpointing off).
    """
    a = ("sdpa_flash",)
    plan: list[TrainConfig] = []
    both = ("all-linear", "attention")
    plan += expand(["llama3-8b-2l", "qwen2.5-7b-2l"], (1000, 8192), a, ["bf16"], [False],
                   finetunes=lora_variants([16], both, ["bf16", "nf4"]))
    plan += expand(["llama3-8b-2l"], LORA_LENGTHS, a, ["bf16"], [False, True],
                   finetunes=lora_variants([8, 64], both, ["bf16", "nf4"]))
    plan += expand(["qwen2.5-7b-2l"], (1000, 3000, 8192, 16384), a, ["bf16"], [False, True],
                   finetunes=lora_variants([8, 64], both, ["bf16", "nf4"]))
    plan += expand(["llama3-8b-2l"], (1000, 6000, 16384), a, ["bf16"], [False, True],
                   finetunes=lora_variants([16], ["all-linear"], ["nf4_dq"])
                   + lora_variants([16], ["all-linear"], ["bf16", "nf4"], adapter_dtype="bf16"))
    plan += expand(["llama3-8b-2l"], (1000, 8192), a, ["bf16"], [False],
                   finetunes=lora_variants([16], ["all-linear"], ["bf16", "nf4"], dropout=0.05))
    plan += expand(["llama3-8b-4l"], (1000, 8192), a, ["bf16"], [False, True],
                   finetunes=lora_variants([16], ["all-linear"], ["bf16", "nf4"]))
    plan += expand(["llama3-8b-2l"], (1000, 8192), ("eager", "triton"), ["bf16"], [False],
                   finetunes=lora_variants([16], ["all-linear"], ["bf16", "nf4"]))
    seen: set[tuple] = set()
    out: list[TrainConfig] = []
    for c in plan:
        k = (*c.series(), c.seq_len)
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out


#: Lengths of the MoE sweep with a linear-memory attention: the experts' weights, gradients
#: and AdamW state make the optimizer step the peak up to several thousand tokens, so the
#: sweep runs long enough for the activations to set it (non-powers of two among them).
MOE_LENGTHS = (1000, 6000, 12000, 24000, 32768)
#: ... and with eager attention (its s² probabilities leave the H200 past about 8k tokens).
MOE_EAGER_LENGTHS = (1000, 3000, 6000)


def moe_plan() -> list[TrainConfig]:
    """The H200 MoE full-training sweep (issue 34, item 3; ``--plan h200-moe``), bf16, most
    important first. Few layers with every expert of the real model, so the expert weights,
    their gradients and AdamW state are the real per-layer sizes.

    0. Coverage: mixtral-8x7b-2l and qwen3-30b-a3b-4l with sdpa_flash, checkpointing off and
       on, at 1,000 and 24,000 tokens; gpt-oss-20b-2l (attention sinks: eager attention) at
       1,000 and 3,000 tokens, checkpointing off and on.
    1. Both with sdpa_flash and triton at MOE_LENGTHS, checkpointing off and on.
    2. Both with eager attention at MOE_EAGER_LENGTHS, checkpointing off and on.
    3. gpt-oss-20b-2l, eager, at 6,000 tokens.
    """
    moe = ["mixtral-8x7b-2l", "qwen3-30b-a3b-4l"]
    plan = expand(moe, (1000, 24000), ("sdpa_flash",), ["bf16"], [False, True])
    plan += expand(["gpt-oss-20b-2l"], (1000, 3000), ("eager",), ["bf16"], [False, True])
    plan += expand(moe, MOE_LENGTHS, ("sdpa_flash", "triton"), ["bf16"], [False, True])
    plan += expand(moe, MOE_EAGER_LENGTHS, ("eager",), ["bf16"], [False, True])
    plan += expand(["gpt-oss-20b-2l"], (6000,), ("eager",), ["bf16"], [False, True])
    seen: set[tuple] = set()
    out: list[TrainConfig] = []
    for c in plan:
        k = (*c.series(), c.seq_len)
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out


#: The packs of the packed-sequence sweep (padding-free rows): T tokens -> the lengths.
PACKS: dict[int, tuple[int, ...]] = {
    4096: (1000, 3000, 96),
    8192: (3000, 2000, 1500, 1000, 692),
    16384: (4000, 3000, 2500, 2000, 1500, 1200, 1000, 700, 484),
}


def packed_variants(total: int) -> list[dict[str, Any]]:
    """TrainConfig keywords of the packed row of ``total`` tokens (PACKS) and of the dense
    row of the same T (batch 1), the packed one first."""
    return [{"packed": "+".join(map(str, PACKS[total]))}, {}]


def packed_plan() -> list[TrainConfig]:
    """The H200 packed-sequence sweep (issue 31: padding-free fine-tuning on our kernel;
    ``--plan h200-packed``), bf16, our kernel (triton) throughout, each packed row next to the
    dense row of the same T (batch 1), most important first so that ``--budget`` cuts the
    least important rows. About 2 minutes on an H200 (48 rows of a few seconds).

    0. llama3-8b-2l, full training, checkpointing off: T = 4,096 (1,000 + 3,000 + 96),
       8,192 (5 sequences), 16,384 (9 sequences), packed and dense.
    1. qwen2.5-7b-2l (GQA 28/4, q/k/v bias, 152k vocab), the same.
    2. Both with LoRA (r 16, all-linear, fp32 adapters on the bf16 base), checkpointing off.
    3. Everything above with checkpointing on.
    """
    a, plan = ("triton",), []
    lora = lora_variants([16], ["all-linear"], ["bf16"])
    for ckpt in (False, True):
        for ft in (FULL, *lora):
            for m in ("llama3-8b-2l", "qwen2.5-7b-2l"):
                for t in sorted(PACKS):
                    plan += expand([m], (t,), a, ["bf16"], [ckpt],
                                   finetunes=[{**ft, **v} for v in packed_variants(t)])
    return plan


#: The architectures outside calc's rules (issue 42, item 6), most important first (the dense
#: families, then the large MoEs and the hybrid). gpt-oss's training step is within calc's
#: rules and measured (``moe_plan``); its inference is attnmem.measure.infer.plan's.
UNRULED_MODELS = ("olmo2-7b-2l", "granite-7b-2l", "smollm3-3b-4l", "glm4.5-air-2l",
                  "minimax-m2-1l", "llama4-scout-2l", "qwen3-next-80b-4l")


def unruled_plan() -> list[TrainConfig]:
    """The architectures outside calc's rules (issue 42, item 6; ``--plan h200-unruled``), full
    training in bf16, predicted by the meta-device trace (attnmem.measure.train.predict), most
    important first so that ``--budget`` cuts the least important rows. 56 rows.

    0. Coverage: every model with sdpa_flash, checkpointing off, at 1,000 and 4,096 tokens.
    1. Every model with eager attention, checkpointing off, at 1,000 and 4,096.
    2. Both attentions with checkpointing on, at 1,000 and 4,096.
    """
    plan: list[TrainConfig] = []
    for attentions, ckpt in ((("sdpa_flash",), False), (("eager",), False),
                             (("sdpa_flash", "eager"), True)):
        plan += expand(UNRULED_MODELS, (1000, 4096), attentions, ["bf16"], [ckpt])
    return plan


#: The recipes' adapters: peft LoRA r 16 (alpha 32), every linear but lm_head, fp32 adapters.
RECIPE_LORA: dict[str, Any] = lora_variants([16], ["all-linear"], ["bf16"])[0]
#: The QLoRA recipe (peft's QLoRA notebook, the QLoRA paper): NF4 base, peft's prepare step
#: (which turns checkpointing on), the paged 8-bit AdamW. Attention: one that runs the fp32
#: q, k, v the prepare step makes (calc's KBIT_ATTENTIONS): ours for grouped-query heads,
#: SDPA's memory-efficient backend for multi-head models.
QLORA_RECIPE: dict[str, Any] = {**RECIPE_LORA, "base_dtype": "nf4", "kbit_prepare": True,
                                "optimizer": "paged_adamw_8bit"}


def _row(model: str, s: int, attention: str = "sdpa_flash", ckpt: bool = False, batch: int = 1,
         precision: str = "bf16", **kw: Any) -> TrainConfig:
    return TrainConfig(model, s, attention, precision, ckpt, batch, **kw)


def recipes_plan() -> list[TrainConfig]:
    """The fine-tuning recipes (issue 43, item 3; ``--plan h200-recipes``): each lever alone
    beside its plain twin, the recipes users combine, dense and MoE models, batch 1-8, 1,000 to
    16,384 tokens. bf16, full training unless named. Every row's predicted peak is under
    70 GiB (one 80 GB H100; tests/measure/test_train_recipes.py checks it). Most important
    first, so that ``--budget`` cuts the least important rows; about 5 minutes on an H100
    (estimated from the bundled rows' wall_s: 1-3 s a dense 2-layer row, 10-20 s for a
    fresh child's first; offloading's pinned copies and Liger's first compilations add tens
    of seconds).

    0. Coverage, 24 rows: Llama 3.1 8B widths (2 layers) at 4,096 tokens, the plain step and
       each optimizer (adamw_fused, adamw_8bit, paged_adamw_8bit, adafactor, sgd), Liger and
       offloading alone; the QLoRA recipe with its twins (the QLoRA step on our kernel with
       and without peft's prepare step, AdamW); LoRA + Liger and plain LoRA; full training
       with 8-bit AdamW and offloading; the MoEs (Mixtral 8x7B, 2 layers; Qwen3-30B-A3B, 4
       layers; calc counts torch's optimizers only there: sgd, adamw_fused); then the
       combinations at 16,384 tokens and batch 2-8.
    1. Lengths, batches, other architectures: the QLoRA recipe at 1,000 tokens and on Llama 2
       7B widths (multi-head: SDPA's memory-efficient backend) at 4,096 and 4 x 2,048; Liger on
       Qwen2.5 (its own patch) and Mistral; the optimizers at 1,000 tokens, where their step
       is the peak, in bf16 and amp_bf16 (fp32 parameters); the optimizers on LoRA adapters;
       the long and batched ends of each combination; the MoEs at 16,384 tokens.
    """
    ll, l2, qw, mi = "llama3-8b-2l", "llama2-7b-2l", "qwen2.5-7b-2l", "mistral-7b-2l"
    mx, q3 = "mixtral-8x7b-2l", "qwen3-30b-a3b-4l"
    lora, qlora = RECIPE_LORA, QLORA_RECIPE
    qlora_plain = {**RECIPE_LORA, "base_dtype": "nf4"}
    full_8bit_off = {"optimizer": "adamw_8bit", "offload_activations": True}
    plan = [
        # 0. coverage
        _row(ll, 4096),
        *[_row(ll, 4096, optimizer=o) for o in ("adamw_8bit", "paged_adamw_8bit",
                                                 "adafactor", "sgd", "adamw_fused")],
        _row(ll, 4096, liger=True),
        _row(ll, 4096, offload_activations=True),
        _row(ll, 4096, "triton", True, **qlora),
        _row(ll, 4096, "triton", True, **{**qlora, "optimizer": "adamw"}),
        _row(ll, 4096, "triton", True, **qlora_plain),
        _row(ll, 4096, liger=True, **lora),
        _row(ll, 4096, **lora),
        _row(ll, 4096, **full_8bit_off),
        _row(mx, 4096, optimizer="sgd"),
        _row(mx, 4096, optimizer="adamw_fused"),
        _row(q3, 4096, ckpt=True, optimizer="sgd"),
        _row(q3, 1000, optimizer="adamw_fused"),
        _row(ll, 16384, "triton", True, **qlora),
        _row(ll, 16384, liger=True, **lora),
        _row(ll, 4096, batch=2, **full_8bit_off),
        _row(ll, 1024, "triton", True, batch=8, **qlora),
        _row(ll, 16384, liger=True),
        _row(ll, 8192, ckpt=True, offload_activations=True),
        # 1. lengths, batches, other architectures
        _row(ll, 1000, "triton", True, **qlora),
        _row(l2, 4096, "sdpa_efficient", True, **qlora),
        _row(l2, 2048, "sdpa_efficient", True, batch=4, **qlora),
        _row(qw, 8192, liger=True, **lora),
        _row(qw, 4096, liger=True),
        _row(mi, 2048, liger=True),
        *[_row(ll, 1000, optimizer=o) for o in ("adamw", "adamw_8bit", "paged_adamw_8bit",
                                                 "adafactor", "sgd")],
        *[_row(ll, 1000, precision="amp_bf16", optimizer=o) for o in ("adamw", "adamw_8bit",
                                                                       "adafactor")],
        _row(qw, 4096, optimizer="adamw_8bit"),
        *[_row(ll, 4096, optimizer=o, **lora) for o in ("adamw_8bit", "paged_adamw_8bit",
                                                         "adafactor")],
        _row(ll, 2048, batch=4, liger=True, **lora),
        _row(ll, 16384, ckpt=True, liger=True, **lora),
        _row(ll, 16384, ckpt=True, **full_8bit_off),
        _row(ll, 8192, batch=2, liger=True),
        _row(ll, 1000, **full_8bit_off),
        _row(mx, 16384, ckpt=True, optimizer="sgd"),
        _row(mx, 2048, batch=4, optimizer="adamw_fused"),
        _row(q3, 16384, ckpt=True, optimizer="adamw_fused"),
    ]
    seen: set[tuple] = set()
    out: list[TrainConfig] = []
    for c in plan:
        k = (*c.series(), c.seq_len)
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out


PLANS: dict[str, Callable[[], list[TrainConfig]]] = {"h200": reference_plan,
                                                      "h200-lora": lora_plan,
                                                      "h200-moe": moe_plan,
                                                      "h200-packed": packed_plan,
                                                      "h200-unruled": unruled_plan,
                                                      "h200-recipes": recipes_plan}
