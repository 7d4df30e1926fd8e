"""config.json completed by transformers' own config class for its model_type.

A Hugging Face `config.json` leaves out every value equal to its config class's default:
Gemma 3's checkpoints omit `head_dim` (256 in Gemma3TextConfig, not hidden / heads), the head
counts and the vocabulary. Reading such a file by hand rules gives a plausible wrong number, so
where transformers is importable the file is first built by its model type's config class
(`transformers.models.auto.configuration_auto.CONFIG_MAPPING[model_type]`, the class
`AutoConfig.from_pretrained` uses) and every value the file leaves out is taken from the built
object: class defaults, values the class derives in its `__init__` from the file's own values
(`head_dim` = hidden / heads where that is the class's rule, `layer_types` from a sliding
pattern, `num_key_value_heads` = heads), `attribute_map` aliases, and the nested `text_config`.

Values the file does give are kept as written, so calc's own checks still name a wrong value in
the file's words. Config classes run no model code, but importing transformers imports torch
where it is installed; calc itself uses neither (the import is inside `complete`).

Where transformers is absent (the bare command-line install), the file is read as it is, and
`CLASS_HEAD_DIMS` holds the one class default that hand rules cannot derive: a model type
whose class has a fixed `head_dim` default is refused when the file leaves it out.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

#: model_type -> its config class's default `head_dim` where that default is a number rather
#: than hidden_size / num_attention_heads (configuration_gemma*.py, configuration_qwen3.py,
#: configuration_qwen3_next.py, configuration_gpt_oss.py, configuration_nemotron_h.py);
#: read only where transformers is absent. tests/calc/test_hf_defaults.py checks it against
#: the installed transformers.
CLASS_HEAD_DIMS: dict[str, int] = {
    "gemma": 256, "gemma2": 256, "gemma3": 256, "gemma3_text": 256,
    "qwen3": 128, "qwen3_next": 256, "gpt_oss": 64, "nemotron_h": 128,
}


@dataclass(frozen=True)
class Completed:
    """A config dict with what its class supplies, and where each supplied value came from."""

    config: dict  # the file's keys as written, plus the class's for every key it left out
    config_class: str  # e.g. "Gemma3Config"; "" when not completed
    filled: frozenset[str]  # key paths taken from the class ("head_dim", "text_config.head_dim")
    transformers_version: str  # "" when transformers is not importable
    refusal: str = ""  # why the class refused the file ("" when it built it)


def _config_mapping():
    """transformers' model_type -> config class mapping and version, or (None, "")."""
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:  # not installed, or blocked (the bare CLI); calc then reads the file as is
        return None, ""
    return CONFIG_MAPPING, str(getattr(transformers, "__version__", ""))


def transformers_available() -> bool:
    return _config_mapping()[0] is not None


def complete(d: object) -> Completed:
    """`d` completed by its model_type's transformers config class.

    Returned unchanged (config_class "") when `d` is not a dict, names no model_type that this
    transformers knows, or transformers is absent. When the class refuses the file (so
    transformers could not build that model either), `d` comes back unchanged with `refusal`
    naming the class and its reason.
    """
    if not isinstance(d, dict) or not isinstance(d.get("model_type"), str):
        return Completed(d if isinstance(d, dict) else d, "", frozenset(), "")  # type: ignore[arg-type]
    mapping, version = _config_mapping()
    if mapping is None:
        return Completed(d, "", frozenset(), "")
    model_type = d["model_type"]
    if model_type not in mapping:
        return Completed(d, "", frozenset(), version)
    cls = mapping[model_type]
    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # config classes log advice about unused keys
    try:
        built = cls.from_dict(copy.deepcopy(d)).to_dict()  # the class edits nested dicts
    except Exception as e:  # any refusal of the class: its own words, shortened
        msg = " ".join(str(e).split())[:300] or type(e).__name__
        return Completed(d, "", frozenset(), version, refusal=(
            f"config.json: transformers {version}'s {cls.__name__} cannot build this "
            f"'{model_type}' config: {msg}"))
    finally:
        quiet.setLevel(level)
    out = dict(d)
    filled = [k for k in built if k not in d]
    for k in filled:
        out[k] = built[k]
    inner, built_inner = d.get("text_config"), built.get("text_config")
    if isinstance(inner, dict) and isinstance(built_inner, dict):
        more = [k for k in built_inner if k not in inner]
        out["text_config"] = {**inner, **{k: built_inner[k] for k in more}}
        filled += [f"text_config.{k}" for k in more]
    return Completed(out, cls.__name__, frozenset(filled), version)
