"""attnmem.calc.inference_step against generate() as transformers runs it: the bundled H200 rows, a
CPU replay of the live tensor bytes, the moments' structure and bad input."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import attnmem.calc
from attnmem.calc.inference_step import (
    INFER_ATTENTIONS,
    PHASES,
    inference_step,
    max_inference_seq_len,
)
from attnmem.calc.models import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "data" / "inference_steps_h200.csv"
LLAMA = attnmem.calc.MODELS["Llama 3.1 8B"]


def _predict(row: pd.Series) -> int:
    from attnmem.measure import infer_models  # config dicts only: no torch at import

    model = ModelConfig.from_hf_config(infer_models.hf_config(row.model, int(row.layers)))
    chunk = None if pd.isna(row.prefill_chunk) else int(row.prefill_chunk)
    return inference_step(model, int(row.batch), int(row.prompt_len), int(row.new_tokens),
                          attention=row.attention, cache=row.cache,
                          prefill_chunk=chunk).peak_bytes


def test_bundled_h200_rows_within_two_percent() -> None:
    """Every measured generate() peak (data/inference_steps_h200.csv) against today's model:
    the issue's target is 2% on every row (measured: within 0.32%)."""
    rows = pd.read_csv(H200)
    ok = rows[rows.status == "ok"]
    assert len(ok) >= 60 and ok.model.nunique() >= 6
    errors = {f"{r.model} {r.attention} {r.cache} B={r.batch} s={r.prompt_len}":
              (_predict(r) - r.peak_bytes) / r.peak_bytes for r in ok.itertuples()}
    worst = max(errors, key=lambda k: abs(errors[k]))
    assert abs(errors[worst]) <= 0.02, (worst, errors[worst])


def test_cpu_replay_of_generate_matches() -> None:
    """generate() of a tiny Llama on the CPU under a live-bytes dispatch mode: the peak beyond
    the weights equals the prediction less the CUDA-only workspace (prefill at the MLP with
    SDPA, at the softmax with eager), within 0.1%."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=704, num_hidden_layers=3,
                                   num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                                   vocab_size=1000, max_position_embeddings=4096)
    for attn, name in (("sdpa", "sdpa_flash"), ("eager", "eager")):
        got, predicted = _replay_peak(cfg, attn, name, s=512)
        assert abs(predicted - got) <= 0.001 * got, (attn, predicted, got)


def _replay_peak(cfg, attn: str, name: str, s: int = 256,
                 chunk: int | None = None) -> tuple[int, int]:
    """(measured, predicted) peak beyond the weights of generate() (s prompt tokens, 2 new) of
    a tiny random model on the CPU under the live-bytes dispatch mode, in bf16; the prediction
    less the CUDA-only workspace."""
    import torch
    import transformers

    from attnmem.measure.live_bytes import LiveBytes

    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.bfloat16, attn_implementation=attn).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, s))
    mask = torch.ones_like(ids)
    kw = dict(do_sample=False, pad_token_id=0, max_new_tokens=2, min_new_tokens=2)
    model.generate(ids[:, :8], attention_mask=mask[:, :8], **kw)  # lazy state
    if chunk is not None:
        kw["prefill_chunk_size"] = chunk
    live = LiveBytes()
    for t in [*model.parameters(), *model.buffers()]:
        live.add(t)
    weights = live.bytes
    live.add(ids)
    live.add(mask)
    live.reset_peak()
    with live:
        model.generate(ids, attention_mask=mask, **kw)
    want = inference_step(ModelConfig.from_hf_config(cfg.to_dict()), 1, s, 2, attention=name,
                          prefill_chunk=chunk)
    return live.peak - weights, want.peak_bytes - want.weights_bytes - want.fixed_bytes


def test_cpu_replay_moe_whose_experts_are_wider_than_3_4_h() -> None:
    """A tiny Mixtral (I = 3.5·h, as the real one): the prefill peaks inside the experts' gate
    (sorted hidden states, the S·2I gate_up projection, act(gate) and the product), not after
    the down projection. Counting only the later moment was 59% under here and 10% under a
    real Mixtral's generate() on the H200 (B = 4, 4,096 tokens)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(
        hidden_size=128, intermediate_size=448, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, num_local_experts=4, num_experts_per_tok=2,
        vocab_size=1000, max_position_embeddings=4096)
    got, predicted = _replay_peak(cfg, "sdpa", "sdpa_flash")
    assert abs(predicted - got) <= 0.002 * got, (predicted, got)


