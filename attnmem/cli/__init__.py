"""`attnmem`: what the pages compute, on the command line (installed as a console script).

    attnmem memory --model NAME|PATH|ORG/NAME --seq-len S --batch B --gpu NAME
    attnmem train  --model ... --seq-len S --batch B [--checkpointing]
                   [--adapter none|lora|qlora --rank R --targets attention|all-linear ...]
    attnmem serve  --model ... --seq-len S --gpu NAME [--gpu-memory-utilization 0.9 ...]

--model is a preset name (attnmem.calc.MODELS), a path to a config.json, or a Hub id (owner/name,
fetched with attnmem.hub). Lengths take 131072, 131,072, 131_072, 128k or 1M (K = 1,024 and
M = 1,048,576 tokens, as the pages' sliders label them). Plain output is a short table;
--json prints one JSON object for scripts. Bad input exits with status 2 and one line naming
the value and what is accepted; no tracebacks.

Only argparse is imported before the arguments are parsed: calc pulls in pandas (and a
config.json path or Hub id more), which made the first `attnmem --help` take seconds. The
defaults and choices the parser shows are therefore written out here; tests/cli checks that
they equal calc's.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, NoReturn

from attnmem.cli.common import (
    UsageError,
    _names_a_file,
    gpu_name,
    resolve_gpu,
)
from attnmem.cli.text import _text, _text_traced, _text_traced_serve, _text_traced_train
from attnmem.cli.traced import (
    _config_to_trace,
    _LowerBound,
    _trace_counted_from,
    _traced_memory,
    _traced_serve,
    _trained_context_of,
)

# --- calc's defaults and choices, copied so that --help imports nothing (tests/cli checks them)

DEFAULT_GPU = "NVIDIA H100 80GB"  # attnmem.calc.DEFAULT_GPU
IMPLEMENTATIONS = ("naive", "naive_inplace", "sdpa_math", "sdpa_efficient", "sdpa_flash",
                   "sdpa_cudnn", "triton", "fa4")  # attnmem.calc.IMPLEMENTATIONS
TRAIN_ATTENTIONS = ("eager", *IMPLEMENTATIONS)  # attnmem.calc.TRAIN_ATTENTIONS
TRAIN_OPTIMIZERS = ("adamw", "adamw_fused", "adamw_8bit", "paged_adamw_8bit", "adafactor",
                    "sgd")  # attnmem.calc.training_step.OPTIMIZERS
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4")  # attnmem.calc.DTYPES
PRECISIONS = ("bf16", "amp_bf16")  # attnmem.calc.training_step.PRECISIONS
# fine-tuning: attnmem.calc.finetune's methods ("none" is the page's "full"), targets,
# adapter dtypes and default rank
ADAPTERS = ("none", "lora", "qlora")
LORA_TARGETS = ("attention", "all-linear")  # attnmem.calc.training_step.LORA_TARGET_SETS
ADAPTER_DTYPES = ("fp32", "bf16")  # attnmem.calc.training_step.ADAPTER_DTYPES
DEFAULT_LORA_RANK = 16  # attnmem.calc.finetune.DEFAULT_RANK
DEFAULT_LORA_TARGETS = "all-linear"
DEFAULT_ADAPTER_DTYPE = "fp32"
MAX_LORA_RANK = 65_536
MAX_SEQ_LEN = 100_000_000  # attnmem.calc.units.MAX_SEQ_LEN
MAX_BATCH = 1_000_000  # attnmem.calc.units.MAX_BATCH
# attnmem.calc.serving's vLLM defaults
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_BLOCK_SIZE = 16
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_NON_TORCH_BYTES = 338 * 2**20
DEFAULT_CUDA_GRAPH_BYTES = 369 * 2**20


# --- parsing numbers ------------------------------------------------------------------------

_COUNT = re.compile(r"([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+(?:_[0-9]+)*)(?:\.([0-9]+))?\s*([kKmM]?)")
_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20}
_BYTES = re.compile(r"([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+(?:_[0-9]+)*)(?:\.([0-9]+))?\s*([kKmMgG]i?[bB])?")
_BYTE_UNITS = {"": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9,
               "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _scaled(whole: str, frac: str | None, mult: int) -> int | None:
    """whole.frac × mult as an integer, or None when that is not a whole number."""
    digits = whole.replace(",", "").replace("_", "")
    num = int(digits + (frac or "")) * mult
    den = 10 ** len(frac or "")
    return num // den if num % den == 0 else None


def count_type(what: str, lo: int, hi: int, unit: str = "tokens") -> Any:
    """An argparse type for a whole number from lo to hi, written 131072, 131,072, 131_072,
    128k or 1M (K = 1,024, M = 1,048,576: the pages' slider labels)."""
    accepted = (f"a whole number of {unit} from {lo:,} to {hi:,}, written like 131072, "
                "131,072, 131_072, 128k or 1M (k = 1,024, M = 1,048,576)")

    def parse(text: str) -> int:
        m = _COUNT.fullmatch(text.strip())
        value = _scaled(m.group(1), m.group(2), _SUFFIX[m.group(3).lower()]) if m else None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not accepted; {what} is "
                                             f"{accepted}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


def rank_type(text: str) -> int:
    """A LoRA rank: a whole number from 1 to MAX_LORA_RANK."""
    t = text.strip().replace(",", "").replace("_", "")
    if not (t.isascii() and t.isdigit() and 1 <= int(t) <= MAX_LORA_RANK):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not accepted; a LoRA rank is a "
                                         f"whole number from 1 to {MAX_LORA_RANK:,}, e.g. 16")
    return int(t)


