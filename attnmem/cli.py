"""`attnmem`: what the pages compute, on the command line (installed as a console script).

    attnmem memory --model NAME|PATH|ORG/NAME --seq-len S --batch B --gpu NAME
    attnmem train  --model ... --seq-len S --batch B [--checkpointing]
    attnmem serve  --model ... --seq-len S --gpu NAME [--gpu-memory-utilization 0.9 ...]

--model is a preset name (calc.MODELS), a path to a config.json, or a Hub id (owner/name,
fetched with attnmem.hub). --json prints one JSON object for scripts. Bad input exits with
status 2 and one line naming the value and what is accepted; no tracebacks.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import calc
from attnmem.hub import HubError, fetch_model, looks_like_repo_id
from calc.kv import mla_expanded_kv_bytes, state_bytes
from calc.serving import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CUDA_GRAPH_BYTES,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_NON_TORCH_BYTES,
    prefill_decode_attention,
    serving_capacity,
)
from pages.ui.uploads import MAX_CONFIG_BYTES, load_config_json


class UsageError(ValueError):
    """Bad command-line input: printed as one line, exit status 2."""


def resolve_model(spec: str) -> calc.ModelConfig:
    """A preset name (exact or case-insensitive), a config.json path, or a Hub id."""
    if spec in calc.MODELS:
        return calc.MODELS[spec]
    folded = {name.lower(): name for name in calc.MODELS}
    if spec.lower() in folded:
        return calc.MODELS[folded[spec.lower()]]
    path = Path(spec)
    if path.is_file():
        with open(path, "rb") as f:
            d = load_config_json(f, max_bytes=MAX_CONFIG_BYTES)
        return calc.ModelConfig.from_hf_config(d, name=path.stem[:60])
    if looks_like_repo_id(spec):
        return fetch_model(spec)
    raise UsageError(
        f"--model {spec[:80]!r} is not a preset, a config.json file or a Hub id (owner/name); "
        f"presets: {', '.join(calc.MODELS)}")


def resolve_gpu(name: str) -> int:
    if name in calc.GPUS:
        return calc.GPUS[name]
    hits = [g for g in calc.GPUS if name.lower() in g.lower()]
    if len(hits) == 1:
        return calc.GPUS[hits[0]]
    raise UsageError(f"--gpu {name[:60]!r} matches {len(hits)} GPUs; choose one of: "
                     f"{', '.join(calc.GPUS)}")


def _memory(a: argparse.Namespace, model: calc.ModelConfig) -> dict:
    gpu = resolve_gpu(a.gpu)
    mm = calc.model_memory(model, a.batch, a.seq_len, a.weight_dtype, a.kv_dtype, a.act_dtype,
                           a.impl)
    # A hybrid's constant state is part of the total and the longest context is searched in
    # what it leaves, at the attention dtype: what the Model memory page counts.
    state = state_bytes(model, a.batch, a.act_dtype)
    total = mm.total_bytes + state
    out = {"model": model.name, "params": calc.param_count(model),
           "active_params": calc.active_param_count(model), "batch": a.batch,
           "seq_len": a.seq_len, "impl": a.impl, "weights_bytes": mm.weights_bytes,
           "kv_cache_bytes": mm.kv_cache_bytes, "attention_bytes": mm.attention_bytes,
           "prefill_bytes": mm.prefill_bytes, "peak_phase": mm.peak_phase,
           "peak_parts": dict(mm.inference.parts) if mm.inference else {},
           "total_is_lower_bound": mm.total_is_lower_bound, "not_modelled": mm.not_modelled,
           "state_bytes": state,
           "total_bytes": total, "gpu": a.gpu, "gpu_bytes": gpu,
           "fits": total <= gpu, "gpus_needed": calc.gpus_needed(total, gpu),
           "longest_context": calc.model_max_seq_len(model, max(gpu - state, 0), a.batch,
                                                     a.weight_dtype, a.kv_dtype, a.act_dtype,
                                                     a.impl)}
    # The total is generate()'s prefill peak (calc.inference_step); a length past the context
    # the model was trained for is flagged, not silently offered.
    trained = model.max_position_embeddings
    out["trained_context"] = trained
    out["seq_len_past_trained_context"] = bool(trained and a.seq_len > trained)
    out["longest_context_past_trained_context"] = bool(trained and out["longest_context"] > trained)
    if model.is_mla:
        out["kv_cache_expanded_bytes"] = mla_expanded_kv_bytes(model, a.batch, a.seq_len,
                                                               a.kv_dtype)
    return out


def _train(a: argparse.Namespace, model: calc.ModelConfig) -> dict:
    gpu = resolve_gpu(a.gpu)
    kw = dict(attention=a.impl, precision=a.act_dtype, checkpointing=a.checkpointing)
    result = calc.training_step(model, a.batch, a.seq_len, **kw)
    # the Training page's answers for one GPU: does the step fit, and the longest s that does
    return {"model": model.name, **asdict(result), "gpu": a.gpu, "gpu_bytes": gpu,
            "fits": result.peak_bytes <= gpu,
            "longest_context": calc.max_train_seq_len(model, gpu, a.batch, **kw)}


def _serve(a: argparse.Namespace, model: calc.ModelConfig) -> dict:
    cap = serving_capacity(
        model, resolve_gpu(a.gpu), a.seq_len, weight_dtype=a.weight_dtype, kv_dtype=a.kv_dtype,
        act_dtype=a.act_dtype, gpu_memory_utilization=a.gpu_memory_utilization,
        block_size=a.block_size, max_num_batched_tokens=a.max_num_batched_tokens,
        max_num_seqs=a.max_num_seqs, cuda_graph_bytes=a.cuda_graph_bytes,
        non_torch_bytes=a.non_torch_bytes, activation_bytes=a.activation_bytes)
    prefill, decode = prefill_decode_attention(model, a.impl, a.seq_len, 1, a.act_dtype)
    return {"model": model.name, **asdict(cap), "concurrent_sequences": cap.concurrent_sequences,
            "prefill_attention_bytes": prefill, "decode_attention_bytes": decode}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnmem", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("memory", "inference memory and the longest context"),
                           ("train", "attention memory of a training step"),
                           ("serve", "vLLM-style KV blocks, concurrency, longest context")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--model", required=True)
        s.add_argument("--seq-len", type=int, required=True)
        if name != "serve":  # serving sizes the concurrent sequences itself
            s.add_argument("--batch", type=int, default=1)
        s.add_argument("--gpu", default=calc.DEFAULT_GPU)
        if name != "train":  # a training step's dtypes all follow --act-dtype (its precision)
            s.add_argument("--weight-dtype", default="bf16")
            s.add_argument("--kv-dtype", default="bf16")
        s.add_argument("--act-dtype", default="bf16",
                       help="train: the precision, bf16 or amp_bf16 (fp32 weights under autocast)"
                       if name == "train" else None)
        s.add_argument("--impl", default="sdpa_flash",
                       choices=calc.TRAIN_ATTENTIONS if name == "train" else calc.IMPLEMENTATIONS)
        s.add_argument("--json", action="store_true", help="one JSON object on stdout")
        if name == "train":
            s.add_argument("--checkpointing", action="store_true")
        if name == "serve":
            s.add_argument("--gpu-memory-utilization", type=float,
                           default=DEFAULT_GPU_MEMORY_UTILIZATION)
            s.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
            s.add_argument("--max-num-batched-tokens", type=int,
                           default=DEFAULT_MAX_NUM_BATCHED_TOKENS)
            s.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS)
            s.add_argument("--cuda-graph-bytes", type=int, default=DEFAULT_CUDA_GRAPH_BYTES)
            s.add_argument("--non-torch-bytes", type=int, default=DEFAULT_NON_TORCH_BYTES)
            s.add_argument("--activation-bytes", type=int, default=None,
                           help="measured activation peak (vLLM log); default: an estimate")
    return p


def _text(result: dict) -> str:
    lines = []
    for key, value in result.items():
        if isinstance(value, int) and not isinstance(value, bool) and key.endswith("bytes"):
            lines.append(f"{key:28} {calc.format_bytes(value)} ({value:,} bytes)")
        else:
            lines.append(f"{key:28} {value:,}" if isinstance(value, int)
                         and not isinstance(value, bool) else f"{key:28} {value}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # argparse exits 2 with a usage line on bad flags
    try:
        model = resolve_model(args.model)
        result = {"memory": _memory, "train": _train, "serve": _serve}[args.command](args, model)
    except (UsageError, HubError, ValueError, TypeError, OSError) as err:
        print(f"attnmem {args.command}: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else _text(result))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
