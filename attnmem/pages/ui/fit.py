"""The "Will it fit?" page's logic, kept out of the page (pure: calc only, no Streamlit).

One function per task, each taking its verdict from the one calc function that answers that
task everywhere else in the app and the CLI (issue 32, "one answer per question"):

- `inference`: attnmem.calc.inference_step (generate()'s peak; Model memory's total is the same
  number), attnmem.calc.max_inference_seq_len, attnmem.calc.gpus_needed (an ideal split of that peak);
- `serving`: attnmem.calc.serving_capacity (vLLM's KV pool), as the Serving page calls it; the
  longest context of B concurrent requests is the same pool divided by B
  (attnmem.calc.serving.sequence_bytes, the per-request bytes serving_capacity itself divides by);
- `training`: attnmem.calc.training_step (SDPA flash, or the next SDPA backend with a kernel where a
  sliding-window mask is passed), a largest_fitting search over it, attnmem.calc.train_gpus_needed
  (ZeRO-3 over up to 2^20 GPUs: 0 there means no count of GPUs fits);
- `lora`, `qlora`: the same attnmem.calc.training_step with the Training page's default adapters
  (attnmem.calc.finetune.calc_kwargs: rank 16, all linear layers, fp32 adapters; QLoRA's base in NF4),
  on one GPU (calc models adapters on one GPU only, so no GPU count).

Each returns a `Verdict`; where calc refuses the model for the task, `refused` holds calc's
reason and nothing else is filled in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnmem.calc import (
    MAX_SEQ_LEN,
    ModelConfig,
    gpus_needed,
    inference_step,
    largest_fitting,
    max_inference_seq_len,
    train_gpus_needed,
    training_step,
)
from attnmem.calc.backends import NoKernel
from attnmem.calc.finetune import calc_kwargs
from attnmem.calc.serving import DEFAULT_MAX_NUM_SEQS, sequence_bytes, serving_capacity
from attnmem.calc.training_step import MANY_GPUS  # a step that does not fit there never fits

TASKS: tuple[str, ...] = ("inference", "serving", "training", "lora", "qlora")
TASK_LABELS = {
    "inference": "Inference: generate() with transformers",
    "serving": "Serving: vLLM, concurrent requests",
    "training": "Full training: AdamW, bf16, one step",
    "lora": "LoRA fine-tuning: rank 16, bf16 base",
    "qlora": "QLoRA fine-tuning: rank 16, NF4 base",
}
#: The training tasks: the Training step page's method (URL key ``ft``) for each.
TRAIN_METHODS = {"training": "full", "lora": "lora", "qlora": "qlora"}
#: Attention tried for inference, in order: transformers' default (SDPA, torch choosing the
#: backend), then eager, which calc accepts where SDPA cannot run the model (Gemma 2's logit
#: soft-capping).
INFER_ORDER = ("sdpa", "eager")
#: Attention of the training step: SDPA without a mask runs the FlashAttention-2 backend;
#: where transformers passes a mask (a sliding window not longer than s) flash has no kernel,
#: and the step is sized with the next SDPA backend calc finds a kernel for (TRAIN_FALLBACKS:
#: memory-efficient, which takes the mask, or, where some layers are unmasked grouped-query
#: calls it has no kernel for, cuDNN). torch itself picks per layer; the verdict names the one
#: counted.
TRAIN_ATTENTION = "sdpa_flash"
TRAIN_FALLBACKS = ("sdpa_efficient", "sdpa_cudnn")
#: serving_capacity's settings the page does not expose (the Serving page's defaults).
SERVING_BLOCK = 16
SERVING_MNBT = 8192
SERVING_KV_DTYPE = "bf16"


@dataclass(frozen=True)
class Verdict:
    """The answer for one task; every byte count is computed by `source`."""

    task: str
    source: str  # the calc function whose peak decides "fits"
    gpu_bytes: int
    refused: str = ""  # calc's reason when it does not model this model for the task
    fits: bool = False
    peak_bytes: int = 0  # what is compared with `limit_bytes`
    limit_bytes: int = 0  # the GPU, or the part of it the task may use (vLLM's budget)
    parts: dict[str, int] = field(default_factory=dict)  # the peak's parts (sum = peak_bytes)
    where: str = ""  # where the peak occurs
    attention: str = ""
    longest: int = 0  # longest context that fits (0: none)
    longest_source: str = ""
    longest_at_bound: bool = False  # the search stopped at attnmem.calc.MAX_SEQ_LEN: at least this
    gpus: int | None = None  # GPUs needed; 0: no count fits; None: not modelled for the task
    gpus_how: str = ""  # how the count is made
    nothing_fits: str = ""  # why not even the shortest context fits ("" if one does)
    notes: tuple[str, ...] = ()
    #: Where the search for `longest` stopped short (a traced model: attnmem.pages.ui.traced):
    #: the bracket its traces give, e.g. "fits at 8,192, not at 16,384"; "" when exact.
    longest_unknown: str = ""
    #: The "counted from" line ("" for calc's rules: the page says it) and, for a traced
    #: answer, the largest allocations alive at the peak (attnmem.pages.ui.traced.where_rows).
    counted_from: str = ""
    at_peak: tuple[dict, ...] = ()


def _refused(task: str, source: str, gpu_bytes: int, err: Exception) -> Verdict:
    return Verdict(task, source, gpu_bytes, refused=str(err))


def inference(model: ModelConfig, gpu_bytes: int, batch: int, seq_len: int, new_tokens: int,
              weight_dtype: str = "bf16") -> Verdict:
    """generate() over a prompt of seq_len tokens making new_tokens, batch sequences, dynamic
    cache, bf16 cache: attnmem.calc.inference_step's peak against the GPU."""
    src = "attnmem.calc.inference_step"
    notes: list[str] = []
    m = None
    errors: dict[str, str] = {}
    for attention in INFER_ORDER:
        try:
            m = inference_step(model, batch, seq_len, new_tokens, attention=attention,
                               weight_dtype=weight_dtype)
            break
        except ValueError as err:
            errors[attention] = str(err)
    if m is None:
        return Verdict("inference", src, gpu_bytes,
                       refused=" / ".join(dict.fromkeys(errors.values())))
    if errors:
        notes.append(f"SDPA cannot run this model ({errors[INFER_ORDER[0]]}): eager attention "
                     "is used instead.")
    kw = dict(attention=m.attention, weight_dtype=weight_dtype)
    try:
        longest = max_inference_seq_len(model, gpu_bytes, batch, new_tokens, **kw)
    except ValueError:  # prompt + new tokens past attnmem.calc.MAX_SEQ_LEN during the search
        longest = MAX_SEQ_LEN - new_tokens
    parts = {"weights": m.weights_bytes, "cuBLAS workspace and inputs": m.fixed_bytes,
             "KV cache": m.parts.get("KV cache", 0)}
    parts["activations (prefill or decode)"] = m.peak_bytes - sum(parts.values())
    nothing = ""
    if longest == 0:
        base = m.weights_bytes + m.fixed_bytes
        nothing = ("the weights alone (with the 32 MiB cuBLAS workspace) exceed the GPU"
                   if base >= gpu_bytes else
                   f"the weights fit, but not a 1-token prompt with batch {batch:,} and "
                   f"{new_tokens:,} new tokens")
    return Verdict(
        "inference", src, gpu_bytes, fits=m.peak_bytes <= gpu_bytes, peak_bytes=m.peak_bytes,
        limit_bytes=gpu_bytes, parts=parts, where=m.peak_phase, attention=m.attention,
        longest=longest, longest_source="attnmem.calc.max_inference_seq_len",
        longest_at_bound=longest >= MAX_SEQ_LEN - new_tokens,
        gpus=gpus_needed(m.peak_bytes, gpu_bytes),
        gpus_how="attnmem.calc.gpus_needed: an ideal split of the peak (tensor parallel without "
                 "duplicated activations); a lower bound",
        nothing_fits=nothing, notes=tuple(notes))


