"""The fine-tuning recipe of a measured training step (issue 43): the optimizer, peft's
prepare step, Liger's kernels and activation offloading, each run as attnmem.calc.training_step
counts it (attnmem/calc/train_optimizer.py, train_recipes.py, train_liger.py), so that a row's
prediction and its measurement are the same recipe.

- ``make_optimizer``: ``adamw`` torch.optim.AdamW (foreach, torch's default on CUDA),
  ``adamw_fused`` the same with fused=True, ``adamw_8bit`` / ``paged_adamw_8bit``
  bitsandbytes.optim.AdamW8bit / PagedAdamW8bit with their defaults (Optimizer2State,
  optim_bits 8, min_8bit_size 4096, block-wise; the paged one's states of tensors of
  >= 1e5 elements in CUDA unified memory, which max_memory_allocated does not count),
  ``adafactor`` transformers.optimization.Adafactor with its defaults (beta1 None: no first
  moment; relative_step=True, so lr stays None), ``sgd`` torch.optim.SGD with its default
  momentum 0 (no state). The learning rate (1e-5 where one is taken) changes no byte.
- ``kbit_prepare``: ``peft.prepare_model_for_kbit_training(model,
  use_gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant":
  USE_REENTRANT})`` on the 4-bit base before the adapters, as peft's QLoRA recipes call it:
  it freezes the base, casts every bf16 parameter that is not a Params4bit to fp32
  (embeddings, lm_head, norms, biases) and turns checkpointing on (in place of the harness's
  own enable_checkpointing; use_reentrant is passed as the harness's other rows run it and as
  calc assumes).
- ``liger``: liger-kernel's ``apply_liger_kernel_to_<model_type>`` (llama, mistral, qwen2:
  ``LIGER_APPLY``) on the built model instance with the flags calc counts (``LIGER_FLAGS``:
  rope, rms_norm, swiglu, fused_linear_cross_entropy on; cross_entropy off). The function also
  replaces names in the transformers modeling module (apply_rotary_pos_emb, the RMSNorm and
  MLP classes); ``ModulePatches`` restores them after the row, so that a later row of the
  same worker builds and runs the unpatched model.
- ``offload_activations``: ``offload_context`` is torch.autograd.graph.save_on_cpu(
  pin_memory=True), entered around forward and backward (the optimizer step saves nothing).

A library the recipe needs that does not import (bitsandbytes, liger_kernel, peft) raises
``Unavailable`` (the row is 'unavailable' with the reason and the install hint) before any
model is built (``check_libraries``).

No torch, transformers, peft, bitsandbytes or liger_kernel at import time.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from attnmem.measure.train.config import TrainConfig
from attnmem.measure.train.finetune import Unavailable, import_bitsandbytes, import_peft

#: The learning rate of every optimizer that takes one (no byte depends on it).
LR = 1e-5
#: The optimizers bitsandbytes provides.
BNB_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit")
#: The version of liger-kernel whose sources attnmem/calc/train_liger.py counts (its files
#: that matter are those of the commit calc cites, ead96b6); carried as a wheel to the GPU.
LIGER_VERSION = "0.8.2"
#: liger-kernel's patch function per transformers model_type (calc's LIGER_MODEL_TYPES).
LIGER_APPLY: dict[str, str] = {"llama": "apply_liger_kernel_to_llama",
                               "mistral": "apply_liger_kernel_to_mistral",
                               "qwen2": "apply_liger_kernel_to_qwen2"}
#: The flags calc counts (attnmem/calc/train_liger.py: the functions' defaults, passed
#: explicitly so that a later default cannot change the measured recipe).
LIGER_FLAGS: dict[str, bool] = {"rope": True, "cross_entropy": False,
                                "fused_linear_cross_entropy": True, "rms_norm": True,
                                "swiglu": True}
#: The transformers modeling module a Liger patch rewrites, per model_type.
LIGER_MODULES: dict[str, str] = {t: f"transformers.models.{t}.modeling_{t}" for t in LIGER_APPLY}


def import_liger() -> ModuleType:
    """liger_kernel.transformers, or Unavailable with the reason and the install hint."""
    try:
        return importlib.import_module("liger_kernel.transformers")
    except ImportError as exc:
        raise Unavailable(f"liger_kernel not installed ({exc}): --liger needs it (pip install "
                          f"liger-kernel=={LIGER_VERSION}, or carry its wheel)") from None


def check_libraries(cfg: TrainConfig) -> None:
    """Import what cfg's recipe needs (peft for adapters and the prepare step, bitsandbytes
    for a 4-bit base or an 8-bit optimizer, liger_kernel for Liger); Unavailable otherwise."""
    if cfg.lora or cfg.kbit_prepare:
        import_peft()
    if cfg.base_dtype != "bf16":
        import_bitsandbytes()
    if cfg.optimizer in BNB_OPTIMIZERS:
        import_bitsandbytes(f"optimizer {cfg.optimizer}")
    if cfg.liger:
        import_liger()


def make_optimizer(name: str, params: Iterable[Any]) -> Any:
    """The optimizer ``name`` (config.OPTIMIZERS) over ``params`` (module docstring)."""
    import torch

    params = list(params)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LR)
    if name == "adamw_fused":
        return torch.optim.AdamW(params, lr=LR, fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params)
    if name in BNB_OPTIMIZERS:
        bnb = import_bitsandbytes(f"optimizer {name}")
        cls = bnb.optim.AdamW8bit if name == "adamw_8bit" else bnb.optim.PagedAdamW8bit
        return cls(params, lr=LR)
    raise ValueError(f"unknown optimizer {name!r}")


def paged_state_bytes(optimizer: Any) -> int:
    """Bytes of the optimizer's state tensors in CUDA unified memory (bitsandbytes marks the
    buffers of F.get_paged with ``is_paged``; on the CPU nothing is paged)."""
    import torch

    return sum(t.nbytes for st in optimizer.state.values() for t in st.values()
               if isinstance(t, torch.Tensor) and getattr(t, "is_paged", False))


def paged_held_bytes() -> int:
    """Bytes of unified memory this process's paged optimizers have made: bitsandbytes keeps
    every paged buffer in its GlobalPageManager and never frees it (F.get_paged wraps a
    cudaMallocManaged pointer), so the worker counts it as memory left over (0 before
    bitsandbytes is imported)."""
    import sys

    if "bitsandbytes" not in sys.modules:
        return 0
    from bitsandbytes.functional import GlobalPageManager

    return sum(t.nbytes for t in GlobalPageManager.get_instance().paged_tensors)


def library_version(module: str) -> str:
    """The installed version of an imported library (its __version__, else the
    distribution's), '?' when neither says."""
    from importlib import metadata

    v = getattr(importlib.import_module(module), "__version__", None)
    if v:
        return str(v)
    try:
        return metadata.version(module.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return "?"


def kbit_prepare(model: Any, use_reentrant: bool) -> Any:
    """peft's prepare_model_for_kbit_training on the quantized base (module docstring)."""
    peft = import_peft()
    return peft.prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})


