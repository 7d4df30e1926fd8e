"""Measure one training step of a real transformers model in this process: memory before and
at the peak, time (``measure_train_step``).

The procedure, step by step (attnmem.calc.training_step predicts what it measures):

1. Build the model from its config (``attnmem.measure.train_models``: real widths, a few
   layers), random init, no download: ``AutoModelForCausalLM.from_config(cfg, dtype=...,
   attn_implementation=...)`` on the GPU; ``model.train()``; checkpointing on:
   ``gradient_checkpointing_enable`` with ``use_reentrant=False`` (transformers' own default
   in 5.x, passed explicitly so the row does not depend on it). AdamW
   (``torch.optim.AdamW(model.parameters(), lr=1e-5)``, foreach: torch's default, i.e. on for
   CUDA parameters). input_ids (B, s) uniform random token ids; labels = input_ids (the
   model shifts them inside its loss: ``ForCausalLMLoss``, logits upcast to fp32).
   Packed rows (``packed``, padding-free training): input_ids (1, T), position_ids restarting
   at 0 for each sequence and labels with -100 at each sequence's first token, as
   transformers' DataCollatorWithFlattening makes them (``packed_inputs``).
2. One step = forward + loss, ``loss.backward()``, ``optimizer.step()``,
   ``optimizer.zero_grad(set_to_none=True)``. Precision ``bf16``: parameters (and so AdamW's
   two moments) in bf16, no autocast. ``amp_bf16``: fp32 parameters and moments, forward and
   loss under ``torch.autocast("cuda", dtype=torch.bfloat16)``, backward and step outside it.
   ``fp32``: everything fp32 (CPU tests; the Triton interpreter has no bf16).
   The SDPA backends run the whole step (backward and checkpoint recomputation included)
   inside ``torch.nn.attention.sdpa_kernel(<that backend>)``.
3. Warm-up: one step (cuBLAS/cuDNN handles, Triton compilation, AdamW's state allocated).
4. ``gc.collect()``, ``empty_cache()``; ``before_step_bytes = memory_allocated()``: weights,
   AdamW's moments (and step counters), the inputs; no gradients (set to None).
5. ``steps`` measured steps (default 3), each between two CUDA events, with
   ``reset_peak_memory_stats()`` before the first: ``peak_bytes = max_memory_allocated()``
   over them (absolute, not minus before), ``reserved_bytes = max_memory_reserved()``,
   ``step_ms`` = median. Allocated memory after each step must come back to before (else the
   message says by how much).
6. Prediction: ``attnmem.measure.train.predict`` (attnmem.calc.training_step).

LoRA and QLoRA (adapter ``lora``; issue 34): step 1 builds the base in bf16 as above, then
(``attnmem.measure.train.finetune``) quantizes its linears to NF4 through bitsandbytes for
base_dtype nf4 / nf4_dq (no ``prepare_model_for_kbit_training``: its fp32 upcast is not
modelled), enables checkpointing, wraps it with ``peft.get_peft_model`` (fp32 adapters by
default), and AdamW takes the trainable (adapter) parameters only. ``params`` is the base's
parameter count, ``trainable_params`` the adapters'. A configuration calc refuses to model
(autocast or fp32 with adapters, fused projections) is 'unavailable' with calc's reason and is
not run; peft or bitsandbytes missing is 'unavailable' too.

The recipe (issue 43; ``attnmem.measure.train.recipes`` says what each runs): ``liger``
patches the built model (step 1, before quantizing, checkpointing and adapters, as a model
loaded with Liger; the modeling module's names are restored after the row);
``kbit_prepare`` runs peft's prepare_model_for_kbit_training on the 4-bit base in place of
the harness's enable_checkpointing (it turns checkpointing on itself); the optimizer of step 1
is ``optimizer``'s (``recipes.make_optimizer``) over the trainable parameters;
``offload_activations`` runs forward and backward of step 2 under
``torch.autograd.graph.save_on_cpu(pin_memory=True)``. A combination calc refuses is
'unavailable' with calc's reason before anything is built (as for adapters); bitsandbytes or
liger_kernel missing is 'unavailable' with the install hint. A paged optimizer's states live in
CUDA unified memory, outside memory_allocated(): the message gives their bytes
("paged optimizer state N bytes"), calc's optimizer_paged_bytes.

Out of memory is a result (status ``oom``). An attention that cannot run this model (our
kernel refusing soft-capping or dropout: ``attnmem.kernels.hf.check_config``; an SDPA backend
that has no kernel for the call; FlashAttention-4 not installed) is ``unavailable`` with the
reason (``attnmem.measure.model_common.unavailable_error``). The row:
``attnmem.measure.train.config``. No torch or transformers at import time.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import statistics
import time
from dataclasses import replace
from typing import Any

from attnmem.measure import train_models
from attnmem.measure.model_common import (
    attention_context,
    attn_implementation,
    environment,
    kernels_hf_check,
    model_from_config,
    now_utc,
    short_error,
    unavailable_error,
)
from attnmem.measure.train import recipes
from attnmem.measure.train.config import TrainConfig, TrainResult, check_config, shape_fields
from attnmem.measure.train.finetune import (
    NO_KBIT_PREPARE,
    Unavailable,
    adapter_dtype_note,
    add_lora,
    quantize_base,
)
from attnmem.measure.train.predict import prediction

USE_REENTRANT = False  # what gradient checkpointing is enabled with (transformers' default)


def enable_checkpointing(model: Any) -> None:
    """Gradient (activation) checkpointing with ``use_reentrant=USE_REENTRANT``."""
    kwargs = {"use_reentrant": USE_REENTRANT}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x: the new name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def packed_inputs(ids: Any, lengths: tuple[int, ...]) -> dict[str, Any]:
    """What transformers' DataCollatorWithFlattening gives the model for sequences packed
    into one row (its defaults, return_position_ids=True, separator_id=-100): position_ids
    counting from 0 in each sequence, and labels = the ids with -100 at each sequence's first
    token (so no sequence is trained to predict the next one's start). Both int64 (1, T) on
    the ids' device; the model finds the sequences from the restarting position_ids
    (masking_utils.find_packed_sequence_indices; our kernel: attnmem/kernels/hf/attention.py)."""
    import torch

    dev = ids.device
    pos = torch.cat([torch.arange(n, device=dev) for n in lengths]).unsqueeze(0)
    labels = ids.clone()
    starts = torch.tensor([0, *itertools.accumulate(lengths[:-1])], device=dev)
    labels[0, starts] = -100
    return {"position_ids": pos, "labels": labels}


def measure_train_step(cfg: TrainConfig, *, device: Any = None) -> TrainResult:
    """Measure cfg in this process (module docstring). Never raises for OOM or a refusal."""
    t0 = time.perf_counter()
    res = _measure(cfg, device)
    return replace(res, wall_s=round(time.perf_counter() - t0, 3), timestamp=now_utc())


def _measure(cfg: TrainConfig, device: Any) -> TrainResult:
    base = cfg.row_identity()
    bad = check_config(cfg)
    if bad:
        return TrainResult(**base, status="error", message=bad)
    import torch

    from attnmem.measure.harness import default_device, is_oom

    device = device or default_device()
    env = environment(device)
    config_dict = train_models.hf_config(cfg.model, cfg.layers)
    hf = train_models.build_config(config_dict)
    shape = shape_fields(hf)
    pred = prediction(cfg, config_dict)
    pred_peak, pred_before = pred.peak, pred.before
    row = {**base, **shape, **env, "predicted_peak_bytes": pred_peak,
           "predicted_before_bytes": pred_before}
    notes = [pred.message] if pred.message and not pred.refused else []
    if cfg.checkpointing:
        notes.append(f"checkpointing: use_reentrant={USE_REENTRANT}")
    if cfg.base_dtype != "bf16" and not cfg.kbit_prepare:
        notes.append(NO_KBIT_PREPARE)

    def result(status: str, message: str = "", **values: Any) -> TrainResult:
        msg = "; ".join(m for m in [message, *notes] if m)
        return TrainResult(**row, status=status, message=msg, **values)

    if pred.refused:
        return result("unavailable", f"calc does not model this: {pred.refused}")
    if cfg.kbit_prepare and not cfg.checkpointing:  # reached only where calc gave no verdict
        return result("unavailable", "kbit_prepare turns checkpointing on "
                      "(prepare_model_for_kbit_training's default): run it with checkpointing on")
    try:
        recipes.check_libraries(cfg)
    except Unavailable as exc:
        return result("unavailable", str(exc))
    if cfg.attention == "triton":
        why = kernels_hf_check(hf, cfg.seq_len)
        if why:
            return result("unavailable", "our kernel cannot run this model: " + "; ".join(why))
    if cfg.precision == "amp_bf16" and device.name != "cuda":
        notes.append("autocast on the CPU")
    attn_ctx, why_not = attention_context(cfg.attention)
    if attn_ctx is None:
        return result("unavailable", why_not)
    dev = "cuda" if device.name == "cuda" else "cpu"
    param_dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    autocast = cfg.precision == "amp_bf16"
    state: dict[str, Any] = {}
    params: int | None = None
    trainable_params: int | None = None
    patches = recipes.ModulePatches()  # what Liger rewrites, put back after the row
    try:
        impl = attn_implementation(cfg.attention)
        gc.collect()
        device.empty_cache()
        # Only ``state`` holds the model, optimizer and inputs (no local names), so that
        # clearing it frees them, also after an OOM.
        with torch.device(dev):
            state["model"] = model_from_config(hf, param_dtype, impl)
        if next(state["model"].parameters()).device.type != dev:
            state["model"].to(dev)
        state["model"].train()
        params = sum(p.numel() for p in state["model"].parameters())
        if cfg.liger:
            notes.append(f"{recipes.apply_liger(state['model'], patches)}"
                         f"({', '.join(f'{k}={v}' for k, v in recipes.LIGER_FLAGS.items())}), "
                         f"liger-kernel {recipes.library_version('liger_kernel')}")
        if cfg.base_dtype != "bf16":
            quantize_base(state["model"], cfg.base_dtype)
        if cfg.kbit_prepare:
            state["model"] = recipes.kbit_prepare(state["model"], USE_REENTRANT)
            notes.append(f"prepare_model_for_kbit_training (peft "
                         f"{recipes.library_version('peft')}) before the adapters")
        elif cfg.checkpointing:
            enable_checkpointing(state["model"])
        if cfg.lora:
            state["model"] = add_lora(state["model"], cfg)
            state["model"].train()
        trainable = [p for p in state["model"].parameters() if p.requires_grad]
        trainable_params = sum(p.numel() for p in trainable)
        if cfg.lora:
            note = adapter_dtype_note(trainable, cfg)
            if note:
                notes.append(note)
        state["opt"] = recipes.make_optimizer(cfg.optimizer, trainable)
        del trainable
        if cfg.optimizer in recipes.BNB_OPTIMIZERS or cfg.base_dtype != "bf16":
            notes.append(f"bitsandbytes {recipes.library_version('bitsandbytes')}")
        state["ids"] = torch.randint(0, shape["vocab"], (cfg.batch, cfg.seq_len), device=dev)
        state["inputs"] = {"labels": state["ids"]}
        if cfg.packed:
            state["inputs"] = packed_inputs(state["ids"], cfg.packed_lengths())
        s = state
        offload = (lambda: recipes.offload_context(pin_memory=dev == "cuda")) \
            if cfg.offload_activations else contextlib.nullcontext

        def step() -> float:
            with attn_ctx():
                with offload():  # forward and backward (offload_activations)
                    with torch.autocast(dev, dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
                        loss = s["model"](input_ids=s["ids"], use_cache=False,
                                          **s["inputs"]).loss
                    loss.backward()
                s["opt"].step()
                s["opt"].zero_grad(set_to_none=True)
            return float(loss.detach())

        # Warm-up.
        losses = [step()]
        device.sync()
        if cfg.optimizer == "paged_adamw_8bit":
            notes.append(f"paged optimizer state {recipes.paged_state_bytes(s['opt'])} bytes "
                         "(CUDA unified memory, outside memory_allocated)")
        gc.collect()
        device.empty_cache()
        device.sync()
        before = device.allocated()
        device.reset_peak()
        times: list[float] = []
        leftover = 0
        for _ in range(cfg.steps):
            box: list[float] = []
            times.append(device.elapsed(lambda box=box: box.append(step())))
            losses.append(box[0])
            leftover = max(leftover, device.allocated() - before)
        peak = device.max_allocated()
        reserved = device.max_reserved()
    except Exception as exc:  # noqa: BLE001 - OOM and refusals are results; the rest 'error'
        status = ("oom" if is_oom(exc) else
                  "unavailable" if isinstance(exc, Unavailable) or unavailable_error(exc)
                  else "error")
        message = short_error(exc)
        del exc
        state.clear()
        patches.restore()
        gc.collect()
        device.empty_cache()
        return result(status, message, params=params, trainable_params=trainable_params)
    state.clear()
    patches.restore()
    gc.collect()
    device.empty_cache()
    if leftover > 0:
        notes.append(f"allocated memory grew by {leftover} bytes over a measured step")
    measured = device.name == "cuda"
    rel = ((pred_peak - peak) / peak) if (measured and pred_peak is not None and peak) else None
    return result(
        "ok", params=params, trainable_params=trainable_params,
        before_step_bytes=before if measured else None,
        peak_bytes=peak if measured else None, reserved_bytes=reserved if measured else None,
        step_ms=round(statistics.median(times), 3), steps=len(times), loss=round(losses[-1], 4),
        peak_rel_error=rel)

