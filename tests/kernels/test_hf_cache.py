"""Our kernels inside generate(): dynamic cache, static cache, chunked prefill.

transformers asks our mask function for the causal mask of each model call; with a KV cache
and no padding it gets a `CacheCausal` marker back (attnmem/kernels/hf/attention.py), and
the attention function runs the forward kernel (prefill into an empty cache) or the split-KV
path (`attnmem.kernels.flash.decode.decode_attention`: decode steps, chunks of a chunked
prefill). The check: greedy generate() with attn_implementation="triton" gives the same
tokens as with "eager" and "sdpa", and scores within fp32 rounding, for each cache; and our
kernels ran every attention call (counted), so no call took another path.

Under Triton's CPU interpreter (one child process, this file run as a script), a tiny Llama
(2 layers, 4 heads, 2 KV heads, fp32: the interpreter's bf16 is wrong). The unit checks of
the mask function and the refusals run in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_CUDA = torch.cuda.is_available()
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "vocab_size": 128, "max_position_embeddings": 256}
#: generate() settings per case: the cache and the prefill's chunking
CASES = {
    "dynamic": dict(),
    "static": dict(cache_implementation="static"),
    "chunked_prefill": dict(prefill_chunk_size=8),
    "static_chunked_prefill": dict(cache_implementation="static", prefill_chunk_size=8),
}


def _models():
    from transformers import AutoModelForCausalLM

    import attnmem.kernels.hf
    from attnmem.measure.train_models import build_config

    attnmem.kernels.hf.register()
    out = {}
    for impl in ("eager", "sdpa", "triton"):
        torch.manual_seed(0)
        out[impl] = AutoModelForCausalLM.from_config(build_config(dict(TINY)),
                                                     dtype=torch.float32,
                                                     attn_implementation=impl).eval()
    for m in out.values():
        m.load_state_dict(out["eager"].state_dict())
        m.generation_config.pad_token_id = 0
    return out


def _count_kernels():
    """Counters of our two kernels' calls (patched where the attention function imports them)."""
    from attnmem.kernels.flash import api, decode

    calls = {"flash_attention": 0, "decode_attention": 0}
    real = {"flash_attention": api.flash_attention, "decode_attention": decode.decode_attention}

    def wrap(name):
        def fn(*a, **k):
            calls[name] += 1
            return real[name](*a, **k)
        return fn

    api.flash_attention = wrap("flash_attention")
    decode.decode_attention = wrap("decode_attention")
    return calls


def _generate(models, settings, prompt, new) -> dict:
    calls = _count_kernels()
    got = {}
    for impl, m in models.items():
        with torch.no_grad():
            res = m.generate(prompt, max_new_tokens=new, do_sample=False, use_cache=True,
                             return_dict_in_generate=True, output_scores=True, **settings)
        got[impl] = (res.sequences, torch.stack(res.scores))
        if impl == "eager":
            before = dict(calls)  # eager and sdpa call neither of ours
    seq_t, sc_t = got["triton"]
    out = {"calls": {k: v - before[k] for k, v in calls.items()}, "len": seq_t.shape[1]}
    for impl in ("eager", "sdpa"):
        seq, sc = got[impl]
        out[f"same_as_{impl}"] = seq.tolist() == seq_t.tolist()
        out[f"score_err_{impl}"] = (sc - sc_t).abs().max().item()
    return out


def _interp_worker() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _interp import quick_interpreter

    quick_interpreter()
    import attnmem.kernels.flash.api as fa

    assert fa.interpreting(), "TRITON_INTERPRET=1 did not take effect"
    models = _models()
    prompt = torch.randint(1, 128, (2, 21), generator=torch.Generator().manual_seed(3))
    results = {}
    for name, settings in CASES.items():
        try:
            results[name] = _generate(models, settings, prompt, 6)
        except Exception as exc:  # noqa: BLE001 - reported by the test of that case
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print("CACHE_RESULTS " + json.dumps(results), flush=True)


@pytest.fixture(scope="module")
def interp():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--interp-worker"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    for line in res.stdout.splitlines():
        if line.startswith("CACHE_RESULTS "):
            return json.loads(line[len("CACHE_RESULTS "):])
    pytest.fail(f"interpreter worker failed (rc {res.returncode}):\n{res.stderr[-4000:]}")


