"""Fuzzing the public `calc` entry points that take a ModelConfig (parameters, weights, the KV
cache, a model's memory and longest prompt, GPUs needed, training attention) with hostile
input, and ModelConfig.from_hf_config on any JSON.

The contract and the machinery (valid strategies, tests/_robust.HOSTILE draws, the time limit,
`run_case`) are tests/calc/test_fuzz_hostile_inputs.py's, which fuzzes the entry points of one
attention call, the units and the sweeps; `test_every_public_function_is_fuzzed` here checks
that every public function of calc has an entry in one of the two files (or a reason).
"""

from __future__ import annotations

import copy
import json
import math
from fractions import Fraction
from numbers import Real
from pathlib import Path
from typing import Any

import pytest
from _robust import HOSTILE, Hang, assert_clear_error, time_limit
from hypothesis import example, given
from hypothesis import strategies as st

from attnmem import calc
from attnmem.calc import GB, IMPLEMENTATIONS, MAX_BATCH, MAX_SEQ_LEN, MODELS, ModelConfig
from attnmem.calc.weights import fp32_router_params
from tests.calc.test_fuzz_hostile_inputs import (
    BATCH,
    DTYPE,
    ENTRIES,
    FUZZ,
    SEQ,
    TIME_LIMIT_S,
    Arg,
    Entry,
    _budget_arg,
    _dtype_for,
    _runs,
    as_int,
    bpe_s,
    budget_s,
    check_nonneg_int,
    close,
    dtype_s,
    entry_params,
    exact_bpe,
    flag_s,
    fuzz_entry,
    is_attn_dtype,
    is_bpe,
    is_count,
    is_dtype,
    is_flag,
    is_impl,
)

pytestmark = pytest.mark.robustness

# ------------------------------------------------------------------ models ----

def is_model(v: object) -> bool:
    return isinstance(v, ModelConfig)


TINY_MOE = ModelConfig(
    name="tiny moe", num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4,
    intermediate_size=4, vocab_size=16, num_experts=4, experts_per_token=2)
MODEL_LIST = [*MODELS.values(), TINY_MOE]
model_s = st.sampled_from(MODEL_LIST)
MODEL = Arg("model", model_s, is_model, aliases=("ModelConfig",))


def _impl_for_model(kw: dict[str, Any]) -> Any:
    """An implementation that runs the attention dtype drawn so far and takes the drawn model's
    head dim: the valid pairs (calc.peak.takes_head_dim: the bundled kernel takes 16-256 only,
    so a model of head dim 4 with "triton" is refused as a pair, each valid alone)."""
    dt = kw.get("dtype", kw.get("act_dtype"))
    impls = [i for i in IMPLEMENTATIONS if not is_attn_dtype(dt) or _runs(i, dt)]
    m = kw.get("model")
    if is_model(m):
        impls = [i for i in impls if calc.peak.takes_head_dim(i, m.head_dim)]
    return st.sampled_from(impls)


#: The implementation of a model's attention (IMPL, with the model's head dim in the pair).
MODEL_IMPL = Arg("impl", _impl_for_model, is_impl, aliases=("implementation",))


# ------------------------------------------------------------------ oracles ----

def check_weight(result: Any, kw: dict[str, Any], call: str) -> None:
    # DeepSeek-V2/V3's router weight stays fp32 below fp32 (attnmem/calc/weights.py)
    bpe = exact_bpe(kw["bytes_per_param"])
    fp32 = fp32_router_params(kw["model"]) if bpe < 4 else 0
    close(result, (calc.param_count(kw["model"]) - fp32) * bpe + 4 * fp32, call)


def check_kv(result: Any, kw: dict[str, Any], call: str) -> None:
    m: ModelConfig = kw["model"]
    b, s = as_int(kw["batch"]), as_int(kw["seq_len"])
    layers = m.num_layers if m.attention_layers is None else m.attention_layers  # hybrids
    windowed = min(m.sliding_window_layers, layers) if m.sliding_window else 0
    per_seq = (layers - windowed) * s + windowed * min(s, m.sliding_window or s)
    # MLA (DeepSeek-V2/V3) caches one latent of kv_lora_rank + qk_rope_head_dim per token
    per_token = (m.kv_lora_rank + m.qk_rope_head_dim if m.kv_lora_rank
                 else 2 * m.num_kv_heads * m.head_dim)
    close(result, b * per_seq * per_token * exact_bpe(kw["bytes_per_element"]), call)


