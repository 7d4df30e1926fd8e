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


class UsageError(ValueError):
    """Bad command-line input: printed as one line, exit status 2."""


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


def _names_a_file(spec: str) -> bool:
    """Whether --model is written as a file path: a .json name, a path from the root, home or
    current folder, or more folders than a Hub id (owner/name) has. Such a name that does not
    exist is a missing file, not a preset or Hub id to look up."""
    s = spec.strip()
    return (s.lower().endswith(".json") or s.startswith(("/", "./", "../", "~"))
            or "\\" in s or s.count("/") > 1)


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


def gpu_name(spec: str) -> str:
    """The GPU named exactly (any case, any spacing), or the one GPU whose name contains
    `spec`. A spec that matches several is refused with those GPUs and a spelling that picks
    each; one that matches none, with every GPU."""
    import attnmem.calc

    names = list(attnmem.calc.GPUS)
    if spec in attnmem.calc.GPUS:
        return spec
    key = " ".join(spec.split()).lower()
    for name in names:
        if name.lower() == key:
            return name
    hits = [g for g in names if key and key in g.lower()]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise UsageError(f"--gpu {spec[:60]!r} is not a GPU attnmem knows; give one of these "
                         f"names, or a part of one that no other has (e.g. 'H200'): "
                         f"{', '.join(names)}")
    picks = ", ".join(f"--gpu {_distinct_part(g, key, names)!r}" for g in hits[:3])
    raise UsageError(f"--gpu {spec[:60]!r} matches {len(hits)} GPUs: {', '.join(hits)}; give "
                     f"one of these names, or a part of one that no other has: {picks}"
                     + (", ..." if len(hits) > 3 else ""))


def _distinct_part(name: str, key: str, names: list[str]) -> str:
    """The shortest run of whole words of `name` that contains `key` and is in no other GPU's
    name (any case): what --gpu accepts for it, e.g. 'H100 NVL'. The full name if none is."""
    words = name.split()
    runs = [" ".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)]
    unique = [r for r in runs if key in r.lower()
              and sum(r.lower() in other.lower() for other in names) == 1]
    return min(unique, key=len, default=name)


def resolve_gpu(spec: str) -> int:
    """The bytes "fits" uses, as the pages do: the total torch can allocate where attnmem.calc.gpus has
    it (what torch.cuda.mem_get_info reports), else the spec-sheet figure."""
    from attnmem.calc.gpus import torch_total_bytes

    return torch_total_bytes(gpu_name(spec))


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
            "trl": trl, "cheapest": levers,
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


# --- plain output -------------------------------------------------------------------------------


def _table(rows: list[tuple[str, str]]) -> list[str]:
    """Two columns, the values right-aligned so that their units line up."""
    if not rows:
        return []
    left = max(len(k) for k, _ in rows)
    right = max(len(v) for _, v in rows)
    return [f"  {k:<{left}}  {v:>{right}}" for k, v in rows]


def _tokens(n: int) -> str:
    return f"{n:,} token" + ("" if n == 1 else "s")


def _trained_note(n: int, trained: int | None) -> str:
    return (f" (past the {trained:,} tokens this model was trained for)"
            if trained and n > trained else "")


def _verdict(fits: bool, total: int, gpu: int, b: Any, needed: str = "") -> str:
    if fits:
        return f"fits: {b(gpu - total)} free ({(gpu - total) / gpu:.0%})"
    return f"does not fit: {b(total - gpu)} over" + (f"; {needed}" if needed else "")