@pytest.mark.skipif(HAS_CUDA, reason="interpreter subset")
@pytest.mark.parametrize("case", list(CASES))
def test_generate_with_our_kernels_equals_eager_and_sdpa(interp, case):
    """Greedy, batch 2, a 21-token prompt, 6 new tokens: the same tokens as eager and SDPA,
    scores within 1e-4; our kernels ran 2 layers x (1 prefill + 5 decode steps) calls, or
    3 prefill chunks (8, 8, 5 tokens) with chunked prefill: chunks after the first and every
    decode step on the split-KV path."""
    r = interp[case]
    assert "error" not in r, r["error"]
    assert r["len"] == 27
    assert r["same_as_eager"] and r["same_as_sdpa"], r
    assert r["score_err_eager"] < 1e-4 and r["score_err_sdpa"] < 1e-4, r
    prefill_calls = 3 if "chunked" in case else 1
    layers = TINY["num_hidden_layers"]
    assert r["calls"]["decode_attention"] == layers * (prefill_calls - 1 + 5), r
    assert r["calls"]["flash_attention"] == layers, r  # the first prefill chunk only


# ---------------------------------------------------------------------------------------------
# In this process: the marker rule and the refusals (before any kernel launch)
# ---------------------------------------------------------------------------------------------
def _request(**kw):
    from transformers.masking_utils import causal_mask_function

    from attnmem.kernels.hf.attention import _mask_function

    args = dict(batch_size=2, q_length=1, kv_length=30, q_offset=29, kv_offset=0,
                mask_function=causal_mask_function, attention_mask=None,
                allow_is_causal_skip=True, local_size=None, dtype=torch.float32, device="cpu")
    return _mask_function(**{**args, **kw})


def test_mask_function_marks_cache_requests():
    """Dynamic cache (kv_length = past + new), static cache (kv_length = max_cache_len, a
    tensor offset, a 2D mask as long as the valid keys), chunked prefill: the marker with the
    valid keys and the first query's position; padding, a window, or queries not at the end:
    a materialised mask (refused by the attention function)."""
    from attnmem.kernels.hf.attention import CacheCausal

    assert _request() == CacheCausal(30, 29)
    assert _request(q_length=8, kv_length=24, q_offset=16) == CacheCausal(24, 16)
    ones = torch.ones(2, 24, dtype=torch.bool)
    assert _request(q_length=1, kv_length=64, q_offset=torch.tensor(23),
                    attention_mask=ones) == CacheCausal(24, 23)
    assert _request(q_length=8, kv_length=64, q_offset=torch.tensor(0),
                    attention_mask=ones[:, :8]) == CacheCausal(8, 0)
    pad = ones.clone()
    pad[0, :2] = False
    assert isinstance(_request(q_length=1, kv_length=24, q_offset=23, attention_mask=pad),
                      torch.Tensor)
    # a static cache called without a 2D mask: the valid keys end with the queries
    assert _request(q_length=4, kv_length=30, q_offset=10) == CacheCausal(14, 10)
    # queries that are not the last of the valid keys: materialised
    assert isinstance(_request(q_length=4, kv_length=30, q_offset=10, attention_mask=ones),
                      torch.Tensor)
    assert _request(q_length=30, kv_length=30, q_offset=0) is None  # plain causal: no cache


def test_cache_marker_checks_the_call():
    from attnmem.kernels.hf.attention import CacheCausal, triton_attention_forward

    class Mod(torch.nn.Module):
        is_causal = True
        layer_idx = 1

    q, k = torch.randn(1, 4, 2, 16), torch.randn(1, 2, 10, 16)
    with pytest.raises(ValueError, match="layer 1.*must be the last positions"):
        triton_attention_forward(Mod(), q, k, k, CacheCausal(12, 10))
    with pytest.raises(ValueError, match="sliding window of 4"):
        triton_attention_forward(Mod(), q, k, k, CacheCausal(8, 6), sliding_window=4)
    with pytest.raises(ValueError, match="inference only"):
        triton_attention_forward(Mod(), q.requires_grad_(), k, k, CacheCausal(8, 6))


if __name__ == "__main__" and "--interp-worker" in sys.argv:
    _interp_worker()