def check_gpus_needed(result: Any, kw: dict[str, Any], call: str) -> None:
    check_nonneg_int(result, kw, call)
    total, gpu = Fraction(kw["total_bytes"]), Fraction(kw["gpu_bytes"])
    want = max(1, math.ceil(total / gpu))
    assert result == want, f"{call} = {result}, but ceil(total/gpu) = {want}"


def check_breakdown(result: Any, kw: dict[str, Any], call: str) -> None:
    assert isinstance(result, dict) and result
    for part, n in result.items():
        check_nonneg_int(n, kw, f"{call}[{part!r}]")


def check_memory(result: Any, kw: dict[str, Any], call: str) -> None:
    parts = (result.weights_bytes, result.kv_cache_bytes, result.attention_bytes,
             result.scores_bytes)
    for n in parts:
        check_nonneg_int(n, kw, call)
    check_nonneg_int(result.prefill_bytes, kw, call)
    if result.total_is_lower_bound:  # inference_step refused it: weights + KV + attention
        assert result.total_bytes == sum(parts[:3])
    else:  # generate()'s prefill peak, never below the cache and weights it holds
        assert result.total_bytes == result.inference.peak_bytes >= sum(parts[:2])
    assert result.weights_bytes == calc.weight_bytes(kw["model"], kw["weight_dtype"])
    assert result.kv_cache_bytes == calc.kv_cache_bytes(
        kw["model"], kw["batch"], kw["seq_len"], kw["kv_dtype"])


def check_model_max(result: Any, kw: dict[str, Any], call: str) -> None:
    check_nonneg_int(result, kw, call)
    args = (kw["model"], kw["batch"])
    dts = (kw["weight_dtype"], kw["kv_dtype"], kw["act_dtype"], kw["impl"])
    if result > 0:
        assert calc.model_memory(*args, result, *dts).total_bytes <= kw["gpu_bytes"]
    if 0 < result < MAX_SEQ_LEN:
        assert calc.model_memory(*args, result + 1, *dts).total_bytes > kw["gpu_bytes"]


def check_training(result: Any, kw: dict[str, Any], call: str) -> None:
    total = result if isinstance(result, int) else result.total_bytes
    check_nonneg_int(total, kw, call)
    other = calc.training_attention_bytes(
        kw["model"], kw["batch"], kw["seq_len"], kw["dtype"], kw["impl"], not kw["checkpointing"])
    with_ckpt, without = (total, other) if kw["checkpointing"] else (other, total)
    assert with_ckpt <= without, f"{call}: checkpointing uses more memory than not"


# ------------------------------------------------------------------ the entry points ----

