"""The analytic model of attention memory: pure functions over plain numbers.

Pure on purpose: stdlib and pandas only, never streamlit, torch or triton, so the app, the
tests and the measurement harness all share one model. The public names and their meanings
are listed in attnmem/calc/API.md.
"""

from __future__ import annotations

from attnmem.calc.allocator import CachingAllocator
from attnmem.calc.backends import NoKernel
from attnmem.calc.context_parallel import (
    CP_IMPL_LABELS,
    CP_IMPLEMENTATIONS,
    CommVolume,
    ContextParallelMemory,
    ContextParallelTraining,
    context_parallel_memory,
    context_parallel_peak_bytes,
    context_parallel_terms,
    context_parallel_training,
    max_context_parallel_attention_seq_len,
    max_context_parallel_seq_len,
    ring_comm_bytes,
    ring_schedule,
    ring_step_kind,
    zigzag_chunks,
)
from attnmem.calc.fit import largest_fitting, max_seq_len
from attnmem.calc.gpus import (
    DEFAULT_GPU,
    GPU_TORCH_TOTAL,
    GPU_TORCH_TOTAL_SOURCES,
    GPUS,
    torch_total_bytes,
)
from attnmem.calc.inference_step import INFER_ATTENTIONS as INFER_ATTENTIONS
from attnmem.calc.inference_step import InferenceMemory as InferenceMemory
from attnmem.calc.inference_step import inference_step as inference_step
from attnmem.calc.inference_step import max_inference_seq_len as max_inference_seq_len
from attnmem.calc.kv import kv_cache_bytes
from attnmem.calc.memory import MemoryBreakdown, gpus_needed, model_max_seq_len, model_memory
from attnmem.calc.models import ModelConfig, QuantConfig
from attnmem.calc.parallel import SHARDING_LABELS, SHARDINGS, Layout
from attnmem.calc.params import (
    ACTIVE_CONVENTIONS,
    active_param_count,
    param_breakdown,
    param_count,
)
from attnmem.calc.peak import (
    ALLOCATOR_NOTE,
    IMPL_DTYPES,
    IMPL_KIND,
    IMPL_LABELS,
    IMPLEMENTATIONS,
    PEAK_MODEL_NOTES,
    RESERVED_PREDICTED,
    AttentionCall,
    PeakTerm,
    attention_flops,
    attention_peak_breakdown,
    attention_peak_bytes,
    attention_peak_terms,
    attention_reserved_bytes,
    check_impl,
)
from attnmem.calc.peak import (
    varlen_peak_breakdown as varlen_peak_breakdown,
)
from attnmem.calc.peak import (
    varlen_peak_bytes as varlen_peak_bytes,
)
from attnmem.calc.presets import MODELS, PRESET_HF_CONFIGS, fixture_name
from attnmem.calc.quant import checkpoint_breakdown, checkpoint_weight_bytes
from attnmem.calc.scores import score_matrix_bytes
from attnmem.calc.sweep import default_seq_lens, sweep_param, sweep_seq_len
from attnmem.calc.training import (
    TrainingAttention,
    saved_for_backward_bytes,
    training_attention,
    training_attention_bytes,
)
from attnmem.calc.training_step import (
    BASE_DTYPES,
    PRECISIONS,
    TRAIN_ATTENTION_LABELS,
    TRAIN_ATTENTIONS,
    LoRA,
    TrainingStepMemory,
    max_train_seq_len,
    train_gpus_needed,
    training_step,
)
from attnmem.calc.training_step import MOE_MODEL_TYPES as MOE_MODEL_TYPES
from attnmem.calc.training_step import lora_adapter_params as lora_adapter_params
from attnmem.calc.units import (
    DTYPE_BYTES,
    DTYPES,
    GB,
    GIB,
    MAX_BATCH,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_SEQ_LEN,
    check_int,
    dtype_bytes,
    dtype_name,
    format_bytes,
    format_gb,
    format_gib,
    to_unit,
)
from attnmem.calc.weights import weight_bytes