def packed_type(text: str) -> tuple[int, ...]:
    """Sequence lengths packed into one row: whole numbers >= 1 separated by commas or '+'
    (1000,3000,512 or 1000+3000+512; 1k works too)."""
    one = count_type("each --packed length", 1, MAX_SEQ_LEN)
    parts = [p for p in text.replace("+", ",").split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not accepted; --packed takes the "
                                         "sequence lengths, e.g. 1000,3000,512")
    return tuple(one(p) for p in parts)


def bytes_type(text: str) -> int:
    """A byte count: 354334802, 354,334,802, 338MiB, 0.5GiB, 400MB (GB = 10^9, GiB = 2^30)."""
    m = _BYTES.fullmatch(text.strip())
    value = (_scaled(m.group(1), m.group(2), _BYTE_UNITS[(m.group(3) or "").lower()])
             if m else None)
    if value is None:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not accepted; a size is a whole number of bytes, written like "
            "354334802 or 354,334,802, or with a unit: 338MiB, 0.5GiB, 400MB (KB/MB/GB = "
            "10^3/10^6/10^9, KiB/MiB/GiB = 2^10/2^20/2^30)")
    return value


def fraction_type(text: str) -> float:
    """A fraction in (0, 1], e.g. 0.9."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not accepted; give a fraction "
                                         "above 0 and at most 1, e.g. 0.9")
    return value


# --- the parser -----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the problem and where to read more, no usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="attnmem", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                epilog="Run `attnmem COMMAND --help` for a command's options and defaults.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=_Parser)
    for name, helptext in (
            ("memory", "inference memory (generate()'s peak), whether it fits, the longest "
                       "context"),
            ("train", "a training step's peak per GPU (weights, gradients, optimizer, "
                      "activations), whether it fits, the longest context"),
            ("serve", "vLLM-style KV blocks: concurrent requests and the longest request")):
        s = sub.add_parser(name, help=helptext, description=helptext)
        s.add_argument("--model", required=True, metavar="NAME|PATH|ORG/NAME",
                       help="a preset as on the pages (e.g. 'Llama 3.1 8B'; case does not "
                            "matter; a wrong name lists them), a config.json file, or a "
                            "Hugging Face Hub id. Required")
        s.add_argument("--seq-len", required=name != "train", metavar="S",
                       type=count_type("--seq-len", 1, MAX_SEQ_LEN),
                       help="context length in tokens: 131072, 131,072, 128k or 1M "
                            "(k = 1,024, M = 1,048,576). Required"
                            if name == "memory" else
                            "tokens per sequence: 131072, 131,072, 128k or 1M (k = 1,024, "
                            "M = 1,048,576). default: the packed total with --packed, else "
                            f"{TRAIN_SEQ_LEN:,}"
                            if name == "train" else
                            "context length of each request in tokens: 131072, 131,072, "
                            "128k or 1M (k = 1,024, M = 1,048,576). Required")
        if name != "serve":  # serving sizes the concurrent sequences itself
            s.add_argument("--batch", default=1, metavar="B",
                           type=count_type("--batch", 1, MAX_BATCH, unit="sequences"),
                           help="sequences processed together (1,000 and 1k work too; "
                                "default: %(default)s)")
        s.add_argument("--gpu", default=DEFAULT_GPU, metavar="NAME",
                       help="a GPU as on the pages, or a part of its name that matches one "
                            "(e.g. 'H200', 'H100 80GB'; default: %(default)s)")
        if name != "train":  # a training step's dtypes all follow --act-dtype (its precision)
            s.add_argument("--weight-dtype", default="bf16", metavar="DTYPE",
                           help="weights: " + ", ".join(DTYPES) + ", a torch spelling "
                                "(bfloat16) or 'checkpoint' (default: %(default)s)")
            s.add_argument("--kv-dtype", default="bf16", metavar="DTYPE",
                           help="KV cache: " + ", ".join(DTYPES) + " (fp8_e4m3 halves it; "
                                "default: %(default)s)")
        if name == "train":
            s.add_argument("--act-dtype", default="bf16", choices=PRECISIONS,
                           help="the step's precision: bf16 (bf16 weights) or amp_bf16 (fp32 "
                                "weights under autocast; default: %(default)s)")
        else:
            s.add_argument("--act-dtype", default="bf16", metavar="DTYPE",
                           help="activations and attention: " + ", ".join(DTYPES)
                                + " (default: %(default)s)")
        impls = TRAIN_ATTENTIONS if name == "train" else IMPLEMENTATIONS
        s.add_argument("--impl", default="sdpa_flash", choices=impls, metavar="IMPL",
                       help="attention implementation: " + ", ".join(impls)
                            + " (default: %(default)s)")
        if name == "train":
            s.add_argument("--packed", default=None, metavar="LENGTHS", type=packed_type,
                           help="padding-free training: the lengths of the sequences packed "
                                "into one row, e.g. 1000,3000,512 (position ids restart at "
                                "each; batch 1, --seq-len their sum; default: none, dense "
                                "rows of --seq-len)")
            s.add_argument("--checkpointing", action="store_true",
                           help="activation checkpointing: each layer's activations are "
                                "recomputed in the backward (default: off)")
            s.add_argument("--adapter", default="none", choices=ADAPTERS, metavar="METHOD",
                           help="what is trained: none (full training), lora (peft LoRA "
                                "adapters on a frozen bf16 base) or qlora (LoRA on a frozen "
                                "4-bit NF4 base) (default: %(default)s)")
            s.add_argument("--rank", default=None, metavar="R",
                           type=rank_type,
                           help=f"LoRA rank r, with --adapter lora|qlora (default: "
                                f"{DEFAULT_LORA_RANK})")
            s.add_argument("--targets", default=None, choices=LORA_TARGETS, metavar="TARGETS",
                           help="the linears LoRA adapts, with --adapter lora|qlora: attention "
                                "(q, k, v, o) or all-linear (q, k, v, o, gate, up, down) "
                                f"(default: {DEFAULT_LORA_TARGETS})")
            s.add_argument("--adapter-dtype", default=None, choices=ADAPTER_DTYPES,
                           metavar="DTYPE",
                           help="the adapters' dtype, with --adapter lora|qlora: fp32 (peft's "
                                "default autocast_adapter_dtype=True) or bf16 (default: "
                                f"{DEFAULT_ADAPTER_DTYPE})")
            s.add_argument("--double-quant", action="store_true",
                           help="QLoRA's double quantization (bnb_4bit_use_double_quant: 8-bit "
                                "absmax constants), with --adapter qlora (default: off)")
            s.add_argument("--gpus", default=None, metavar="N",
                           type=count_type("--gpus", 1, 1 << 20, unit="GPUs"),
                           help="GPUs N, all data-parallel (default: --ep)")
            s.add_argument("--sharding", default="none",
                           choices=("none", "zero1", "zero2", "zero3", "fsdp"),
                           help="sharding over the data-parallel ranks: none (DDP), zero1, "
                                "zero2, zero3 or fsdp (default: %(default)s)")
            s.add_argument("--ep", default=1, metavar="E",
                           type=count_type("--ep", 1, 1 << 20, unit="ranks"),
                           help="expert-parallel degree of a MoE model: each of E ranks holds "
                                "1/E of every layer's experts, tokens reach them by all-to-all "
                                "(balanced routing assumed); it divides --gpus and the experts "
                                "(default: 1)")
        if name == "train":  # the recipe levers (issue 43; attnmem.calc.train_levers)
            s.add_argument("--optimizer", default="adamw", choices=TRAIN_OPTIMIZERS,
                           metavar="OPT", help="optimizer: " + ", ".join(TRAIN_OPTIMIZERS)
                           + " (default: %(default)s)")
            s.add_argument("--kbit-prepare", action="store_true",
                           help="peft's prepare_model_for_kbit_training before the adapters "
                                "(QLoRA recipes: fp32 embeddings, lm_head and norms; needs "
                                "--adapter qlora and --checkpointing; default: off)")
            s.add_argument("--liger", action="store_true",
                           help="Liger's kernels (RMSNorm, SwiGLU, RoPE, fused linear "
                                "cross-entropy; default: off)")
            s.add_argument("--offload-activations", action="store_true",
                           help="saved activations in pinned host memory (save_on_cpu; "
                                "default: off)")
            s.add_argument("--trl-fused-head", action="store_true",
                           help="the loss through TRL SFTTrainer's fused LM head (trl 1.16: "
                                "no full logits; set by --trl-args; default: off, the model's "
                                "own loss)")
            s.add_argument("--trl-args", default=None, metavar="ARGS",
                           help="TRL SFTConfig arguments as JSON or key=value list (e.g. "
                                "'per_device_train_batch_size=2,max_length=4096,"
                                "use_liger_kernel=true'): they set batch, length, "
                                "checkpointing, optimizer, Liger, offloading, packing; default: none)")
            s.add_argument("--cheapest", action="store_true",
                           help="also search the fewest levers (Liger, 8-bit or paged AdamW, "
                                "checkpointing, offloading) whose peak fits --gpu, with each "
                                "lever's saving (default: off)")
        if name == "serve":
            s.add_argument("--gpu-memory-utilization", type=fraction_type, metavar="F",
                           default=DEFAULT_GPU_MEMORY_UTILIZATION,
                           help="fraction of the GPU vLLM may use (default: %(default)s)")
            s.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE,
                           choices=BLOCK_SIZES, metavar="TOKENS",
                           help="tokens per KV block: " + ", ".join(map(str, BLOCK_SIZES))
                                + " (default: %(default)s)")
            s.add_argument("--max-num-batched-tokens", metavar="TOKENS",
                           type=count_type("--max-num-batched-tokens", 1, 1_048_576),
                           default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
                           help="tokens in one scheduler step, which sizes the activation "
                                "peak (8k works too; default: %(default)s)")
            s.add_argument("--max-num-seqs", metavar="N", default=DEFAULT_MAX_NUM_SEQS,
                           type=count_type("--max-num-seqs", 1, 65_536, unit="requests"),
                           help="requests scheduled at once, a cap on the concurrency "
                                "(default: %(default)s)")
            s.add_argument("--cuda-graph-bytes", type=bytes_type, metavar="SIZE",
                           default=DEFAULT_CUDA_GRAPH_BYTES,
                           help="CUDA graph memory from vLLM's start-up log; bytes or e.g. "
                                "369MiB (default: %(default)s bytes = 369 MiB)")
            s.add_argument("--non-torch-bytes", type=bytes_type, metavar="SIZE",
                           default=DEFAULT_NON_TORCH_BYTES,
                           help="non-torch memory from vLLM's start-up log; bytes or e.g. "
                                "338MiB (default: %(default)s bytes = 338 MiB)")
            s.add_argument("--activation-bytes", type=bytes_type, default=None,
                           metavar="SIZE",
                           help="measured activation peak (vLLM's log); bytes or e.g. 2GiB "
                                "(default: an estimate)")
        s.add_argument("--unit", default="GB", choices=("GB", "GiB"),
                       help="plain output in GB (10^9 bytes) or GiB (2^30); small sizes "
                            "switch to MB/KB (default: %(default)s)")
        s.add_argument("--json", action="store_true",
                       help="print one JSON object (exact byte counts) instead of the table")
        if name == "memory":
            s.add_argument("--trace", action="store_true",
                           help="where calc's rules give only a lower bound (hybrids, "
                                "gpt-oss), trace generate() on the meta device instead "
                                "(attnmem.trace: seconds; minutes for Mamba layers, whose "
                                "reference scan loops over the tokens; default: off)")
            s.add_argument("--longest", action="store_true",
                           help="for a model calc has no rules for (traced): also search the "
                                "longest prompt that fits, a trace per doubling, then a "
                                "length model (attnmem.trace.lengths); rules models always "
                                "get it (default: off)")
    return p


# --- inputs -----------------------------------------------------------------------------------


def resolve_model(spec: str) -> Any:
    """A preset name (exact or case-insensitive), a config.json path, or a Hub id."""
    from pathlib import Path

    import attnmem.calc

    if spec in attnmem.calc.MODELS:
        return attnmem.calc.MODELS[spec]
    folded = {name.lower(): name for name in attnmem.calc.MODELS}
    if spec.lower() in folded:
        return attnmem.calc.MODELS[folded[spec.lower()]]
    path = Path(spec).expanduser()
    if path.is_file():
        return _model_from_file(path)
    if path.is_dir():
        inner = path / "config.json"
        raise UsageError(f"--model {spec[:200]!r} is a folder, not a config.json file; give "
                         + (str(inner)[:300] if inner.is_file() else "the path of its config.json"))
    if _names_a_file(spec):
        raise UsageError(f"--model {spec[:200]!r}: file not found: {str(path.absolute())[:300]}; "
                         "give a config.json that exists, a preset name or a Hub id (owner/name)")
    from attnmem.hub import fetch_model, looks_like_repo_id

    if looks_like_repo_id(spec):
        return fetch_model(spec)
    raise UsageError(
        f"--model {spec[:80]!r} is not a preset, a config.json file or a Hub id (owner/name); "
        f"presets: {', '.join(attnmem.calc.MODELS)}")


def _model_from_file(path: Any) -> Any:
    """ModelConfig of a config.json file; what keeps it from being read or used names the file."""
    import attnmem.calc
    from attnmem.calc.config_json import MAX_CONFIG_BYTES, load_config_json

    shown = repr(str(path)[:300])
    try:
        with open(path, "rb") as f:
            d = load_config_json(f, max_bytes=MAX_CONFIG_BYTES)
        return attnmem.calc.ModelConfig.from_hf_config(d, name=path.stem[:60])
    except OSError as err:
        raise UsageError(f"--model {shown}: cannot read it: {err.strerror or err}") from None
    except ValueError as err:  # not JSON, not an object, an architecture calc does not know
        raise UsageError(f"--model {shown}: {err}") from None


# --- the three commands -----------------------------------------------------------------------


def _memory(a: argparse.Namespace, model: Any) -> dict:
    import attnmem.calc
    from attnmem.calc.kv import mla_expanded_kv_bytes, state_bytes

    gpu = resolve_gpu(a.gpu)
    mm = attnmem.calc.model_memory(model, a.batch, a.seq_len, a.weight_dtype, a.kv_dtype, a.act_dtype,
                           a.impl)
    # A hybrid's constant state is part of the total and the longest context is searched in
    # what it leaves, at the attention dtype: what the Model memory page counts.
    state = state_bytes(model, a.batch, a.act_dtype)
    total = mm.total_bytes + state
    out = {"model": model.name, "params": attnmem.calc.param_count(model),
           "active_params": attnmem.calc.active_param_count(model), "batch": a.batch,
           "active_params_without_input_embedding": attnmem.calc.active_param_count(model, include_embedding=False),
           "seq_len": a.seq_len, "impl": a.impl, "weights_bytes": mm.weights_bytes,
           "kv_cache_bytes": mm.kv_cache_bytes, "attention_bytes": mm.attention_bytes,
           "prefill_bytes": mm.prefill_bytes, "peak_phase": mm.peak_phase,
           "peak_parts": dict(mm.inference.parts) if mm.inference else {},
           "total_is_lower_bound": mm.total_is_lower_bound, "not_modelled": mm.not_modelled,
           "counted_as": mm.counted_as,
           "state_bytes": state,
           "total_bytes": total, "gpu": a.gpu, "gpu_bytes": gpu,
           "fits": total <= gpu, "gpus_needed": attnmem.calc.gpus_needed(total, gpu),
           "longest_context": attnmem.calc.model_max_seq_len(model, max(gpu - state, 0), a.batch,
                                                     a.weight_dtype, a.kv_dtype, a.act_dtype,
                                                     a.impl)}
    # The total is generate()'s prefill peak (attnmem.calc.inference_step); a length past the context
    # the model was trained for is flagged, not silently offered.
    trained = model.max_position_embeddings
    out["trained_context"] = trained
    out["seq_len_past_trained_context"] = bool(trained and a.seq_len > trained)
    out["longest_context_past_trained_context"] = bool(trained and out["longest_context"] > trained)
    if model.is_mla:
        out["kv_cache_expanded_bytes"] = mla_expanded_kv_bytes(model, a.batch, a.seq_len,
                                                               a.kv_dtype)
    return out


def _train(a: argparse.Namespace, model: Any) -> dict:
    from dataclasses import asdict

    import attnmem.calc
    from attnmem.calc.training_step import lora_adapter_params

    ft, kw, trl = _train_settings(a)
    gpu = resolve_gpu(a.gpu)
    result = attnmem.calc.training_step(model, a.batch, a.seq_len, packed_lengths=a.packed, **kw)
    lora = kw.get("adapters")
    adapter = {"adapter": "none" if ft["method"] == "full" else ft["method"],
               "lora_rank": lora.rank if lora else None,
               "lora_targets": lora.targets if lora else None,
               "adapter_dtype": lora.adapter_dtype if lora else None,
               "base_dtype": kw.get("base_dtype", "bf16"),
               "double_quant": kw.get("base_dtype") == "nf4_dq",
               "trainable_params": lora_adapter_params(model, lora) if lora else
               attnmem.calc.param_count(model)}
    # the Training page's answers for one GPU: does the step fit, and the longest s that does
    # (a pack's lengths are given, so there is no longest context to search for it)
    longest = None if a.packed else attnmem.calc.max_train_seq_len(model, gpu, a.batch, **kw)
    # a packed row's positions restart at each sequence: its longest sequence is what counts
    # against the context the model was trained for
    trained = model.max_position_embeddings
    one = max(a.packed) if a.packed else a.seq_len
    levers = _cheapest(a, model, kw, gpu) if a.cheapest else None
    return {"model": model.name, **adapter, **asdict(result), "gpu": a.gpu, "gpu_bytes": gpu,
            "optimizer": kw["optimizer"], "kbit_prepare": kw["kbit_prepare"],
            "liger": kw["liger"], "offload_activations": kw["offload_activations"],
            "trl": trl, "cheapest": levers, "loss": kw.get("loss", "full"),
            "fits": result.peak_bytes <= gpu, "packed_lengths": list(a.packed or ()),
            "seq_len": a.seq_len, "seq_len_is_default": bool(getattr(a, "seq_len_default", False)),
            "longest_context": longest, "trained_context": trained,
            "seq_len_past_trained_context": bool(trained and one > trained),
            "longest_context_past_trained_context": bool(trained and (longest or 0) > trained)}


def _train_settings(a: argparse.Namespace) -> tuple[dict, dict, dict | None]:
    """`train`'s options as the Training page's call: (the adapter settings, calc's
    training_step keywords, what --trl-args set); --trl-args and --packed also set a.batch,
    a.seq_len and a.packed."""
    from attnmem.calc.finetune import calc_kwargs

    ft = _adapter_settings(a)
    # the Training page's call: its method, rank, targets, adapter dtype and double quantization
    # become the same adapters/base_dtype keywords (attnmem.calc.finetune.calc_kwargs)
    kw = dict(attention=a.impl, precision=a.act_dtype, checkpointing=a.checkpointing,
              gpus=a.gpus or a.ep, sharding=a.sharding, ep=a.ep, **calc_kwargs(**ft),
              optimizer=a.optimizer, kbit_prepare=a.kbit_prepare, liger=a.liger,
              offload_activations=a.offload_activations)
    if a.trl_fused_head:
        kw["loss"] = "trl_fused"
    trl = _trl_settings(a, kw)
    _packed_settings(a)
    return ft, kw, trl


def _trl_settings(a: argparse.Namespace, kw: dict) -> dict | None:
    """--trl-args: TRL's arguments (attnmem.calc.train_levers.trl_kwargs) set batch, length,
    packing and the levers; what they leave out keeps TRL's defaults, not this command's."""
    if a.trl_args is None:
        return None
    from attnmem.calc.train_levers import parse_trl_args, trl_kwargs

    m = trl_kwargs(parse_trl_args(a.trl_args))
    kw.update({k: v for k, v in m.kwargs.items() if k != "packed_lengths"})
    if m.loss != "full":
        kw["loss"] = m.loss
    a.batch, a.seq_len = m.batch, m.seq_len
    a.seq_len_default = False
    a.packed = m.kwargs.get("packed_lengths")
    return {"batch": m.batch, "seq_len": m.seq_len, "kwargs": {k: list(v) if isinstance(v, tuple)
            else v for k, v in m.kwargs.items()}, "notes": list(m.notes),
            "ignored": list(m.ignored)}


def _cheapest(a: argparse.Namespace, model: Any, kw: dict, gpu: int) -> dict:
    """--cheapest: the fewest levers that fit the GPU (attnmem.calc.train_levers.cheapest_fit)."""
    import attnmem.calc
    from attnmem.calc.train_levers import cheapest_fit

    def step(**k: Any) -> Any:
        return attnmem.calc.training_step(model, a.batch, a.seq_len, packed_lengths=a.packed,
                                          **k)

    combo, peak, rows = cheapest_fit(step, gpu, kw)
    return {"levers": combo, "peak_bytes": peak, "fits": bool(rows) or peak <= gpu,
            "savings": [{"lever": r.lever, "saving_bytes": r.saving_bytes} for r in rows]}


#: `train`'s length when --seq-len is not given: the Training step page's default
#: (attnmem/pages/training.py SPECS["s"]; tests/cli/test_input_messages.py checks they agree).
TRAIN_SEQ_LEN = 4096


def _packed_settings(a: argparse.Namespace) -> None:
    """--packed sets batch 1 and --seq-len to the lengths' sum; a --seq-len or --batch that
    says otherwise is refused. A dense step without --seq-len is at TRAIN_SEQ_LEN."""
    if not a.packed:
        a.seq_len_default = a.seq_len is None
        if a.seq_len is None:
            a.seq_len = TRAIN_SEQ_LEN
        return
    total = sum(a.packed)
    if total > MAX_SEQ_LEN:
        raise UsageError(f"--packed adds up to {total:,} tokens; at most {MAX_SEQ_LEN:,}")
    if a.seq_len is not None and a.seq_len != total:
        raise UsageError(f"--seq-len {a.seq_len:,} is not the --packed total {total:,}; leave "
                         "--seq-len out")
    if a.batch != 1:
        raise UsageError(f"--packed is one row of tokens: --batch must be 1, got {a.batch:,}")
    a.seq_len = total


def _adapter_settings(a: argparse.Namespace) -> dict[str, Any]:
    """attnmem.calc.finetune.calc_kwargs's arguments from --adapter, --rank, --targets,
    --adapter-dtype and --double-quant; an adapter option that would be ignored is refused."""
    if a.double_quant and a.adapter != "qlora":
        raise UsageError(f"--double-quant applies to --adapter qlora (a 4-bit base), not "
                         f"--adapter {a.adapter}")
    if a.adapter == "none":
        given = [flag for flag, v in (("--rank", a.rank), ("--targets", a.targets),
                                      ("--adapter-dtype", a.adapter_dtype)) if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} "
                             "to --adapter lora or qlora; with "
                             "--adapter none (full training) every weight is trained")
    return {"method": "full" if a.adapter == "none" else a.adapter,
            "rank": a.rank or DEFAULT_LORA_RANK, "targets": a.targets or DEFAULT_LORA_TARGETS,
            "adapter_dtype": a.adapter_dtype or DEFAULT_ADAPTER_DTYPE,
            "double_quant": a.double_quant}


def _serve(a: argparse.Namespace, model: Any) -> dict:
    from dataclasses import asdict

    from attnmem.calc.serving import prefill_decode_attention, serving_capacity

    cap = serving_capacity(
        model, resolve_gpu(a.gpu), a.seq_len,  # the torch total, as vLLM and the page take it
        weight_dtype=a.weight_dtype, kv_dtype=a.kv_dtype,
        act_dtype=a.act_dtype, gpu_memory_utilization=a.gpu_memory_utilization,
        block_size=a.block_size, max_num_batched_tokens=a.max_num_batched_tokens,
        max_num_seqs=a.max_num_seqs, cuda_graph_bytes=a.cuda_graph_bytes,
        non_torch_bytes=a.non_torch_bytes, activation_bytes=a.activation_bytes)
    prefill, decode = prefill_decode_attention(model, a.impl, a.seq_len, 1, a.act_dtype)
    return {"model": model.name, "gpu": a.gpu, **asdict(cap),
            "concurrent_sequences": cap.concurrent_sequences,
            "prefill_attention_bytes": prefill, "decode_attention_bytes": decode}


def _untraced_train_options(a: argparse.Namespace, ft: dict, kw: dict) -> list[str]:
    """The `train` options (as --trl-args left them) that the training trace does not run,
    each said with the option's name (empty: everything asked is traced)."""
    from attnmem.trace.training import TRACE_ATTENTIONS

    bad = []
    if kw["precision"] != "bf16":
        bad.append(f"--act-dtype {kw['precision']} (the trace runs bf16: bf16 parameters and "
                   "AdamW state, no autocast)")
    if ft["method"] == "qlora":
        bad.append("--adapter qlora (bitsandbytes' 4-bit base is not traced; --adapter lora "
                   "is)")
    elif ft["method"] == "lora" and ft["adapter_dtype"] != "fp32":
        bad.append(f"--adapter-dtype {ft['adapter_dtype']} (the trace runs peft's default fp32 "
                   "adapters)")
    if kw["optimizer"] != "adamw":
        bad.append(f"--optimizer {kw['optimizer']} (the trace runs torch's AdamW, foreach)")
    bad += [f"{flag} (not traced)" for flag, on in (
        ("--kbit-prepare", kw["kbit_prepare"]), ("--liger", kw["liger"]),
        ("--offload-activations", kw["offload_activations"]),
        ("--trl-fused-head or --trl-args' loss", kw.get("loss", "full") != "full")) if on]
    if a.packed:
        bad.append("--packed (the trace runs dense rows of --seq-len tokens)")
    if kw["attention"] not in TRACE_ATTENTIONS:
        bad.append(f"--impl {kw['attention']} (the trace runs transformers' eager attention and "
                   "SDPA's flash, memory-efficient and cuDNN backends)")
    layout = [f"{flag} {v:,}" if isinstance(v, int) else f"{flag} {v}" for flag, v, off in (
        ("--gpus", kw["gpus"], 1), ("--sharding", kw["sharding"], "none"), ("--ep", kw["ep"], 1))
        if v != off]
    if layout:
        bad.append(f"{', '.join(layout)} (the trace runs one GPU)")
    if a.cheapest:
        bad.append("--cheapest (the levers it searches are not traced)")
    return bad


