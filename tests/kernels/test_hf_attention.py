"""Our kernel inside transformers (attnmem.kernels.hf): attn_implementation="triton" against eager.

Without a GPU the kernel runs under Triton's CPU interpreter, which must be switched on before
triton is first imported, so the model comparisons run in ONE child process started with
TRITON_INTERPRET=1 (this file run as a script, as tests/kernels/test_flash_attention.py does);
each test reads its case from that run. Tiny models, fp32 (the interpreter has no bf16), no
download; sliding windows both longer and shorter than the sequence (the kernel's causal
window). The refusals run in this process: each happens before any kernel launch. GPU cases
are marked ``gpu``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_CUDA = torch.cuda.is_available()

#: Tiny configs of the architectures the interface must serve (hidden 64, 4 heads, 2 KV heads).
_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 128,
         "max_position_embeddings": 256, "use_cache": False}
TINY = {
    "llama": {"model_type": "llama", **_TINY},
    "mistral_w32": {"model_type": "mistral", "sliding_window": 32, **_TINY},
    "qwen3_tied": {"model_type": "qwen3", "head_dim": 16, "tie_word_embeddings": True, **_TINY},
    "gemma3_w64": {"model_type": "gemma3_text", "head_dim": 16, "sliding_window": 64,
                   "query_pre_attn_scalar": 24, **_TINY},
    # windows shorter than the sequences below: the kernel's sliding window runs
    "mistral_w8": {"model_type": "mistral", "sliding_window": 8, **_TINY},
    "gemma3_w5_mixed": {"model_type": "gemma3_text", "head_dim": 16, "sliding_window": 5,
                        "query_pre_attn_scalar": 24,
                        "layer_types": ["sliding_attention", "full_attention"], **_TINY},
}


# ---------------------------------------------------------------------------------------------
# The child: every model comparison under the interpreter.
# ---------------------------------------------------------------------------------------------
def _pair(name: str, seed: int = 0):
    """The same random weights as an eager and a triton model."""
    from transformers import AutoModelForCausalLM

    import attnmem.kernels.hf
    from attnmem.measure.train_models import build_config

    attnmem.kernels.hf.register()
    torch.manual_seed(seed)
    eager = AutoModelForCausalLM.from_config(build_config(dict(TINY[name])), dtype=torch.float32,
                                             attn_implementation="eager")
    ours = AutoModelForCausalLM.from_config(build_config(dict(TINY[name])), dtype=torch.float32,
                                            attn_implementation="triton")
    ours.load_state_dict(eager.state_dict())
    return eager, ours


def _compare(name: str, seq: int, batch: int = 2) -> dict:
    eager, ours = _pair(name)
    assert eager.config._attn_implementation == "eager"
    assert ours.config._attn_implementation == "triton"
    ids = torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(1))
    out = {}
    for tag, m in (("eager", eager), ("ours", ours)):
        m.train()
        o = m(input_ids=ids, labels=ids)
        o.loss.backward()
        out[tag] = (o.logits.detach(), o.loss.item(),
                    {n: p.grad.detach().clone() for n, p in m.named_parameters()})
    (le, loss_e, ge), (lo, loss_o, go) = out["eager"], out["ours"]
    grad_err = max(((ge[n] - go[n]).abs().max() / ge[n].abs().max().clamp_min(1e-12)).item()
                   for n in ge)
    return {"logits_err": (le - lo).abs().max().item(), "loss_eager": loss_e, "loss_ours": loss_o,
            "grad_rel_err": grad_err, "grads": len(ge)}


def _autocast_fp16() -> dict:
    """fp32 weights under CPU autocast to fp16 (the interpreter's stand-in for amp_bf16):
    rotary leaves q, k fp32 and v fp16, so the function must cast as autocast casts SDPA's."""
    eager, ours = _pair("llama")
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(3))
    res = []
    for m in (eager, ours):
        with torch.autocast("cpu", dtype=torch.float16):
            o = m(input_ids=ids, labels=ids)
        o.loss.backward()
        res.append((o.logits.float(), o.loss.item(),
                    {n: p.grad.clone() for n, p in m.named_parameters()}))
    (l1, a, g1), (l2, b, g2) = res
    return {"logits_err": ((l1 - l2).abs().max() / l1.abs().max()).item(), "loss": [a, b],
            "grad_rel_err": max(((g1[n] - g2[n]).norm() / g1[n].norm()).item() for n in g1)}


