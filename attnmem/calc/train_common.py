"""What every part of the training-step model shares: the accepted values, the step's phases
and activation parts, the result (`TrainingStepMemory`) and the per-GPU shapes (`_Dims`).

The parts: attnmem/calc/train_dense.py (a dense decoder's layers and model-level tensors),
train_packed.py (packed rows and attention masks), train_lora.py (LoRA and QLoRA), train_moe.py
(MoE blocks and expert parallelism), train_gpt_oss.py (gpt-oss); attnmem/calc/training_step.py
composes them. Notation, used by all of them: T = B·s tokens, h hidden size, q = H·d and
k = H_kv·d the query and key/value widths, I the MLP width, V the vocabulary, N = B·H·s² score
elements, e bytes of an activation element (2 in both precisions: bf16, or the bf16 outputs of
autocast's matrix products). Under tensor parallelism (tp) the per-GPU shapes divide the heads,
the MLP columns and the vocabulary (`_dims`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnmem.calc.models import ModelConfig
from attnmem.calc.parallel import Layout
from attnmem.calc.peak import IMPL_LABELS, IMPLEMENTATIONS

#: Attention implementations a training step accepts: the registry names plus "eager"
#: (transformers' eager_attention_forward).
TRAIN_ATTENTIONS: tuple[str, ...] = ("eager", *IMPLEMENTATIONS)
TRAIN_ATTENTION_LABELS: dict[str, str] = {"eager": "transformers eager", **IMPL_LABELS,
                                          "fa4": "FlashAttention-4"}
PRECISIONS: tuple[str, ...] = ("bf16", "amp_bf16")
OPTIMIZERS: tuple[str, ...] = ("adamw", "adamw_fused", "adamw_8bit", "paged_adamw_8bit",
                               "adafactor", "sgd")
#: Activation parts, in the order the breakdown lists them.
PARTS: tuple[str, ...] = (
    "attention", "projections", "MLP", "norms", "residuals", "rotary", "embeddings",
    "logits and loss", "weight copies (autocast)", "MoE",
)
PHASES: tuple[str, ...] = (
    "forward: attention of the last layer",
    "forward: final norm",
    "loss backward (log-softmax)",
    "backward of lm_head",
    "backward of the last layer",
    "backward of layer 0",
    "backward of the tied embedding",
    "optimizer step",
)
#: cuBLAS workspaces that torch allocates through the caching allocator, kept after the warm-up:
#: one per (handle, stream); the forward runs on the main thread and the backward on autograd's
#: device thread, each with its own handle. 32 MiB each on Hopper (aten/src/ATen/cuda/
#: CublasHandlePool.cpp, getChosenWorkspaceSize: 4096 KiB x 8 for sm90).
CUBLAS_WORKSPACE_BYTES = 2 * 32 * 2**20
#: Labels of the model-level terms freed by the backward of the loss, lm_head and final norm.
HEAD_LABELS = ("final norm", "lm_head input", "bf16 copy of lm_head")


@dataclass(frozen=True)
class TrainingStepMemory:
    """Bytes per GPU of one steady-state training step (attnmem/calc/training_step.py names
    the module of every term)."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations: dict[str, int]  # every part of PARTS -> bytes alive at the end of the forward
    buffers_bytes: int  # what the parallel layout adds (DDP buckets, FSDP all-gathers, ...)
    before_step_bytes: int
    peak_bytes: int
    peak_phase: str  # where in the step the peak occurs (one of PHASES)
    phases: dict[str, int] = field(default_factory=dict)  # each candidate moment's bytes
    activation_terms: tuple[tuple[str, str, int], ...] = ()  # (part, tensor, bytes)
    layout: Layout | None = None
    attention: str = ""
    precision: str = ""
    checkpointing: bool = False
    # paged_adamw_8bit: optimizer state in CUDA unified memory, part of optimizer_bytes but not
    # of before_step_bytes, the phases or the peak (max_memory_allocated does not see it)
    optimizer_paged_bytes: int = 0

    @property
    def activations_bytes(self) -> int:
        return sum(self.activations.values())

    def part(self, name: str) -> int:
        return self.activations.get(name, 0)

    @property
    def attention_bytes(self) -> int:
        return self.part("attention")

    @property
    def logits_bytes(self) -> int:
        return self.part("logits and loss")


@dataclass(frozen=True)
class _Dims:
    """Per-GPU shapes (tensor parallelism divides heads, MLP columns and the vocabulary)."""

    b: int
    s: int
    h: int
    heads: int
    kv_heads: int
    d: int
    inter: int
    vocab: int
    ep: int = 1  # expert-parallel degree (MoE)
    lengths: tuple[int, ...] = ()  # packed sequences of the one row (padding-free); () dense
    # a packed row's window when every attention layer has one (`_packed_window`), else None
    window: int | None = None

    @property
    def t(self) -> int:
        return self.b * self.s

    @property
    def q(self) -> int:
        return self.heads * self.d

    @property
    def k(self) -> int:
        return self.kv_heads * self.d

    @property
    def n(self) -> int:
        return self.b * self.heads * self.s * self.s


def _dims(model: ModelConfig, batch: int, seq_len: int, tp: int) -> _Dims:
    kv = max(1, model.num_kv_heads // tp)  # Megatron replicates KV heads when tp > H_kv
    return _Dims(batch, seq_len, model.hidden_size, model.num_heads // tp, kv, model.head_dim,
                 model.intermediate_size // tp, -(-model.vocab_size // tp))


def _is_gpt2(model: ModelConfig) -> bool:
    return model.model_type == "gpt2"


def _check_args(attention: str, precision: str, optimizer: str) -> None:
    if attention not in TRAIN_ATTENTIONS:
        raise ValueError(f"unknown attention {attention!r}; accepted: {', '.join(TRAIN_ATTENTIONS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; accepted: {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; accepted: {', '.join(OPTIMIZERS)}")