def _traced_train(a: argparse.Namespace, no_rules: BaseException) -> dict | None:
    """`attnmem train` for a model calc has no rules for: one training step's peak traced on
    the meta device (attnmem.trace.training: full training or LoRA, bf16, AdamW, one GPU), or
    None where there is no config to trace. What the trace does not run is refused, each
    option named, with what it runs; a trace that cannot run, with both reasons."""
    from attnmem.calc.backends import NoKernel
    from attnmem.calc.train_lora import LORA_TARGET_SETS

    d = _config_to_trace(a, no_rules)
    if d is None:
        return None
    from attnmem.trace.training import TRACE_ATTENTIONS, trace_training

    ft, kw, trl = _train_settings(a)
    bad = _untraced_train_options(a, ft, kw)
    if bad:
        raise UsageError(
            f"{no_rules}; the trace that answers such models does not run "
            + "; ".join(bad) + (" (as --trl-args set them)" if trl else "")
            + ". It runs full training or --adapter lora (fp32 adapters), --act-dtype bf16, "
            f"--optimizer adamw, --impl {' / '.join(x for x in TRACE_ATTENTIONS if x != 'sdpa')}"
            ", with or without --checkpointing, on one GPU")
    lora = kw.get("adapters")
    targets = (LORA_TARGET_SETS[lora.targets] if isinstance(lora.targets, str)
               else tuple(lora.targets)) if lora else ()
    try:
        t = trace_training(d, a.batch, a.seq_len, attention=kw["attention"], dtype="bf16",
                           checkpointing=kw["checkpointing"],
                           lora_rank=lora.rank if lora else None,
                           **({"lora_targets": targets} if lora else {}))
    except NoKernel as err:
        raise UsageError(f"--impl {kw['attention']}: {err}") from None
    except ValueError as err:
        raise UsageError(f"{no_rules}; and the trace: {err}") from None
    except Exception as err:  # the model's own code on meta: said, never a traceback
        raise UsageError(f"{no_rules}; and the trace failed in the model's code "
                         f"({type(err).__name__}: {' '.join(str(err).split())[:300]})") from None
    gpu = resolve_gpu(a.gpu)
    trained = _trained_context_of(d)
    return {"model": str(a.model)[:200], "model_class": t.model_class,
            "adapter": "none" if ft["method"] == "full" else ft["method"],
            "lora_rank": t.lora_rank, "lora_targets": list(targets) if lora else None,
            "adapter_dtype": "fp32" if lora else None, "trainable_params": t.trainable_params,
            "batch": t.batch, "seq_len": t.seq_len,
            "seq_len_is_default": bool(getattr(a, "seq_len_default", False)),
            "attention": t.attention, "precision": t.dtype, "checkpointing": t.checkpointing,
            "optimizer": "adamw", "trl": trl,
            "weights_bytes": t.weights_bytes, "before_step_bytes": t.before_step_bytes,
            "peak_bytes": t.peak_bytes, "at_peak": [list(x) for x in t.at_peak[:8]],
            "gpu": a.gpu, "gpu_bytes": gpu, "fits": t.peak_bytes <= gpu,
            "trained_context": trained,
            "seq_len_past_trained_context": bool(trained and a.seq_len > trained),
            "longest_context": None, "counted_from": _trace_counted_from(t, d),
            "trace_seconds": round(t.seconds, 2)}