def _noncausal() -> dict:
    """The function itself with a module whose is_causal is False (an encoder), against SDPA."""
    from attnmem.kernels.hf.attention import triton_attention_forward

    class Enc(torch.nn.Module):
        is_causal = False
        layer_idx = 0

    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 24, 16, generator=g)
    k = torch.randn(2, 2, 24, 16, generator=g)
    v = torch.randn(2, 2, 24, 16, generator=g)
    out, w = triton_attention_forward(Enc(), q, k, v, None, scaling=0.3)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True)
    return {"err": (out - ref.transpose(1, 2)).abs().max().item(), "shape": list(out.shape),
            "weights_none": w is None}


def _window_marker_used(name: str, seq: int) -> dict:
    """Which masks our mask function hands the layers of a windowed model: the marker for the
    sliding layers (no s x s tensor), None for full ones."""
    from transformers.masking_utils import AttentionMaskInterface

    from attnmem.kernels.hf import attention

    _, ours = _pair(name)
    kinds = []

    def spy(*args, **kwargs):
        out = attention._mask_function(*args, **kwargs)
        kinds.append(type(out).__name__)
        return out

    AttentionMaskInterface._global_mapping["triton"] = spy
    try:
        ours(input_ids=torch.randint(0, 128, (1, seq)))
    finally:
        AttentionMaskInterface._global_mapping["triton"] = attention._mask_function
    return {"kinds": kinds}


def _generate_windowed() -> dict:
    """Greedy decoding with a cache past the window: the same tokens as eager."""
    eager, ours = _pair("mistral_w8")
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        a = eager.eval().generate(ids, max_new_tokens=6, do_sample=False, use_cache=True)
        b = ours.eval().generate(ids, max_new_tokens=6, do_sample=False, use_cache=True)
    return {"same": a.tolist() == b.tolist(), "len": a.shape[1]}


def _decode_slices_the_window() -> dict:
    """One query against 20 cached keys with a window of 5: the function reads the last 5
    keys (the query is the newest position), as the sliding-window mask says."""
    from attnmem.kernels.hf.attention import triton_attention_forward

    class Dec(torch.nn.Module):
        is_causal = True
        layer_idx = 0

    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 1, 16, generator=g)
    k = torch.randn(2, 2, 20, 16, generator=g)
    v = torch.randn(2, 2, 20, 16, generator=g)
    out, _ = triton_attention_forward(Dec(), q, k, v, None, sliding_window=5)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k[:, :, -5:], v[:, :, -5:],
                                                           enable_gqa=True)
    return {"err": (out - ref.transpose(1, 2)).abs().max().item()}


def _interp_worker() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _interp import quick_interpreter

    quick_interpreter()  # tests/_interp.py: the interpreter without two redundant costs
    import attnmem.kernels.flash.api as fa

    assert fa.interpreting(), "TRITON_INTERPRET=1 did not take effect"
    cases = {
        "llama_causal_gqa": lambda: _compare("llama", 40),
        "mistral_window_covers_s": lambda: _compare("mistral_w32", 24),
        "mistral_window_equals_s": lambda: _compare("mistral_w32", 32, batch=1),
        "qwen3_qk_norm_tied": lambda: _compare("qwen3_tied", 20, batch=1),
        "gemma3_scaling": lambda: _compare("gemma3_w64", 20, batch=1),
        "autocast_fp16": _autocast_fp16,
        "noncausal": _noncausal,
        "mistral_window_shorter": lambda: _compare("mistral_w8", 40),
        "gemma3_window_shorter_mixed": lambda: _compare("gemma3_w5_mixed", 30, batch=1),
        "window_marker": lambda: _window_marker_used("gemma3_w5_mixed", 30),
        "generate_windowed": _generate_windowed,
        "decode_slices_window": _decode_slices_the_window,
    }
    results = {}
    for name, run in cases.items():
        try:
            results[name] = run()
        except Exception as exc:  # noqa: BLE001 - reported by the test of that case
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print("HF_RESULTS " + json.dumps(results), flush=True)


@pytest.fixture(scope="module")
def interp():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--interp-worker"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    for line in res.stdout.splitlines():
        if line.startswith("HF_RESULTS "):
            return json.loads(line[len("HF_RESULTS "):])
    pytest.fail(f"interpreter worker failed (rc {res.returncode}):\n{res.stderr[-4000:]}")