class ModulePatches:
    """The names of modules as they were before a library rewrote them, put back by
    ``restore`` (a name the library added is removed)."""

    _MISSING = object()

    def __init__(self) -> None:
        self._saved: list[tuple[ModuleType, dict[str, Any]]] = []

    def snapshot(self, module: ModuleType) -> None:
        self._saved.append((module, dict(vars(module))))

    def changed(self) -> list[str]:
        """'module.name' of every name that differs from its snapshot."""
        out = []
        for module, before in self._saved:
            now = vars(module)
            out += [f"{module.__name__}.{k}" for k in sorted(set(before) | set(now))
                    if now.get(k, self._MISSING) is not before.get(k, self._MISSING)]
        return out

    def restore(self) -> None:
        for module, before in reversed(self._saved):
            now = vars(module)
            for k in [k for k in now if k not in before]:
                delattr(module, k)
            for k, v in before.items():
                if now.get(k, self._MISSING) is not v:
                    setattr(module, k, v)
        self._saved.clear()


def apply_liger(model: Any, patches: ModulePatches) -> str:
    """Liger's patch of model's type on the instance (module docstring); the modeling module's
    names are snapshotted in ``patches`` first. Returns the function's name."""
    model_type = model.config.model_type
    if model_type not in LIGER_APPLY:
        raise Unavailable(f"no Liger patch is run for model type {model_type!r}; accepted: "
                          f"{', '.join(LIGER_APPLY)}")
    liger = import_liger()
    patches.snapshot(importlib.import_module(LIGER_MODULES[model_type]))
    getattr(liger, LIGER_APPLY[model_type])(model=model, **LIGER_FLAGS)
    return LIGER_APPLY[model_type]


def offload_context(pin_memory: bool = True) -> Any:
    """torch.autograd.graph.save_on_cpu(pin_memory=True): every tensor autograd saves goes to
    pinned host memory and comes back when its node's backward runs (``pin_memory`` False
    only where there is no GPU to pin for: the CPU runs of the tests)."""
    import torch

    return torch.autograd.graph.save_on_cpu(pin_memory=pin_memory)