def _text_memory(r: dict, a: argparse.Namespace, gpu: str, b: Any) -> str:
    trained = r["trained_context"]
    lines = [f"{r['model']}: inference, batch {r['batch']:,}, s = {_tokens(r['seq_len'])}"
             f"{_trained_note(r['seq_len'], trained)}, {r['impl']}",
             f"weights {a.weight_dtype}, KV cache {a.kv_dtype}, activations {a.act_dtype}; "
             f"{r['params']:,} parameters" + (f" ({r['active_params']:,} active)"
                                              if r["active_params"] != r["params"] else ""),
             ""]
    parts = r["peak_parts"] or {"weights": r["weights_bytes"], "KV cache": r["kv_cache_bytes"],
                                "attention (one layer)": r["attention_bytes"]}
    rows = [(name, b(v)) for name, v in parts.items()]
    if r["state_bytes"]:
        rows.append(("constant state (hybrid layers)", b(r["state_bytes"])))
    if "kv_cache_expanded_bytes" in r:
        rows.append(("(KV cache expanded by MLA, not counted)", b(r["kv_cache_expanded_bytes"])))
    peak = "at least " if r["total_is_lower_bound"] else ""
    rows.append((f"peak of generate(), at {r['peak_phase'] or 'prefill'}",
                 peak + b(r["total_bytes"])))
    lines += _table(rows) + [""]
    if r["not_modelled"]:
        lines.append(f"a lower bound: {r['not_modelled']}")
        lines.append("  --trace counts it all: generate() traced on the meta device"
                     + (f" (refused: {r['trace_refused']})" if r.get("trace_refused") else ""))
    if r["counted_as"]:
        lines.append(r["counted_as"])
    needed = f"needs {r['gpus_needed']:,} GPUs of this size (ideal split)"
    lines.append(f"{gpu}:\n  " + _verdict(r["fits"], r["total_bytes"], r["gpu_bytes"], b, needed))
    longest = r["longest_context"]
    if longest:
        lines.append(f"  longest context that fits: {_tokens(longest)}"
                     f"{_trained_note(longest, trained)}")
    else:
        lines.append("  longest context that fits: none, not even one token "
                     + ("(the weights alone exceed the GPU)"
                        if r["weights_bytes"] + r["state_bytes"] > r["gpu_bytes"] else ""))
    return "\n".join(line.rstrip() for line in lines)


def _text_train(r: dict, a: argparse.Namespace, gpu: str, b: Any) -> str:
    pack = (f" packed from {len(a.packed)} sequences ({', '.join(f'{n:,}' for n in a.packed)})"
            if a.packed else "")
    trained = r["trained_context"]
    past = _trained_note(max(a.packed) if a.packed else a.seq_len, trained)
    default = " (the default; --seq-len sets it)" if getattr(a, "seq_len_default", False) else ""
    lines = [f"{r['model']}: training step, batch {a.batch:,}, s = {_tokens(a.seq_len)}{default}"
             f"{pack}"
             f"{past}, {r['attention']}, precision {r['precision']}, checkpointing "
             f"{'on' if r['checkpointing'] else 'off'}, optimizer {r['optimizer']}"
             + "".join(f", {n}" for n, on in (("peft kbit prepare", r["kbit_prepare"]),
                                              ("Liger", r["liger"]),
                                              ("offloaded activations",
                                               r["offload_activations"])) if on)]
    if r["trl"]:
        lines += [f"  TRL: {n}" for n in r["trl"]["notes"]]
        if r["trl"]["ignored"]:
            lines.append(f"  TRL arguments that change no memory here: "
                         f"{', '.join(r['trl']['ignored'])}")
    if r["adapter"] == "none":
        lines.append(f"full training: {r['trainable_params']:,} trainable parameters")
    else:
        base = {"bf16": "bf16", "nf4": "4-bit NF4", "nf4_dq": "4-bit NF4, double quantization"}
        lines.append(f"{'LoRA' if r['adapter'] == 'lora' else 'QLoRA'}: rank {r['lora_rank']}, "
                     f"targets {r['lora_targets']}, {r['adapter_dtype']} adapters "
                     f"({r['trainable_params']:,} trainable parameters), frozen base "
                     f"{base[r['base_dtype']]}")
    lay = r["layout"]
    if lay and lay["gpus"] > 1:
        lines.append(f"per GPU of {lay['gpus']:,}: sharding {lay['sharding']}"
                     + (f", expert parallel over {lay['ep']:,} ranks" if lay["ep"] > 1 else ""))
    lines.append("")
    rows = [("weights", b(r["weights_bytes"])), ("gradients", b(r["gradients_bytes"])),
            ("optimizer states", b(r["optimizer_bytes"]))]
    if r["buffers_bytes"]:
        rows.append(("buffers", b(r["buffers_bytes"])))
    acts = {k: v for k, v in r["activations"].items() if v}
    rows.append(("activations kept for the backward", b(sum(acts.values()))))
    rows += [(f"  {k}", b(v)) for k, v in acts.items()]
    rows.append((f"peak of the step, at {r['peak_phase']}", b(r["peak_bytes"])))
    lines += _table(rows) + [""]
    lines.append(f"{gpu}:\n  " + _verdict(r["fits"], r["peak_bytes"], r["gpu_bytes"], b))
    longest = r["longest_context"]
    if not a.packed:
        lines.append(f"  longest context that fits on one: {_tokens(longest)}"
                     f"{_trained_note(longest, trained)}" if longest else
                     "  longest context that fits on one: none, not even one token")
    c = r["cheapest"]
    if c is not None:
        if not c["fits"]:
            lines.append("  no combination of Liger, 8-bit/paged AdamW, checkpointing and "
                         f"offloading fits (smallest peak {b(c['peak_bytes'])})")
        elif not c["levers"]:
            lines.append("  cheapest combination that fits: as it is, no lever needed")
        else:
            lines.append(f"  cheapest combination that fits: {' + '.join(c['levers'])}, "
                         f"peak {b(c['peak_bytes'])}")
            lines += _table([(f"    {s['lever']} saves", b(s["saving_bytes"]))
                             for s in c["savings"]])
    return "\n".join(lines)