MODEL_ENTRIES: list[Entry] = [
    Entry("param_count", calc.param_count, [MODEL], check_nonneg_int,
          examples=[dict(model="Llama 3.1 8B")]),
    Entry("active_param_count", calc.active_param_count, [MODEL], check_nonneg_int,
          examples=[dict(model=None)]),
    Entry("param_breakdown", calc.param_breakdown,
          [MODEL, Arg("experts", st.one_of(st.none(), st.integers(1, 4)),
                      lambda v: v is None or is_count(1, None)(v))],
          check_breakdown,
          examples=[dict(model=TINY_MOE, experts=-3), dict(model=TINY_MOE, experts="x")]),
    Entry("weight_bytes", calc.weight_bytes,
          [MODEL, Arg("bytes_per_param", bpe_s, is_bpe, ("bytes_per_element", "dtype"))],
          check_weight,
          examples=[dict(model=MODELS["Llama 3.1 8B"], bytes_per_param=0.0625),
                    dict(model=None, bytes_per_param=2)]),
    Entry("kv_cache_bytes", calc.kv_cache_bytes,
          [MODEL, BATCH, SEQ, Arg("bytes_per_element", bpe_s, is_bpe, ("dtype",))], check_kv,
          examples=[dict(model=None, batch=1, seq_len=1, bytes_per_element=2),
                    dict(model=MODELS["Mixtral 8x7B"], batch=1, seq_len=1000,
                         bytes_per_element=0.3)]),
    Entry("model_memory", calc.model_memory,
          [MODEL, BATCH, SEQ, Arg("weight_dtype", dtype_s, is_dtype, ("dtype", "bytes_per_element")),
           Arg("kv_dtype", dtype_s, is_dtype, ("dtype", "bytes_per_element")),
           Arg("act_dtype", _dtype_for, is_attn_dtype, ("dtype",)), MODEL_IMPL],
          check_memory,
          examples=[dict(model=None, batch=1, seq_len=1, weight_dtype="bf16", kv_dtype="bf16",
                         act_dtype="bf16", impl="naive")]),
    Entry("model_max_seq_len", calc.model_max_seq_len,
          [MODEL, _budget_arg("gpu_bytes"), Arg("batch", st.integers(1, 64), is_count(1, MAX_BATCH)),
           Arg("weight_dtype", dtype_s, is_dtype, ("dtype", "bytes_per_element")),
           Arg("kv_dtype", dtype_s, is_dtype, ("dtype", "bytes_per_element")),
           Arg("act_dtype", _dtype_for, is_attn_dtype, ("dtype",)), MODEL_IMPL],
          check_model_max,
          examples=[dict(model="Llama 3.1 8B", gpu_bytes=80 * GB, batch=1, weight_dtype="bf16",
                         kv_dtype="bf16", act_dtype="bf16", impl="naive")]),
    Entry("gpus_needed", calc.gpus_needed,
          [Arg("total_bytes", st.one_of(st.integers(0, 10**15), st.floats(0, 1e15)),
               lambda v: isinstance(v, Real) and not isinstance(v, bool) and (isinstance(v, int) or math.isfinite(v))
               and v >= 0),
           Arg("gpu_bytes", st.one_of(st.integers(1, 10**12), st.sampled_from([0.5, 3.5, 80e9])),
               lambda v: isinstance(v, Real) and not isinstance(v, bool) and (isinstance(v, int) or math.isfinite(v))
               and v > 0)],
          check_gpus_needed,
          examples=[dict(total_bytes=10, gpu_bytes=0.5), dict(total_bytes=10, gpu_bytes=3.5),
                    dict(total_bytes=math.nan, gpu_bytes=1), dict(total_bytes="a", gpu_bytes=1)]),
    Entry("training_attention", calc.training_attention,
          [MODEL, Arg("batch", st.integers(1, 64), is_count(1, MAX_BATCH)), SEQ, DTYPE, MODEL_IMPL,
           Arg("checkpointing", flag_s, is_flag)],
          check_training,
          examples=[dict(model=MODELS["Llama 3.1 8B"], batch=1, seq_len=4096, dtype="bf16",
                         impl="naive", checkpointing="false")]),
    Entry("training_attention_bytes", calc.training_attention_bytes,
          [MODEL, Arg("batch", st.integers(1, 64), is_count(1, MAX_BATCH)), SEQ, DTYPE, MODEL_IMPL,
           Arg("checkpointing", flag_s, is_flag)],
          check_training,
          examples=[dict(model=None, batch=1, seq_len=1, dtype="bf16", impl="naive",
                         checkpointing=False)]),
]


@pytest.mark.parametrize("entry", entry_params(MODEL_ENTRIES))
@FUZZ
@given(data=st.data())
def test_model_entry_point_fuzz(entry: Entry, data: st.DataObject) -> None:
    fuzz_entry(entry, data)