def _case(interp, name):
    r = interp[name]
    assert "error" not in r, r["error"]
    return r


@pytest.mark.parametrize("case", ["llama_causal_gqa", "mistral_window_covers_s",
                                  "mistral_window_equals_s", "qwen3_qk_norm_tied",
                                  "gemma3_scaling", "mistral_window_shorter",
                                  "gemma3_window_shorter_mixed"])
def test_model_matches_eager_under_interpreter(interp, case):
    """Logits, loss and every parameter's gradient of a tiny model: ours against eager, fp32."""
    r = _case(interp, case)
    assert r["logits_err"] < 1e-4, r
    assert math.isclose(r["loss_eager"], r["loss_ours"], rel_tol=1e-5), r
    assert r["grad_rel_err"] < 1e-3, r
    assert r["grads"] >= 10


def test_autocast_casts_like_sdpa(interp):
    r = _case(interp, "autocast_fp16")
    assert r["logits_err"] < 5e-3, r
    assert math.isclose(*r["loss"], rel_tol=1e-3), r
    assert r["grad_rel_err"] < 2e-2, r


def test_noncausal_module_matches_sdpa(interp):
    r = _case(interp, "noncausal")
    assert r["shape"] == [2, 24, 4, 16]  # (B, s, H, d): transposed back for transformers
    assert r["weights_none"]
    assert r["err"] < 1e-5


def test_sliding_window_layers_get_the_marker_not_a_mask(interp):
    """Gemma 3 with one sliding and one full layer, s = 30 > window 5: the sliding layers'
    mask request comes back as SlidingWindowMask, the full layers' as None."""
    kinds = _case(interp, "window_marker")["kinds"]
    assert set(kinds) == {"SlidingWindowMask", "NoneType"}, kinds


def test_generation_past_the_window_matches_eager(interp):
    r = _case(interp, "generate_windowed")
    assert r["same"] and r["len"] == 18, r


def test_decoding_reads_the_last_window_keys(interp):
    assert _case(interp, "decode_slices_window")["err"] < 1e-5


# ---------------------------------------------------------------------------------------------
# In this process: registration, refusals (all before any kernel launch), check_config.
# ---------------------------------------------------------------------------------------------
class _Mod(torch.nn.Module):
    is_causal = True
    layer_idx = 3


def _qkv(s_q=8, s_k=8):
    return (torch.randn(1, 4, s_q, 16), torch.randn(1, 2, s_k, 16), torch.randn(1, 2, s_k, 16))


@pytest.mark.parametrize("kwargs, words", [
    ({"softcap": 50.0}, "soft-capping"),
    ({"dropout": 0.1}, "dropout"),
    ({"position_bias": torch.zeros(1)}, "position bias"),
    ({"attention_mask": torch.ones(1, 1, 8, 8, dtype=torch.bool)}, "attention mask"),
    ({"scaling": -1.0}, "scaling"),
])
def test_refusals_name_the_reason(kwargs, words):
    from attnmem.kernels.hf.attention import triton_attention_forward

    q, k, v = _qkv()
    mask = kwargs.pop("attention_mask", None)
    with pytest.raises(ValueError, match=words) as info:
        triton_attention_forward(_Mod(), q, k, v, mask, **kwargs)
    assert "layer 3" in str(info.value)


def test_window_on_a_noncausal_layer_refused():
    from attnmem.kernels.hf.attention import triton_attention_forward

    class Enc(torch.nn.Module):
        is_causal = False
        layer_idx = 2

    q, k, v = _qkv()
    with pytest.raises(ValueError, match="layer 2.*sliding window of 4 tokens on a non-causal"):
        triton_attention_forward(Enc(), q, k, v, None, sliding_window=4)


def test_marker_and_argument_must_agree():
    from attnmem.kernels.hf.attention import SlidingWindowMask, triton_attention_forward

    q, k, v = _qkv()
    with pytest.raises(ValueError, match="sliding window of 3 tokens.*sliding_window=4"):
        triton_attention_forward(_Mod(), q, k, v, SlidingWindowMask(3), sliding_window=4)