def _text_serve(r: dict, a: argparse.Namespace, gpu: str, b: Any, trained: int | None) -> str:
    lines = [f"{r['model']}: serving requests of {_tokens(r['seq_len'])}"
             f"{_trained_note(r['seq_len'], trained)}", f"on {gpu}", ""]
    est = " (estimated)" if r["activation_estimated"] else ""
    rows = [(f"budget (gpu_memory_utilization {a.gpu_memory_utilization:g})",
             b(r["budget_bytes"])),
            ("weights", b(r["weights_bytes"])),
            (f"activation peak{est}", b(r["activation_bytes"])),
            ("non-torch memory", b(r["non_torch_bytes"])),
            ("CUDA graphs" + ("" if r["cuda_graphs_in_budget"] else " (outside the budget)"),
             b(r["cuda_graph_bytes"])),
            ("KV cache pool", b(r["kv_pool_bytes"])),
            (f"one KV block ({r['block_size']} tokens, all layers)", b(r["page_bytes"])),
            ("KV blocks", f"{r['num_blocks']:,}"),
            ("one request's KV cache", f"{b(r['bytes_per_sequence'])} = "
                                       f"{r['blocks_per_sequence']:,} blocks"),
            ("prefill attention (one layer)", b(r["prefill_attention_bytes"])),
            ("decode attention (one layer)", b(r["decode_attention_bytes"]))]
    lines += _table(rows) + [""]
    capped = (f" (capped by max_num_seqs; {r['max_concurrency']:,} by KV memory)"
              if r["concurrent_sequences"] < r["max_concurrency"] else "")
    if r["kv_pool_bytes"] == 0:
        lines.append("concurrent requests: 0: nothing is left for the KV cache (weights, "
                     "activations and overheads exceed the budget)")
    elif r["concurrent_sequences"] == 0:
        lines.append(f"concurrent requests: 0: one request of {_tokens(r['seq_len'])} needs "
                     f"{b(r['bytes_per_sequence'])}, the pool holds {b(r['kv_pool_bytes'])}")
    else:
        lines.append(f"concurrent requests: {r['concurrent_sequences']:,}{capped}")
    lines.append(f"longest context of one request: {_tokens(r['max_context'])}"
                 f"{_trained_note(r['max_context'], trained)}" if r["max_context"] else
                 "longest context of one request: none, not even one token")
    return "\n".join(lines)