def _fail(command: str, err: BaseException) -> int:
    print(f"attnmem {command}: error: {err}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # bad flags: one line and exit status 2
    import json

    from attnmem.hub import HubError  # imports calc: after parsing, so --help stays fast

    try:
        # the full name from here on: the JSON carries it, the text names it
        args.gpu = gpu_name(args.gpu)
        try:
            model = resolve_model(args.model)
        except (UsageError, ValueError) as no_rules:
            answer, text_of = {"memory": (_traced_memory, _text_traced),
                               "train": (_traced_train, _text_traced_train),
                               "serve": (_traced_serve, _text_traced_serve)}.get(
                                   args.command, (None, None))
            traced = answer(args, no_rules) if answer else None
            if traced is None:
                raise
            print(json.dumps(traced, indent=2) if args.json else text_of(traced, args))
            return 0
        result = {"memory": _memory, "train": _train, "serve": _serve}[args.command](args, model)
        if args.command == "memory" and result["total_is_lower_bound"] and args.trace:
            # the rules give only a lower bound (hybrids, gpt-oss): the trace counts it all
            try:
                traced = _traced_memory(args, _LowerBound(result["not_modelled"]))
            except UsageError as err:
                result["trace_refused"] = str(err)
            else:
                if traced is not None:
                    print(json.dumps(traced, indent=2) if args.json else
                          _text_traced(traced, args))
                    return 0
        # how a config.json was read: values its transformers config class supplied
        result["defaults_from"] = model.defaults_from
        text = json.dumps(result, indent=2) if args.json else _text(args.command, result, args,
                                                                      model)
        if model.defaults_from and not args.json:
            text += f"\nnot in config.json, so taken from {model.defaults_from}"
    except (UsageError, HubError, ValueError, TypeError, OSError) as err:
        return _fail(args.command, err)
    print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