def test_mask_function_marks_only_the_plain_causal_window():
    """SlidingWindowMask exactly where SDPA's mask would be the config's causal window and
    nothing else; a tensor (refused later) for padding, extra mask functions, chunked
    attention and queries off the keys' diagonal; the window dropped where it covers the keys."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    from attnmem.kernels.hf.attention import SlidingWindowMask, _mask_function
    from attnmem.measure.train_models import build_config

    cfg = build_config(dict(TINY["mistral_w8"]))

    def call(**kw):
        args = dict(batch_size=2, q_length=20, kv_length=20, q_offset=0, kv_offset=0,
                    mask_function=sliding_window_causal_mask_function(8), attention_mask=None,
                    allow_is_causal_skip=True, local_size=8, config=cfg, dtype=torch.float32,
                    device="cpu")
        return _mask_function(**{**args, **kw})

    assert call() == SlidingWindowMask(8)
    assert call(q_length=1, q_offset=19) == SlidingWindowMask(8)  # decoding, newest query
    pad = torch.ones(2, 20, dtype=torch.long)
    pad[0, :3] = 0
    for kw in (dict(attention_mask=pad), dict(allow_is_causal_skip=False),
               dict(q_length=4, q_offset=16), dict(q_length=1, q_offset=5)):
        out = call(**kw)
        assert isinstance(out, torch.Tensor) and out.shape[-1] == 20, kw
    chunked = build_config(dict(TINY["mistral_w8"]))
    chunked.attention_chunk_size = 8
    assert isinstance(call(config=chunked), torch.Tensor)
    assert call(kv_length=8, q_length=8) is None  # the window covers every key


def test_mask_function_reads_the_older_cache_position_form(monkeypatch):
    """Older transformers releases pass the queries' positions as cache_position instead of
    q_length/q_offset: the same marker rule applies."""
    from transformers import masking_utils

    from attnmem.kernels.hf.attention import SlidingWindowMask, _mask_function
    from attnmem.measure.train_models import build_config

    cfg = build_config(dict(TINY["mistral_w8"]))
    monkeypatch.setattr(masking_utils, "sdpa_mask",
                        lambda **kw: None if kw["local_size"] is None else "mask")

    def call(positions, kv_length=20):
        return _mask_function(batch_size=1, cache_position=positions, kv_length=kv_length,
                              kv_offset=0, attention_mask=None, allow_is_causal_skip=True,
                              local_size=8, config=cfg)

    assert call(torch.arange(20)) == SlidingWindowMask(8)
    assert call(torch.tensor([19])) == SlidingWindowMask(8)
    assert call(torch.arange(16, 20)) == "mask"  # four queries after a cache: not aligned


def test_padding_refused_in_a_windowed_model():
    from transformers import AutoModelForCausalLM

    import attnmem.kernels.hf
    from attnmem.measure.train_models import build_config

    attnmem.kernels.hf.register()
    m = AutoModelForCausalLM.from_config(build_config(dict(TINY["mistral_w8"])),
                                         attn_implementation="triton")
    ids = torch.randint(0, 128, (2, 20))
    pad = torch.ones(2, 20, dtype=torch.long)
    pad[1, :4] = 0
    with pytest.raises(ValueError, match="attention mask"):
        m(input_ids=ids, attention_mask=pad)


def test_mixed_dtypes_outside_autocast_refused():
    from attnmem.kernels.hf.attention import triton_attention_forward

    q, k, v = _qkv()
    with pytest.raises(ValueError, match="one dtype"):
        triton_attention_forward(_Mod(), q, k.half(), v, None)


def test_causal_with_cache_offsets_refused():
    from attnmem.kernels.hf.attention import triton_attention_forward

    q, k, v = _qkv(s_q=4, s_k=8)
    with pytest.raises(ValueError, match="top-left"):
        triton_attention_forward(_Mod(), q, k, v, None)


def test_register_is_idempotent_and_models_accept_the_name():
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.masking_utils import AttentionMaskInterface

    import attnmem.kernels.hf
    from attnmem.measure.train_models import build_config

    assert attnmem.kernels.hf.register() == "triton" == attnmem.kernels.hf.register()
    assert "triton" in AttentionInterface._global_mapping
    assert "triton" in AttentionMaskInterface._global_mapping
    m = AutoModelForCausalLM.from_config(build_config(dict(TINY["llama"])),
                                         attn_implementation="triton")
    assert m.config._attn_implementation == "triton"


def test_padding_mask_runs_packed_or_is_refused_in_a_model(monkeypatch):
    """A causal 2D padding mask (queries = keys) goes to the kernel's packed path (the values
    against SDPA: tests/kernels/test_varlen.py); with a sliding window shorter than the
    sequence it reaches us materialised (the mask function is registered too) and is refused."""
    from transformers import AutoModelForCausalLM

    import attnmem.kernels.hf
    from attnmem.kernels.flash import api
    from attnmem.measure.train_models import build_config

    attnmem.kernels.hf.register()
    seen = []

    def packed_call(q, k, v, causal, scale, config, window, cu_seqlens, cu_seqlens_k):
        seen.append(cu_seqlens.tolist())
        raise RuntimeError("stop: the packed path was reached")

    monkeypatch.setattr(api, "_packed_call", packed_call)
    m = AutoModelForCausalLM.from_config(build_config(dict(TINY["llama"])),
                                         attn_implementation="triton")
    ids = torch.randint(0, 128, (2, 8))
    pad = torch.ones(2, 8, dtype=torch.long)
    pad[0, :3] = 0
    with pytest.raises(RuntimeError, match="packed path was reached"):
        m(input_ids=ids, attention_mask=pad)
    assert seen == [[0, 5, 13]]
    w = AutoModelForCausalLM.from_config(build_config(dict(TINY["mistral_w8"])),
                                         attn_implementation="triton")
    ids = torch.randint(0, 128, (2, 16))
    pad = torch.ones(2, 16, dtype=torch.long)
    pad[0, :3] = 0
    with pytest.raises(ValueError, match="attention mask"):
        w(input_ids=ids, attention_mask=pad)


def test_check_config_lists_what_the_kernel_cannot_run():
    from attnmem.kernels.hf.attention import check_config
    from attnmem.measure.train_models import build_config

    llama = build_config("llama3-8b-2l")
    assert check_config(llama, 32768) == []
    mistral = build_config("mistral-7b-2l")
    assert check_config(mistral, 4096) == []  # the window covers the sequence: exact
    assert check_config(mistral, 32768) == []  # a shorter window runs the kernel's window
    gemma2 = build_config("gemma2-9b-2l")
    (why,) = check_config(gemma2, 8192)
    assert "soft-capped" in why
    gemma3 = build_config("gemma3-27b-2l")
    assert check_config(gemma3, 1024) == [] == check_config(gemma3, 8192)
    assert check_config(build_config("phi3-mini-2l"), 8192) == []


def test_import_is_light():
    code = ("import sys, attnmem.kernels.hf\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------------------------------------
# GPU: a real-width layer in bf16.
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("model, window", [("llama3-8b-2l", None), ("mistral-7b-2l", 256)])
def test_gpu_llama_width_matches_sdpa_bf16(model, window):
    """Llama 3.1 8B / Mistral 7B widths (one layer, vocab cut to 1,024), bf16, s = 1,000: ours
    against SDPA (for Mistral with its window cut to 256 < s, so SDPA gets transformers'
    sliding-window mask and ours the kernel's window), same weights; outputs and gradients
    within bf16 noise."""
    from transformers import AutoModelForCausalLM

    import attnmem.kernels.hf
    from attnmem.measure.train_models import build_config, hf_config

    attnmem.kernels.hf.register()
    d = hf_config(model, layers=1)
    d["vocab_size"] = 1024
    if window is not None:
        d["sliding_window"] = window
    torch.manual_seed(0)
    with torch.device("cuda"):
        ref = AutoModelForCausalLM.from_config(build_config(dict(d)), dtype=torch.bfloat16,
                                               attn_implementation="sdpa")
        ours = AutoModelForCausalLM.from_config(build_config(dict(d)), dtype=torch.bfloat16,
                                                attn_implementation="triton")
    ours.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 1024, (2, 1000), device="cuda")
    outs = []
    for m in (ref, ours):
        o = m(input_ids=ids, labels=ids)
        o.loss.backward()
        outs.append((o.logits.float(), o.loss.item(),
                     {n: p.grad.float() for n, p in m.named_parameters()}))
    (l1, loss1, g1), (l2, loss2, g2) = outs
    assert (l1 - l2).abs().max().item() < 0.05 * l1.abs().max().item()
    assert math.isclose(loss1, loss2, rel_tol=1e-2)
    for n in g1:
        assert (g1[n] - g2[n]).norm() <= 0.05 * g1[n].norm() + 1e-6, n


if __name__ == "__main__" and "--interp-worker" in sys.argv:
    _interp_worker()