def test_every_public_function_is_fuzzed() -> None:
    """A new public function in calc.__all__ must get an entry here or in
    tests/calc/test_fuzz_hostile_inputs.py (or a reason below)."""
    covered = {e.name for e in ENTRIES + MODEL_ENTRIES} | {"from_hf_config", "largest_fitting"}
    # fuzzed in their own files (tests/calc/test_context_parallel.py, test_training_step.py)
    covered |= {f.__name__ for f in calc.CONTEXT_PARALLEL_FUNCTIONS + calc.TRAINING_STEP_FUNCTIONS}
    not_functions = {n for n in calc.__all__ if not callable(getattr(calc, n))
                     or isinstance(getattr(calc, n), type)}
    # fixture_name: file-name helper for tests (str -> str); test_fixture_name_handles_any_text.
    missing = set(calc.__all__) - not_functions - covered - {"fixture_name"}
    assert not missing, f"public calc functions without a fuzz entry: {sorted(missing)}"


@FUZZ
@example(budget=3, hi=None)
@given(budget=st.one_of(HOSTILE, budget_s), hi=st.one_of(st.just(MAX_SEQ_LEN), HOSTILE))
def test_largest_fitting_fuzz(budget: Any, hi: Any) -> None:
    call = f"largest_fitting(cost, {budget!r}, hi={hi!r})"
    try:
        with time_limit(TIME_LIMIT_S):
            got = calc.largest_fitting(lambda s: 3 * s * s, budget, hi)
    except Hang:
        raise
    except Exception as err:  # noqa: BLE001
        assert_clear_error(err, ["budget_bytes", "hi"], call)
        return
    assert isinstance(got, int) and got >= 0, call
    assert isinstance(budget, Real) and not isinstance(budget, bool), f"{call} accepted {budget!r}"
    if got:
        assert 3 * got * got <= budget, call


def test_fixture_name_handles_any_text() -> None:
    assert calc.fixture_name("meta-llama/Llama-3.1-8B") == "Llama-3.1-8B.json"
    assert calc.fixture_name("../../etc/passwd").endswith("passwd.json")


# ------------------------------------------------- ModelConfig.from_hf_config on any JSON ----

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf_configs"
FIXTURE_CONFIGS = {p.stem: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))}

json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=10**15, max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10))
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
#: Keys from_hf_config reads (attnmem/calc/models.py), so mutations hit the parser, not ignored keys.
READ_KEYS = (
    "model_type", "num_hidden_layers", "n_layer", "hidden_size", "n_embd",
    "num_attention_heads", "n_head", "num_key_value_heads", "num_kv_heads", "head_dim",
    "intermediate_size", "n_inner", "vocab_size", "max_position_embeddings", "n_positions",
    "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
    "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
    "sliding_window_pattern", "attention_bias", "mlp_bias", "tie_word_embeddings",
    "_name_or_path", "text_config")
#: Required whole-number keys of a Llama-style config (no alias key in those fixtures).
REQUIRED_INTS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size",
                 "intermediate_size")
LLAMA_STYLE = [k for k, d in FIXTURE_CONFIGS.items()
               if d.get("model_type") in ("llama", "mistral", "qwen2") and "text_config" not in d]


def _sane(model: ModelConfig, call: str) -> None:
    ints = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
            "intermediate_size", "vocab_size", "num_experts", "experts_per_token")
    for f in ints:
        v = getattr(model, f)
        assert isinstance(v, int) and not isinstance(v, bool) and v >= 1, f"{call}: {f}={v!r}"
    assert model.num_heads % model.num_kv_heads == 0, call
    assert model.experts_per_token <= model.num_experts, call
    assert isinstance(model.name, str), f"{call}: name={model.name!r}"
    with time_limit(TIME_LIMIT_S):
        n = calc.param_count(model)
        kv = calc.kv_cache_bytes(model, 1, 4096, "bf16")
    assert isinstance(n, int) and n > 0, f"{call}: param_count={n!r}"
    assert isinstance(kv, int) and kv > 0, f"{call}: kv_cache_bytes={kv!r}"


def _parse(d: object, call: str) -> ModelConfig | ValueError:
    try:
        with time_limit(TIME_LIMIT_S):
            return ModelConfig.from_hf_config(d)  # type: ignore[arg-type]
    except Hang:
        raise
    except ValueError as err:
        assert str(err).startswith("config.json"), f"{call}: message {err!s} does not say where"
        return err
    except Exception as err:  # noqa: BLE001
        raise AssertionError(f"{call} raised {type(err).__name__}: {err}") from err


