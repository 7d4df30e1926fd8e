"""Parameters and buffers of any causal LM that transformers builds, counted on the meta device.

The model is the one `AutoModelForCausalLM.from_config` builds from the config (its own
modeling code: the classes of `transformers.models.<type>.modeling_<type>`), made under
`torch.device("meta")`, so its tensors have shapes and dtypes but no storage: a 405B model
costs a few hundred MB of host memory and about a second. Counted:

- parameters, each storage once: `named_parameters(remove_duplicate=True)` lists a tied
  lm_head / embedding pair once, as the checkpoint stores it;
- buffers, split into persistent ones (in the state dict: saved and loaded with the weights)
  and the rest (rotary `inv_freq` and the like: made at load time, in fp32 where the module
  says so), each at its own dtype's width;
- by top-level part (embedding, decoder layers, final norm, lm_head, and a vision tower where
  the config has one), so a page can say where the weights are.

Weight bytes at a width are parameters x bytes per parameter (+ buffers at their own width);
quantized checkpoints are priced by attnmem.calc.quant, not here.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache

#: Names of the top-level parts of a vision-language model that are not its language model
#: (Gemma3Model.vision_tower / multi_modal_projector, LlavaModel, Qwen2_5_VLModel.visual).
_VISION_PARTS = ("vision", "visual", "multi_modal_projector")


@dataclass(frozen=True)
class TracedWeights:
    """What the meta-built model holds. Counts are elements; bytes at the module's dtypes."""

    model_class: str  # e.g. "Olmo2ForCausalLM"
    param_count: int  # every parameter once (tied weights once)
    tied: tuple[str, ...]  # parameter names that share another's storage (not counted again)
    persistent_buffer_bytes: int  # buffers in the state dict
    other_buffer_bytes: int  # non-persistent buffers (rotary inv_freq, ...)
    parts: dict[str, int] = field(default_factory=dict)  # top-level child -> its parameters
    transformers_version: str = ""

    @property
    def language_model_count(self) -> int:
        """Parameters less a vision-language model's vision tower and projector (the parts
        calc's rules count: read_as says a checkpoint's vision encoder is left out)."""
        return self.param_count - sum(n for name, n in self.parts.items()
                                      if any(w in name for w in _VISION_PARTS))

    def weight_bytes(self, bytes_per_param: float) -> int:
        """Parameters at bytes_per_param each, plus every buffer at its own width."""
        return (round(self.param_count * bytes_per_param) + self.persistent_buffer_bytes
                + self.other_buffer_bytes)


#: The largest config the trace builds: each layer is a module built (and, for a trace, run)
#: in Python, so a hostile upload of 10^9 layers would hold a process for hours; every real
#: config is far inside them (Llama 3.1 405B has 126 layers). Experts are not counted from the
#: config: transformers 5 holds most as one fused parameter (Doge's 16,384 are two
#: embeddings), so the build itself stops past MAX_MODULES modules (`module_limit`).
TRACE_LIMITS = {"layers": 512}
#: Modules a build may register before it is stopped (DeepSeek-V3 with its 61 layers has
#: about 2,000; a model of 512 layers with 128 expert modules each, 66,000).
MAX_MODULES = 100_000
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


class TooManyModules(Exception):
    """A build registered more than MAX_MODULES modules."""


@contextmanager
def module_limit(limit: int | None = None):
    """Inside the block, the building thread's module registrations are counted; past `limit`
    (MAX_MODULES) TooManyModules stops the build (a config asking for millions of modules)."""
    import torch

    limit = MAX_MODULES if limit is None else limit
    thread, count = threading.get_ident(), [0]

    def hook(_module, _name, _sub):
        if threading.get_ident() == thread:
            count[0] += 1
            if count[0] > limit:
                raise TooManyModules(f"the model has more than {limit:,} modules (each built, "
                                     f"and for a trace run, in Python on the meta device); "
                                     f"the trace builds at most {limit:,}")

    handle = torch.nn.modules.module.register_module_module_registration_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def too_large(d: dict) -> str | None:
    """Why a config is too large to trace here (layers past TRACE_LIMITS), or None."""
    scopes = [d] + [v for v in d.values() if isinstance(v, dict)]
    for scope in scopes:
        for what, keys in (("layers", _LAYER_KEYS),):
            for key in keys:
                value = scope.get(key)
                if isinstance(value, int) and not isinstance(value, bool) \
                        and value > TRACE_LIMITS[what]:
                    return (f"'{key}' is {value:,}; the trace builds at most "
                            f"{TRACE_LIMITS[what]:,} {what} (each is a module built and run on "
                            "the meta device)")
    return None