#: Public functions fuzzed with hostile arguments in their own test files
#: (tests/calc/test_context_parallel.py, tests/calc/test_training_step.py,
#: tests/calc/test_models_now.py) rather than in tests/calc/test_fuzz_hostile_inputs.py and
#: tests/calc/test_fuzz_hostile_models.py, which lists these tuples as covered.
CONTEXT_PARALLEL_FUNCTIONS = (
    context_parallel_memory, context_parallel_peak_bytes, context_parallel_terms,
    context_parallel_training, max_context_parallel_attention_seq_len,
    max_context_parallel_seq_len, ring_comm_bytes, ring_schedule, ring_step_kind, zigzag_chunks,
)
TRAINING_STEP_FUNCTIONS = (training_step, max_train_seq_len, train_gpus_needed)
CHECKPOINT_FUNCTIONS = (checkpoint_breakdown, checkpoint_weight_bytes, torch_total_bytes)

#: What `from attnmem.calc import *` gives, grouped as attnmem/calc/API.md lists it. Every function here is
#: fuzzed (tests/calc/test_fuzz_hostile_inputs.py, tests/calc/test_fuzz_hostile_models.py or
#: the files named above). Importable from calc but not listed: the varlen, inference-step,
#: checkpoint and MoE names marked † in attnmem/calc/API.md, tested in their own files.
__all__ = [
    # units, dtypes, limits (attnmem/calc/units.py, attnmem/calc/scores.py, attnmem/calc/fit.py)
    "DTYPES", "DTYPE_BYTES", "GB", "GIB", "MAX_BATCH", "MAX_HEADS", "MAX_HEAD_DIM",
    "MAX_SEQ_LEN", "check_int", "dtype_bytes", "dtype_name", "format_bytes", "format_gb",
    "format_gib", "to_unit", "score_matrix_bytes", "largest_fitting", "NoKernel",
    # one attention call (attnmem/calc/peak.py, attnmem/calc/attention_call.py,
    # attnmem/calc/attention_steps.py, attnmem/calc/allocator.py, attnmem/calc/fit.py, attnmem/calc/sweep.py)
    "AttentionCall", "IMPLEMENTATIONS", "IMPL_DTYPES", "IMPL_KIND", "IMPL_LABELS",
    "PEAK_MODEL_NOTES", "ALLOCATOR_NOTE", "RESERVED_PREDICTED", "PeakTerm", "CachingAllocator",
    "check_impl", "attention_flops", "attention_peak_bytes", "attention_peak_terms",
    "attention_peak_breakdown", "attention_reserved_bytes", "max_seq_len", "default_seq_lens",
    "sweep_param", "sweep_seq_len",
    # models, weights, GPUs (attnmem/calc/models.py, attnmem/calc/presets.py, attnmem/calc/params.py,
    # attnmem/calc/weights.py, attnmem/calc/kv.py, attnmem/calc/gpus.py)
    "ModelConfig", "QuantConfig", "MODELS", "PRESET_HF_CONFIGS", "fixture_name",
    "ACTIVE_CONVENTIONS", "active_param_count", "param_breakdown", "param_count",
    "weight_bytes", "kv_cache_bytes", "DEFAULT_GPU", "GPUS", "GPU_TORCH_TOTAL",
    "GPU_TORCH_TOTAL_SOURCES",
    # a model's memory (attnmem/calc/memory.py, attnmem/calc/training.py)
    "MemoryBreakdown", "gpus_needed", "model_max_seq_len", "model_memory", "TrainingAttention",
    "saved_for_backward_bytes", "training_attention", "training_attention_bytes",
    # a training step (attnmem/calc/training_step.py and its parts attnmem/calc/train_*.py,
    # attnmem/calc/parallel.py)
    "Layout", "PRECISIONS", "SHARDINGS", "SHARDING_LABELS", "TRAIN_ATTENTIONS",
    "TRAIN_ATTENTION_LABELS", "TrainingStepMemory", "LoRA", "BASE_DTYPES",
    "training_step", "max_train_seq_len", "train_gpus_needed",
    # context parallelism (attnmem/calc/context_parallel.py)
    "CP_IMPLEMENTATIONS", "CP_IMPL_LABELS", "CommVolume", "ContextParallelMemory",
    "ContextParallelTraining", "context_parallel_memory", "context_parallel_peak_bytes",
    "context_parallel_terms", "context_parallel_training",
    "max_context_parallel_attention_seq_len", "max_context_parallel_seq_len",
    "ring_comm_bytes", "ring_schedule", "ring_step_kind", "zigzag_chunks",
]