def serving(model: ModelConfig, gpu_bytes: int, batch: int, seq_len: int,
            weight_dtype: str = "bf16") -> Verdict:
    """batch concurrent requests of seq_len tokens in vLLM's KV pool on one GPU
    (attnmem.calc.serving_capacity with the Serving page's defaults; max_num_seqs raised to B when B
    is above vLLM's 256, as a user asking for B requests at once would set it)."""
    src = "attnmem.calc.serving_capacity"
    seqs = max(DEFAULT_MAX_NUM_SEQS, batch)
    try:
        cap = serving_capacity(model, gpu_bytes, seq_len, weight_dtype=weight_dtype,
                               kv_dtype=SERVING_KV_DTYPE, block_size=SERVING_BLOCK,
                               max_num_batched_tokens=SERVING_MNBT, max_num_seqs=seqs)
    except ValueError as err:
        return _refused("serving", src, gpu_bytes, err)
    kv = batch * cap.bytes_per_sequence
    parts = {"weights": cap.weights_bytes, "activation peak (profiling run)": cap.activation_bytes,
             "non-torch memory": cap.non_torch_bytes}
    if cap.cuda_graphs_in_budget:
        parts["CUDA graphs"] = cap.cuda_graph_bytes
    parts[f"KV cache of {batch:,} request(s)"] = kv
    overhead = sum(parts.values()) - kv
    if batch == 1:
        longest = cap.max_context
    else:  # B requests of n tokens each: B × the bytes of one, in the same pool
        longest = largest_fitting(
            lambda n: batch * sequence_bytes(model, n, SERVING_BLOCK, SERVING_KV_DTYPE,
                                             max_num_batched_tokens=SERVING_MNBT),
            cap.kv_pool_bytes)
    nothing = ""
    if longest == 0:
        nothing = ("the weights alone exceed vLLM's budget (GPU × 0.9)"
                   if cap.weights_bytes > cap.budget_bytes else
                   "weights, activations and overheads leave no KV pool"
                   if cap.kv_pool_bytes == 0 else
                   f"the KV pool holds less than {batch:,} request(s) of one token")
    # Replicas: each GPU runs its own copy with this pool (data parallel); tensor parallel,
    # which would split the weights, is not modelled by serving_capacity.
    per_gpu = cap.max_concurrency
    gpus = 0 if per_gpu == 0 else -(-batch // per_gpu)
    return Verdict(
        "serving", src, gpu_bytes, fits=cap.max_concurrency >= batch,
        peak_bytes=overhead + kv, limit_bytes=cap.budget_bytes, parts=parts,
        where=f"the KV cache pool, when it is full ({cap.max_concurrency:,} request(s) of "
              f"{seq_len:,} tokens fit it)",
        longest=longest, longest_source=src + (" (one request)" if batch == 1 else
                                               " pool ÷ B (attnmem.calc.serving.sequence_bytes)"),
        longest_at_bound=longest >= MAX_SEQ_LEN, gpus=gpus,
        gpus_how="replicas of one GPU each (data parallel: requests ÷ requests per GPU); "
                 "tensor parallel is not modelled for serving",
        nothing_fits=nothing,
        notes=(f"max_num_seqs = {seqs:,}",) if seqs != DEFAULT_MAX_NUM_SEQS else ())


def training(model: ModelConfig, gpu_bytes: int, batch: int, seq_len: int,
             task: str = "training") -> Verdict:
    """One training step (bf16, AdamW, SDPA's FlashAttention-2, no checkpointing) on one GPU:
    attnmem.calc.training_step's peak against the GPU. ``task`` "training" trains every weight;
    "lora" / "qlora" train the Training page's default adapters over a frozen bf16 / NF4 base
    (attnmem.calc.finetune.calc_kwargs), which calc models on one GPU only (no GPU count)."""
    src = "attnmem.calc.training_step"
    method = TRAIN_METHODS[task]
    base = calc_kwargs(method)

    def step(s: int):  # SDPA: flash, else the first backend with a kernel for these inputs
        for attention in (TRAIN_ATTENTION, *TRAIN_FALLBACKS):
            try:
                return training_step(model, batch, s, attention=attention, **base)
            except NoKernel as err:
                refused = err
        raise refused

    try:
        m = step(seq_len)
    except ValueError as err:
        return _refused(task, src, gpu_bytes, err)
    kw = dict(attention=m.attention, **base)
    longest = largest_fitting(lambda s: step(s).peak_bytes, gpu_bytes)
    gpus: int | None = None
    how = ("not modelled: calc counts LoRA and QLoRA on one GPU only (the Training step page "
           "says why)")
    if method == "full":
        gpus = train_gpus_needed(model, gpu_bytes, batch, seq_len, sharding="zero3",
                                 max_gpus=MANY_GPUS, **kw)
        how = ("attnmem.calc.train_gpus_needed, ZeRO-3 (parameters, gradients and AdamW state "
               "sharded over the GPUs; activations are not)")
    buffers = m.before_step_bytes - m.weights_bytes - m.optimizer_bytes
    weights = ("weights" if method == "full" else
               "frozen base weights (bf16) and adapters" if method == "lora" else
               "frozen base weights (NF4) and adapters")
    optim = "optimizer state (AdamW)" if method == "full" else "optimizer state (AdamW, adapters)"
    parts = {weights: m.weights_bytes, optim: m.optimizer_bytes,
             "buffers (cuBLAS workspaces, inputs)": buffers,
             "activations and gradients at the peak": m.peak_bytes - m.before_step_bytes}
    nothing = ""
    if longest == 0:
        nothing = ("the weights alone exceed the GPU" if m.weights_bytes >= gpu_bytes else
                   "weights and optimizer state alone exceed the GPU"
                   if m.before_step_bytes >= gpu_bytes else
                   f"weights and optimizer state fit, but not a step at s = 1, batch {batch:,}")
    return Verdict(
        task, src, gpu_bytes, fits=m.peak_bytes <= gpu_bytes, peak_bytes=m.peak_bytes,
        limit_bytes=gpu_bytes, parts=parts, where=m.peak_phase, attention=m.attention,
        longest=longest,
        longest_source="attnmem.calc.fit.largest_fitting over attnmem.calc.training_step (SDPA flash, or "
                       "the next SDPA backend with a kernel where a window mask is passed)",
        longest_at_bound=longest >= MAX_SEQ_LEN, gpus=gpus, gpus_how=how,
        nothing_fits=nothing)