def _text(command: str, result: dict, a: argparse.Namespace, model: Any) -> str:
    from attnmem.calc.units import format_bytes

    def b(n: int) -> str:  # MB/KB below 1 GB: never "0.00 GB"
        return format_bytes(n, a.unit)

    from attnmem.calc.gpus import GPU_TORCH_TOTAL, GPUS

    name = gpu_name(a.gpu)
    spec = GPUS[name]
    gpu = (f"{name} ({b(result['gpu_bytes'])} torch can use, {b(spec)} on the spec sheet)"
           if GPU_TORCH_TOTAL[name] and result["gpu_bytes"] != spec else
           f"{name} ({b(spec)}, the spec sheet's figure: no torch total is known)")
    if command == "memory":
        return _text_memory(result, a, gpu, b)
    if command == "train":
        return _text_train(result, a, gpu, b)
    return _text_serve(result, a, gpu, b, model.max_position_embeddings)


def _raw_config(spec: str) -> dict | None:
    """config.json of --model as a dict: a preset's published one, a file, or a Hub id's."""
    import copy
    from pathlib import Path

    from attnmem.calc.config_json import MAX_CONFIG_BYTES, load_config_json
    from attnmem.calc.presets import PRESET_HF_CONFIGS
    from attnmem.hub import fetch_config_dict, looks_like_repo_id

    folded = {name.lower(): name for name in PRESET_HF_CONFIGS}
    if spec.lower() in folded:  # a preset: its published config.json
        return copy.deepcopy(PRESET_HF_CONFIGS[folded[spec.lower()]][1])
    path = Path(spec).expanduser()
    if path.is_file():
        with open(path, "rb") as f:
            return load_config_json(f, max_bytes=MAX_CONFIG_BYTES)
    if not _names_a_file(spec) and looks_like_repo_id(spec):
        return fetch_config_dict(spec)
    return None


class _LowerBound(Exception):
    """calc's rules give only a lower bound for this model (the reason): trace it instead."""


def _config_to_trace(a: argparse.Namespace, no_rules: BaseException) -> dict | None:
    """--model's config.json as a dict, for the trace of a model calc has no rules for; None
    where --model names no file or Hub id to trace (calc's refusal then stands). UsageError
    (with calc's reason) where torch or transformers, which the trace runs, are not here."""
    try:
        d = _raw_config(a.model)
    except (OSError, ValueError):
        return None
    if d is None:
        return None
    try:
        import attnmem.trace.inference  # noqa: F401  (imports torch and transformers)
    except ImportError as err:  # the bare CLI install: no torch or transformers
        raise UsageError(f"{no_rules}; tracing the model instead needs torch and transformers "
                         f"({err})") from None
    return d


def _trace_counted_from(t: Any, d: dict, lower_bound: str = "") -> str:
    """The "counted from" line of a traced answer (after "counted from the ")."""
    why = (f"calc's rules give only a lower bound: {lower_bound}" if lower_bound else
           f"calc has no rules for model_type {d.get('model_type')!r}")
    return (f"trace: transformers {t.transformers_version}'s {t.model_class} run on the meta "
            f"device, fused attention per attnmem.calc.peak ({why})")


def _trained_context_of(d: dict) -> int | None:
    """max_position_embeddings of a config dict (its text_config's for a multimodal one)."""
    inner = d.get("text_config")
    got = d.get("max_position_embeddings") or (
        inner.get("max_position_embeddings") if isinstance(inner, dict) else None)
    return got if isinstance(got, int) and not isinstance(got, bool) else None