@FUZZ
@given(d=st.one_of(json_value, st.dictionaries(st.sampled_from(READ_KEYS), json_value)))
def test_from_hf_config_any_json(d: object) -> None:
    """Arbitrary JSON: a sane ModelConfig or a ValueError saying 'config.json: ...'."""
    got = _parse(d, f"from_hf_config({d!r:.200})")
    if isinstance(got, ModelConfig):
        _sane(got, f"from_hf_config({d!r:.200})")


@FUZZ
@given(base=st.sampled_from(sorted(FIXTURE_CONFIGS)),
       changes=st.dictionaries(st.sampled_from(READ_KEYS), json_value, min_size=1, max_size=3),
       drop=st.lists(st.sampled_from(READ_KEYS), max_size=2))
def test_from_hf_config_mutated_real_configs(base: str, changes: dict, drop: list) -> None:
    """A real config.json with a few keys replaced by hostile JSON or removed: a sane model,
    or a ValueError that names a key in quotes."""
    d = copy.deepcopy(FIXTURE_CONFIGS[base])
    for k in drop:
        d.pop(k, None)
    d.update(changes)
    call = f"from_hf_config({base} with {changes!r:.200}, without {drop})"
    got = _parse(d, call)
    if isinstance(got, ValueError):
        assert "'" in str(got) or "JSON object" in str(got), f"{call}: {got} names no key"
    else:
        _sane(got, call)


@FUZZ
@given(base=st.sampled_from(LLAMA_STYLE), key=st.sampled_from(REQUIRED_INTS),
       value=st.one_of(st.text(max_size=6), st.booleans(), st.lists(st.integers(), max_size=2),
                       st.floats().filter(lambda f: not f.is_integer()), st.none(),
                       st.integers(max_value=0)))
def test_required_key_with_a_wrong_value_is_refused_by_name(base: str, key: str,
                                                          value: object) -> None:
    """No wrong-but-plausible model: a required size that is not a positive whole number
    (text, bool, list, 2.5, null, 0, -3) is refused, and the message names that key."""
    d = copy.deepcopy(FIXTURE_CONFIGS[base])
    d[key] = value
    got = _parse(d, f"{base} with {key}={value!r}")
    assert isinstance(got, ValueError), f"{base} with {key}={value!r} parsed as {got}"
    assert f"'{key}'" in str(got), f"{got} does not name '{key}'"


@FUZZ
@given(base=st.sampled_from(LLAMA_STYLE), key=st.sampled_from(REQUIRED_INTS),
       value=st.one_of(st.integers(1, 4096), st.integers(1, 4096).map(float)))
def test_required_key_with_a_valid_value_is_used_exactly(base: str, key: str, value: object) -> None:
    d = copy.deepcopy(FIXTURE_CONFIGS[base])
    d[key] = value
    if key in ("hidden_size", "num_attention_heads") and "head_dim" not in d:
        d["head_dim"] = 128  # keep hidden/heads divisibility out of this test
    if key == "num_attention_heads":
        d["num_key_value_heads"] = 1
    got = _parse(d, f"{base} with {key}={value!r}")
    if isinstance(got, ValueError):
        return  # e.g. Qwen's max_window_layers above the new layer count: refused by name
    field_of = {"num_hidden_layers": "num_layers", "hidden_size": "hidden_size",
                "num_attention_heads": "num_heads", "vocab_size": "vocab_size",
                "intermediate_size": "intermediate_size"}
    assert getattr(got, field_of[key]) == int(value)  # type: ignore[call-overload]


@pytest.mark.parametrize("name", [5, ["x"], b"x"])
def test_from_hf_config_name_argument(name: object) -> None:
    d = FIXTURE_CONFIGS["Llama-3.1-8B"]
    try:
        model = ModelConfig.from_hf_config(d, name=name)  # type: ignore[arg-type]
    except (ValueError, TypeError) as err:
        assert "name" in str(err)
        return
    raise AssertionError(f"name={name!r} accepted; model.name={model.name!r}")