def _config(d: dict):
    """transformers' config object for a config.json dict; ValueError names why it cannot.

    A type transformers does not know, shipped with its own code (auto_map), is built by the
    transformers class that `architectures` names where calc has one for it
    (attnmem.calc.models.ARCHITECTURE_TYPES: Kimi-K2 is DeepseekV3ForCausalLM)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from attnmem.calc.models import ARCHITECTURE_TYPES

    model_type = d.get("model_type") if isinstance(d, dict) else None
    why = too_large(d) if isinstance(d, dict) else None
    if why:
        raise ValueError(f"config.json: {why}")
    if (isinstance(model_type, str) and model_type not in CONFIG_MAPPING
            and isinstance(d.get("auto_map"), dict)):
        for cls in d.get("architectures") or []:
            if isinstance(cls, str) and cls in ARCHITECTURE_TYPES:
                d = {**d, "model_type": ARCHITECTURE_TYPES[cls]}
                model_type = d["model_type"]
                break
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ValueError(f"config.json: 'model_type' {model_type!r} is not a type this "
                         "transformers builds")
    try:
        return CONFIG_MAPPING[model_type].from_dict(json.loads(json.dumps(d)))
    except Exception as e:
        raise ValueError(f"config.json: transformers' {CONFIG_MAPPING[model_type].__name__} "
                         f"cannot build this config: {' '.join(str(e).split())[:300]}") from None


def build_meta(d: dict):
    """The causal LM transformers builds from config dict `d`, on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = _config(d)
    try:
        with torch.device("meta"), module_limit():
            return AutoModelForCausalLM.from_config(cfg)
    except TooManyModules as e:
        raise ValueError(f"config.json: {e}") from None
    except Exception as e:
        raise ValueError(f"transformers cannot build a causal LM from this "
                         f"'{d.get('model_type')}' config: {' '.join(str(e).split())[:300]}"
                         ) from None


def count(model) -> TracedWeights:
    """Count a built model (meta or real): parameters once each, buffers by persistence."""
    import transformers

    seen: dict[int, str] = {}
    tied: list[str] = []
    total = 0
    for name, p in model.named_parameters(remove_duplicate=False):
        key = id(p)
        if key in seen:
            tied.append(name)
            continue
        seen[key] = name
        total += p.numel()
    persistent = other = 0
    for mod in model.modules():
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        for b_name, b in mod.named_buffers(recurse=False):
            size = b.numel() * b.element_size()
            if b_name in skip:
                other += size
            else:
                persistent += size
    parts: dict[str, int] = {}
    counted: set[int] = set()
    for child_name, child in _parts(model):
        n = 0
        for p in child.parameters():
            if id(p) not in counted:
                counted.add(id(p))
                n += p.numel()
        parts[child_name] = n
    return TracedWeights(type(model).__name__, total, tuple(tied), persistent, other, parts,
                         transformers.__version__)


def _parts(model):
    """(name, module) of the model's top-level parts, one level inside its base model."""
    for name, child in model.named_children():
        inner = list(child.named_children())
        if name in ("model", "transformer") and inner:
            for sub, mod in inner:
                yield f"{name}.{sub}", mod
        else:
            yield name, child


@lru_cache(maxsize=64)
def _traced(text: str) -> TracedWeights:
    return count(build_meta(json.loads(text)))


def trace_weights(d: dict) -> TracedWeights:
    """TracedWeights of the causal LM that config dict `d` describes (cached by content)."""
    return _traced(json.dumps(d, sort_keys=True))