def _traced_memory(a: argparse.Namespace, no_rules: BaseException) -> dict | None:
    """`attnmem memory` for a model calc has no rules for: generate()'s peak traced on the
    meta device (attnmem.trace.inference), or None where there is no config to trace. A trace
    that cannot run raises ValueError with both reasons."""
    from attnmem.calc.backends import NoKernel
    from attnmem.calc.memory import INFERENCE_IMPL

    d = _config_to_trace(a, no_rules)
    if d is None:
        return None
    from attnmem.trace.inference import TRACE_ATTENTIONS, trace_inference

    attention = INFERENCE_IMPL.get(a.impl, a.impl)
    if attention not in TRACE_ATTENTIONS:
        raise UsageError(f"{no_rules}; the trace runs --impl {', '.join(TRACE_ATTENTIONS)} "
                         f"(naive as eager), got --impl {a.impl!r}")
    if a.weight_dtype != a.act_dtype or a.kv_dtype != a.act_dtype:
        raise UsageError(f"{no_rules}; the trace runs the model in one dtype: give the same "
                         f"--weight-dtype, --kv-dtype and --act-dtype (got {a.weight_dtype}, "
                         f"{a.kv_dtype}, {a.act_dtype})")
    counted_as = ""
    try:
        try:
            t = trace_inference(d, a.batch, a.seq_len, 1, attention=attention,
                                dtype=a.act_dtype)
        except NoKernel as err:
            # as calc's model_memory does: count generate() as transformers runs it by default
            # (SDPA, torch choosing the backend), and say so
            t = trace_inference(d, a.batch, a.seq_len, 1, attention="sdpa", dtype=a.act_dtype)
            counted_as = f"counted as SDPA with torch's choice of backend: {err}"
        except ValueError as err:
            if attention == "eager" or "scaled_dot_product_attention" not in str(err):
                raise
            # the model's class takes no SDPA (gpt-oss: its sinks): transformers runs it eager
            t = trace_inference(d, a.batch, a.seq_len, 1, attention="eager", dtype=a.act_dtype)
            counted_as = ("counted as transformers' eager attention: "
                          + " ".join(str(err).split())[:200])
    except NoKernel as err:
        raise UsageError(f"--impl {a.impl}: {err}") from None
    except ValueError as err:
        raise UsageError(f"{no_rules}; and the trace: {err}") from None
    gpu = resolve_gpu(a.gpu)
    trained = _trained_context_of(d)
    longest, how = None, ""
    if a.longest:
        from attnmem.calc.units import MAX_SEQ_LEN
        from attnmem.trace.lengths import longest_prompt

        longest, how = longest_prompt(d, a.batch, 1, t.attention, a.act_dtype, gpu,
                                      MAX_SEQ_LEN - 1)
    return {"model": str(a.model)[:200], "model_class": t.model_class, "batch": t.batch,
            "seq_len": t.prompt_len, "impl": a.impl, "dtype": t.dtype,
            "weights_bytes": t.weights_bytes, "kv_cache_bytes": t.kv_cache_bytes,
            "workspace_bytes": t.fixed_bytes, "activation_bytes": t.activation_bytes,
            "total_bytes": t.peak_bytes, "peak_phase": t.peak_phase,
            "at_peak": [list(x) for x in t.at_peak[:8]], "gpu": a.gpu, "gpu_bytes": gpu,
            "fits": t.peak_bytes <= gpu, "trained_context": trained,
            "seq_len_past_trained_context": bool(trained and a.seq_len > trained),
            "longest_context": longest, "longest_context_how": how,
            "counted_as": counted_as,
            "counted_from": _trace_counted_from(
                t, d, str(no_rules) if isinstance(no_rules, _LowerBound) else ""),
            "trace_seconds": round(t.seconds, 2)}


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
        ("--offload-activations", kw["offload_activations"])) if on]
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