def test_cpu_replay_gemma2_eager_soft_capping_adds_no_score_tensor() -> None:
    """A tiny Gemma 2 under eager attention: soft-capping replaces the scores one tensor at a
    time, so the peak is the softmax's, as in any eager model (a term for a kept tanh output
    was 15% over here and 8% over a real Gemma 2 9B on the H200 at 6,000 tokens)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Gemma2Config(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=1000, max_position_embeddings=4096,
        sliding_window=64, query_pre_attn_scalar=32)
    got, predicted = _replay_peak(cfg, "eager", "eager")
    assert abs(predicted - got) <= 0.001 * got, (predicted, got)


def test_cpu_replay_chunked_prefill_with_a_window_attends_to_the_kept_window() -> None:
    """A tiny Mistral (window 64) prefilled in chunks of 64 and 32 under eager attention: a
    later chunk attends to the w - 1 kept tokens and the chunk (DynamicSlidingWindowLayer),
    not to the whole past, and its mask is sized so. Counting the whole past was 37-109%
    over here; now within 1.5% (a few KiB of small per-chunk tensors)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MistralConfig(
        hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=1000, max_position_embeddings=4096,
        sliding_window=64)
    for chunk in (64, 32):
        got, predicted = _replay_peak(cfg, "eager", "eager", chunk=chunk)
        assert abs(predicted - got) <= 0.015 * got, (chunk, predicted, got)


def test_cpu_replay_eager_weights_held_through_the_mlp() -> None:
    """Eager attention returns its probabilities (B·H·c·keys, e) and the decoder layer keeps
    them in `_` through the post-attention norm and the MLP / MoE (modeling_llama.py
    LlamaDecoderLayer.forward `hidden_states, _ = self.self_attn(...)`); an MoE block keeps the
    router's logits likewise. A wide MLP and a short prompt put the peak at the MLP: without
    them calc was 7.1% under for this Llama and 5.4% under for this DeepSeek-V2 (MLA, fp32
    router logits, a dense first layer); now within 0.01%."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    llama = transformers.LlamaConfig(
        hidden_size=128, intermediate_size=4096, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=1000, max_position_embeddings=4096)
    deepseek = transformers.DeepseekV2Config(
        hidden_size=128, intermediate_size=1024, moe_intermediate_size=1024, n_routed_experts=8,
        num_experts_per_tok=4, n_shared_experts=2, first_k_dense_replace=1,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64,
        q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
        vocab_size=1000, max_position_embeddings=4096)
    for cfg in (llama, deepseek):
        got, predicted = _replay_peak(cfg, "eager", "eager")
        model = ModelConfig.from_hf_config(cfg.to_dict())
        assert inference_step(model, 1, 256, 2, attention="eager").peak_phase == PHASES[2]
        assert abs(predicted - got) <= 0.001 * got, (cfg.model_type, predicted, got)


def test_cpu_replay_qwen2_moe_shared_expert_first_and_its_unused_sliding_mask() -> None:
    """A tiny Qwen2-MoE: the shared expert runs before the routed ones (its output waits
    through them), and the model builds a sliding-window mask no layer reads. Without both,
    calc was 12% under with SDPA and 4% under with eager here."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen2MoeConfig(
        hidden_size=128, intermediate_size=352, moe_intermediate_size=96,
        shared_expert_intermediate_size=256, num_experts=4, num_experts_per_tok=2,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        vocab_size=1000, max_position_embeddings=4096)
    for attn, name in (("sdpa", "sdpa_flash"), ("eager", "eager")):
        got, predicted = _replay_peak(cfg, attn, name)
        assert abs(predicted - got) <= 0.005 * got, (attn, predicted, got)


def test_moments_and_parts() -> None:
    m = inference_step(LLAMA, 1, 32000, 8, attention="sdpa_flash")
    assert m.peak_phase == "prefill: MLP of the last layer" and set(m.phases) <= set(PHASES)
    assert m.peak_bytes == sum(x for *_, x in m.peak_terms) == sum(m.parts.values())
    assert m.kv_cache_bytes == attnmem.calc.kv_cache_bytes(LLAMA, 1, 32007, "bf16")
    # Eager's s² scores make the attention moment the peak; chunking caps them at C × s.
    eager = inference_step(LLAMA, 1, 16384, 1, attention="eager")
    chunked = inference_step(LLAMA, 1, 16384, 1, attention="eager", prefill_chunk=2048)
    assert eager.peak_phase.startswith("prefill: attention") and chunked.peak_bytes < eager.peak_bytes
    # Many sequences, a short prompt and a long generation: the decode holds the peak.
    decode = inference_step(attnmem.calc.MODELS["Llama 3.2 1B"], 64, 128, 512, attention="sdpa")
    assert decode.peak_phase.startswith("decode") and decode.decode_peak_bytes == decode.peak_bytes
    static = inference_step(LLAMA, 1, 4096, 512, attention="sdpa", cache="static")
    assert static.kv_cache_bytes == attnmem.calc.kv_cache_bytes(LLAMA, 1, 4096 + 512 - 1, "bf16")


def test_longest_prompt_is_exact() -> None:
    gpu = attnmem.calc.GPUS["NVIDIA H100 80GB"]
    s = max_inference_seq_len(LLAMA, gpu, 1, attention="sdpa_flash")
    assert inference_step(LLAMA, 1, s, attention="sdpa_flash").peak_bytes <= gpu
    assert inference_step(LLAMA, 1, s + 1, attention="sdpa_flash").peak_bytes > gpu