def _text_traced_train(r: dict, a: argparse.Namespace) -> str:
    from attnmem.calc.units import format_bytes

    def b(n: int) -> str:
        return format_bytes(n, a.unit)

    past = (f" (past the {r['trained_context']:,} tokens it was trained for)"
            if r["seq_len_past_trained_context"] else "")
    default = " (the default; --seq-len sets it)" if r["seq_len_is_default"] else ""
    lines = [f"{r['model']} ({r['model_class']}): training step, batch {r['batch']:,}, "
             f"s = {_tokens(r['seq_len'])}{default}{past}, {r['attention']}, precision "
             f"{r['precision']}, checkpointing {'on' if r['checkpointing'] else 'off'}, "
             "optimizer adamw (foreach)"]
    if r["trl"]:
        lines += [f"  TRL: {n}" for n in r["trl"]["notes"]]
    if r["adapter"] == "none":
        lines.append(f"full training: {r['trainable_params']:,} trainable parameters")
    else:
        lines.append(f"LoRA (peft): rank {r['lora_rank']}, targets "
                     f"{', '.join(r['lora_targets'])}, fp32 adapters "
                     f"({r['trainable_params']:,} trainable parameters), frozen base bf16")
    lines.append("")
    rows = [("weights and buffers", b(r["weights_bytes"])),
            ("AdamW state, inputs and cuBLAS workspaces",
             b(r["before_step_bytes"] - r["weights_bytes"])),
            ("before the step", b(r["before_step_bytes"])),
            ("peak of the step", b(r["peak_bytes"]))]
    lines += _table(rows) + [""]
    lines.append("largest tensors at the peak: " + "; ".join(
        f"{(where.replace('|', ' ').strip() or where)} {b(n)}" for where, _, n in r["at_peak"][:4]))
    lines.append(f"counted from the {r['counted_from']}")
    verdict = "fits" if r["fits"] else "does not fit"
    lines.append(f"{r['gpu']} ({b(r['gpu_bytes'])}): {verdict}")
    lines.append("  longest context: not searched for a traced model (each length is one "
                 f"trace of {r['trace_seconds']} s); try --seq-len values")
    return "\n".join(line.rstrip() for line in lines)


def _text_traced(r: dict, a: argparse.Namespace) -> str:
    from attnmem.calc.units import format_bytes

    def b(n: int) -> str:
        return format_bytes(n, a.unit)

    rows = [("weights and buffers", b(r["weights_bytes"])), ("KV cache", b(r["kv_cache_bytes"])),
            ("cuBLAS workspace", b(r["workspace_bytes"])),
            ("inputs and transients at the peak", b(r["activation_bytes"])),
            (f"peak of generate(), at {r['peak_phase']}", b(r["total_bytes"]))]
    past = (f" (past the {r['trained_context']:,} tokens it was trained for)"
            if r["seq_len_past_trained_context"] else "")
    lines = [f"{r['model']} ({r['model_class']}): inference, batch {r['batch']:,}, "
             f"s = {_tokens(r['seq_len'])}{past}, {r['impl']}, {r['dtype']}", ""]
    lines += _table(rows) + [""]
    lines.append("largest tensors at the peak: " + "; ".join(
        f"{where.replace('|', ' ')} {b(n)}" for where, _, n in r["at_peak"][:4]))
    if r["counted_as"]:
        lines.append(r["counted_as"])
    lines.append(f"counted from the {r['counted_from']}")
    verdict = "fits" if r["fits"] else "does not fit"
    lines.append(f"{r['gpu']} ({b(r['gpu_bytes'])}): {verdict}")
    if r["longest_context"] is None:
        lines.append("  longest context: not searched for a traced model (each length is one "
                     f"trace of {r['trace_seconds']} s); --longest searches it")
    elif r["longest_context"] == 0:
        lines.append(f"  longest context that fits: none ({r['longest_context_how']})")
    else:
        lines.append(f"  longest context that fits: {_tokens(r['longest_context'])}"
                     f"{_trained_note(r['longest_context'], r['trained_context'])} "
                     f"({r['longest_context_how']})")
    return "\n".join(line.rstrip() for line in lines)


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
                               "train": (_traced_train, _text_traced_train)}.get(
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