@pytest.mark.parametrize("kwargs, match", [
    (dict(attention="sdpa_math"), "not modelled"),
    (dict(attention="flashy"), "unknown attention"),
    (dict(cache="paged"), "unknown cache"),
    (dict(prefill_chunk=0), "prefill_chunk"),
    (dict(weight_dtype="bf17"), "weight_dtype"),
    (dict(act_dtype="int8"), "act_dtype"),
])
def test_bad_input_is_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        inference_step(LLAMA, 1, 1024, 1, **kwargs)


@pytest.mark.parametrize("name", ["Jamba v0.1 (hybrid)", "GPT-2 (124M)", "gpt-oss-20b (MoE, MXFP4)"])
def test_unmodelled_architectures_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="inference_step"):
        inference_step(attnmem.calc.MODELS[name], 1, 1024, 1, attention="sdpa")


def test_every_attention_is_accepted_for_llama_but_the_forced_memory_efficient_one() -> None:
    """Llama 3.1 8B is grouped-query: with SDPA's memory-efficient backend forced, every
    generate() on the H200 found no kernel (data/inference_steps_h200.csv), so calc refuses it;
    every other attention is sized, eager the largest."""
    from attnmem.calc.backends import NoKernel

    ran = [a for a in INFER_ATTENTIONS if a != "sdpa_efficient"]
    peaks = {a: inference_step(LLAMA, 1, 4096, 1, attention=a).peak_bytes for a in ran}
    assert peaks["eager"] == max(peaks.values())
    with pytest.raises(NoKernel, match="memory-efficient backend has no grouped-query kernel"):
        inference_step(LLAMA, 1, 4096, 1, attention="sdpa_efficient")


def test_forced_sdpa_backends_are_refused_exactly_where_the_h200_found_no_kernel() -> None:
    """Every bundled generate() row with flash or memory-efficient forced: calc refuses
    (NoKernel) exactly the rows that said "No available kernel" and sizes every row that ran
    (a static cache's decode, a later prefill chunk, a window not longer than the keys, MLA's
    unequal heads for flash; grouped-query heads for memory-efficient)."""
    from attnmem.calc.backends import NoKernel

    rows = pd.read_csv(H200)
    rows = rows[rows.attention.isin(["sdpa_flash", "sdpa_efficient"])]
    assert len(rows) >= 40 and (rows.status == "unavailable").sum() >= 20
    for r in rows.itertuples():
        try:
            _predict(r)
            refused = False
        except NoKernel:
            refused = True
        no_kernel = r.status == "unavailable" and "No available kernel" in str(r.message)
        assert refused == no_kernel, (r.model, r.attention, r.cache, r.prompt_len, r.status)


def test_vllm_profile_moments_by_hand() -> None:
    """attnmem.calc.serving's profiling-run moments for Llama 3.1 8B at vLLM's 8,192 batched tokens:
    the MLP (gate_up 2·T·I, SiluAndMul T·I beside the residual and normed hidden states) is
    the peak; attention holds the fused qkv, its output and o_proj's output."""
    from attnmem.calc.serving import activation_moments, activation_peak_estimate

    t, h, i, q, k = 8192, 4096, 14336, 4096, 1024
    m = activation_moments(LLAMA, t)
    assert m["MLP of a layer"] == 2 * t * h * 2 + 3 * t * i * 2
    assert m["attention of a layer"] == 2 * t * h * 2 + t * (q + 2 * k) * 2 + t * q * 2 + t * h * 2
    assert m["sampler"] == 2 * t * h * 2 + 256 * 128_256 * 6
    assert activation_peak_estimate(LLAMA, t) == max(m.values()) == m["MLP of a layer"]


def test_model_memory_counts_generate_as_torch_runs_it_where_the_forced_backend_has_none() -> None:
    """Model memory's FlashAttention total for Mistral 7B at 8,192 tokens: forced flash has no
    kernel under its 4,096-token window's mask, so generate() is counted with SDPA as torch
    picks the backend, and the breakdown says so; under the window nothing changes."""
    mistral = attnmem.calc.MODELS["Mistral 7B v0.1"]
    mm = attnmem.calc.model_memory(mistral, 1, 8192, "bf16", "bf16", "bf16", "sdpa_flash")
    assert "counted with SDPA as torch picks" in mm.counted_as and not mm.total_is_lower_bound
    assert mm.total_bytes == inference_step(mistral, 1, 8192, 1, attention="sdpa").peak_bytes
    short = attnmem.calc.model_memory(mistral, 1, 2048, "bf16", "bf16", "bf16", "sdpa_flash")
    assert short.counted_as == ""
    assert short.total_bytes == inference_step(mistral, 1, 2048, 1,
                                               attention="sdpa_flash").peak_bytes
