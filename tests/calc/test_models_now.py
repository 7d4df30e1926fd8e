"""Issue 30: gpt-oss, Kimi-K2, quantized checkpoints, active-parameter conventions, GPU totals as
torch sees them, vLLM's hybrid KV groups and multimodal text_config. Sources on each test."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from attnmem.calc import GIB, GPUS, active_param_count, param_breakdown, param_count, weight_bytes
from attnmem.calc.gpus import (
    GPU_TORCH_TOTAL,
    GPU_TORCH_TOTAL_MEASURED,
    GPU_TORCH_TOTAL_SOURCES,
    torch_total_bytes,
    torch_total_note,
)
from attnmem.calc.kv import kv_cache_bytes
from attnmem.calc.models import ModelConfig, QuantConfig
from attnmem.calc.presets import MODELS, PRESET_HF_CONFIGS
from attnmem.calc.quant import (
    checkpoint_breakdown,
    linear_modules,
    other_params,
    quantized_matrix_bytes,
    quantized_param_count,
)
from attnmem.calc.serving import kv_cache_groups, page_bytes, sequence_bytes, serving_capacity
from attnmem.calc.training_step import training_step

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf_configs"
OSS20 = MODELS["gpt-oss-20b (MoE, MXFP4)"]
OSS120 = MODELS["gpt-oss-120b (MoE, MXFP4)"]
KIMI = MODELS["Kimi-K2 (MLA, MoE, fp8)"]
DSV3 = MODELS["DeepSeek-V3 (MLA, MoE)"]
AWQ = MODELS["Qwen2.5 7B Instruct AWQ (int4)"]


def close(ours: float, theirs: float, rel: float) -> bool:
    return abs(ours - theirs) / theirs <= rel


# ------------------------------------------------------------------------------ gpt-oss ----

def test_gpt_oss_parameters_match_the_card() -> None:
    # gpt-oss model card (arXiv 2508.10925), Table 1: total 20.91B / 116.83B; active 3.61B /
    # 5.13B; by component MLP 19.12B / 114.71B, attention 0.64B / 0.96B, embed + unembed
    # 1.16B. The card's "active" leaves out the input embedding and counts the unembedding.
    for model, total, active, mlp, attention in (
            (OSS20, 20.91e9, 3.61e9, 19.12e9, 0.64e9),
            (OSS120, 116.83e9, 5.13e9, 114.71e9, 0.96e9)):
        parts = param_breakdown(model)
        assert close(param_count(model), total, 0.0005)
        assert close(active_param_count(model, include_embedding=False), active, 0.002)
        assert close(parts["mlp"], mlp, 0.002)
        assert close(parts["attention"], attention, 0.01)
        assert close(parts["embeddings"] + parts["lm_head"], 1.16e9, 0.002)
    # exact counts, by hand from modeling_gpt_oss.py's tensors (20b): attention per layer
    # q/k/v/o with biases + 64 sinks; experts 32 x (2880x5760 + 5760 + 2880x2880 + 2880);
    # router 32x2880 + 32; 2 norms; embeddings and lm_head 201088 x 2880; final norm.
    attn = 2880 * 4096 * 2 + 2880 * 512 * 2 + 4096 + 2 * 512 + 2880 + 64
    experts = 32 * (2880 * 5760 + 5760 + 2880 * 2880 + 2880)
    layer = attn + experts + 32 * 2880 + 32 + 2 * 2880
    assert param_count(OSS20) == 24 * layer + 2 * 201088 * 2880 + 2880 == 20_914_757_184
    assert active_param_count(OSS20, include_embedding=False) == 3_608_307_264
    assert active_param_count(OSS20) == 3_608_307_264 + 201088 * 2880  # default unchanged


def test_gpt_oss_layers_alternate_a_128_window() -> None:
    assert OSS20.sliding_window == 128 and OSS20.sliding_window_layers == 12
    assert OSS20.attention_sinks and OSS20.router_bias and OSS20.mlp_bias
    assert OSS20.attention_bias and OSS20.attention_out_bias
    # 12 full layers x 131,072 tokens + 12 windowed x 128, 2 x 8 heads x 64 x 2 bytes:
    # 3.22 GB of bf16 KV at 128k (the figure the issue quotes).
    kv = kv_cache_bytes(OSS20, 1, 131072, "bf16")
    assert kv == (12 * 131072 + 12 * 128) * 2 * 8 * 64 * 2 == 3_224_371_200
    assert round(kv / 1e9, 2) == 3.22


def test_gpt_oss_checkpoint_bytes_match_the_card_and_the_tensor_shapes() -> None:
    # Card Table 1: checkpoint 12.8 GiB (20b) and 60.8 GiB (120b).
    assert round(weight_bytes(OSS20, "checkpoint") / GIB, 1) == 12.8
    assert round(weight_bytes(OSS120, "checkpoint") / GIB, 1) == 60.8
    # MXFP4 tensors as transformers stores them (integrations/mxfp4.py): per layer
    # gate_up_proj_blocks uint8 [32, 5760, 90, 16], gate_up_proj_scales uint8 [32, 5760, 90],
    # down_proj_blocks [32, 2880, 90, 16], down_proj_scales [32, 2880, 90]; everything else
    # (attention, router, embeddings, lm_head, norms, sinks, expert biases) bf16.
    per_layer = 32 * 5760 * 90 * 17 + 32 * 2880 * 90 * 17
    parts = checkpoint_breakdown(OSS20)
    assert parts["quantized (MXFP4 (4-bit, one 8-bit scale per 32))"] == 24 * per_layer
    assert quantized_param_count(OSS20) == 24 * 32 * (5760 + 2880) * 2880
    rest = param_count(OSS20) - quantized_param_count(OSS20)
    assert parts["unquantized (bf16)"] == 2 * rest
    # the dtype path is unchanged
    assert weight_bytes(OSS20, "bf16") == 2 * param_count(OSS20)


def test_gpt_oss_training_takes_eager_attention_only() -> None:
    """gpt-oss training is counted in bf16 with eager attention; SDPA is refused with the
    reason (transformers 5.17 refuses it for gpt-oss: no sink logits)."""
    with pytest.raises(ValueError, match="only eager"):
        training_step(OSS20, 1, 1024, attention="sdpa_flash")
    assert training_step(OSS20, 1, 1024, attention="eager").weights_bytes == 2 * param_count(OSS20)


# ------------------------------------------------------------------ Kimi-K2 and the rule ----

def test_kimi_k2_reads_through_deepseek_v3() -> None:
    raw = PRESET_HF_CONFIGS["Kimi-K2 (MLA, MoE, fp8)"][1]
    assert raw["model_type"] == "kimi_k2"
    assert KIMI.model_type == "deepseek_v3" and KIMI.is_mla
    assert "kimi_k2" in KIMI.read_as and "DeepseekV3ForCausalLM" in KIMI.read_as
    same = ModelConfig.from_hf_config({**raw, "model_type": "deepseek_v3"})
    assert param_count(same) == param_count(KIMI)
    # Kimi-K2 card: 1T total, 32B activated (rounded); HF page 1.03T. Ours: 1.0264T total,
    # 32.9B active with the input embedding, 31.7B without.
    assert close(param_count(KIMI), 1.03e12, 0.005)
    assert 31e9 < active_param_count(KIMI, include_embedding=False) < 33e9


def test_unknown_type_needs_remote_code_to_be_read_by_its_class() -> None:
    raw = dict(PRESET_HF_CONFIGS["Kimi-K2 (MLA, MoE, fp8)"][1])
    del raw["auto_map"]  # transformers could not load it either
    with pytest.raises(ValueError, match="'kimi_k2' is not one"):
        ModelConfig.from_hf_config(raw)
    other = {**PRESET_HF_CONFIGS["Kimi-K2 (MLA, MoE, fp8)"][1], "architectures": ["NewNet"]}
    with pytest.raises(ValueError, match="'kimi_k2'"):
        ModelConfig.from_hf_config(other)
    assert MODELS["Llama 3.1 8B"].read_as == ""


# ------------------------------------------------------------------- quantized formats ----

def test_fp8_block_scales_by_hand() -> None:
    q = QuantConfig("fp8", 8, weight_block_size=(128, 128), fmt="e4m3")
    # DeepSeek-V3 kv_b_proj: weight float8 [32768, 512], weight_scale_inv float32 [256, 4]
    assert quantized_matrix_bytes(q, 32768, 512) == 32768 * 512 + 256 * 4 * 4
    # a dimension that is not a multiple of 128 gets a partial block: [576, 7168] -> [5, 56]
    assert quantized_matrix_bytes(q, 576, 7168) == 576 * 7168 + 5 * 56 * 4
    assert quantized_matrix_bytes(QuantConfig("fp8", 8), 10, 10) == 100 + 4  # per tensor
    # DeepSeek-V3 / Kimi-K2: embeddings, lm_head, norms and routers stay bf16
    for model in (DSV3, KIMI):
        parts = checkpoint_breakdown(model)
        h = model.hidden_size
        routers = (model.num_layers - model.dense_mlp_layers) * model.num_experts * h
        # other_params holds the embedding table, norms and biases; lm_head is a matrix
        assert parts["unquantized (bf16)"] == 2 * (other_params(model) + model.vocab_size * h
                                                   + routers)


def test_gptq_awq_int4_by_hand() -> None:
    # a 4096 x 4096 projection, 4 bits, group 128 (AutoGPTQ QuantLinear / AutoAWQ
    # WQLinear_GEMM buffers): qweight int32 4096·4096/8 words, qzeros int32 [32, 512],
    # scales fp16 [32, 4096], GPTQ's g_idx int32 [4096].
    gptq = QuantConfig("gptq", 4, group_size=128)
    awq = QuantConfig("awq", 4, group_size=128)
    body = (4096 * 4096 // 8) * 4  # qweight: int32 words (8 weights each) x 4 bytes
    assert body == 8_388_608
    assert quantized_matrix_bytes(awq, 4096, 4096) == body + 32 * 512 * 4 + 32 * 4096 * 2
    assert quantized_matrix_bytes(gptq, 4096, 4096) == body + 32 * 512 * 4 + 32 * 4096 * 2 \
        + 4096 * 4
    # Qwen2.5-7B-Instruct-AWQ: attention and MLP linears int4; embeddings, lm_head, norms and
    # q/k/v biases fp16 (torch_dtype float16).
    assert AWQ.quantization.method == "awq" and AWQ.torch_dtype == "fp16"
    stored = weight_bytes(AWQ, "checkpoint")
    # 5.571 GB; a plausibility range, not a published figure (unsourced: none was found,
    # see test_checkpoint_bytes_match_published_safetensors_sizes)
    assert 5.5e9 < stored < 5.65e9


def test_bitsandbytes_nf4_by_hand() -> None:
    n = 4096 * 4096
    blocks = n // 64
    nf4 = QuantConfig("bitsandbytes", 4, group_size=64, quant_type="nf4")
    dq = QuantConfig("bitsandbytes", 4, group_size=64, quant_type="nf4", double_quant=True)
    assert quantized_matrix_bytes(nf4, 4096, 4096) == n // 2 + 4 * blocks + 16 * 4
    assert quantized_matrix_bytes(dq, 4096, 4096) == (n // 2 + blocks + 4 * (blocks // 256)
                                                       + 256 * 4 + 16 * 4)
    int8 = QuantConfig("bitsandbytes", 8)
    assert quantized_matrix_bytes(int8, 4096, 1024) == 4096 * 1024 + 4 * 4096
    cfg = {**PRESET_HF_CONFIGS["Llama 3.1 8B"][1], "quantization_config": {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True}}
    model = ModelConfig.from_hf_config(cfg)
    # every linear but lm_head is 4-bit; embeddings, lm_head and norms at bf16
    lm_head = 128256 * 4096
    assert quantized_param_count(model) == param_count(model) - 2 * lm_head - 65 * 4096
    # a plausibility range, not a published figure (unsourced: see the published-sizes test)
    assert 5.5e9 < weight_bytes(model, "checkpoint") < 6.0e9


def test_matrices_and_the_rest_add_up_to_param_count() -> None:
    for model in MODELS.values():
        if model.state_mixer is not None:
            with pytest.raises(ValueError, match="hybrid"):
                linear_modules(model)
            continue
        assert sum(m.params for m in linear_modules(model)) + other_params(model) == \
            param_count(model)
        assert other_params(model) >= 0


def test_checkpoint_without_quantization_uses_torch_dtype_or_refuses() -> None:
    llama = MODELS["Llama 3.1 8B"]
    assert weight_bytes(llama, "checkpoint") == 2 * param_count(llama)  # torch_dtype bf16
    gpt2 = MODELS["GPT-2 (124M)"]  # its config names no torch_dtype
    with pytest.raises(ValueError, match="torch_dtype"):
        weight_bytes(gpt2, "checkpoint")


@pytest.mark.parametrize("q, match", [
    ({"quant_method": "compressed-tensors"}, "compressed-tensors.*accepted: mxfp4"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size"),
    ({"quant_method": "gptq", "bits": 3}, "bits' must be 2, 4 or 8"),
    ({"quant_method": "awq", "version": "gemv"}, "GEMM"),
    ({"quant_method": "bitsandbytes"}, "load_in_4bit"),
    ({"quant_method": "mxfp4", "modules_to_not_convert": "lm_head"}, "list of module names"),
])
def test_bad_quantization_configs_are_refused(q: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf_config({**PRESET_HF_CONFIGS["Llama 3.1 8B"][1],
                                    "quantization_config": q})


def test_active_conventions_deepseek_v2_lite() -> None:
    # DeepSeek-V2-Lite card: 2.4B activated, without the input embedding; with it 2.66B.
    lite = MODELS["DeepSeek-V2-Lite (MLA, MoE)"]
    assert 2.4e9 <= active_param_count(lite, include_embedding=False) < 2.5e9
    assert 2.6e9 < active_param_count(lite) < 2.7e9
    with pytest.raises(ValueError, match="include_embedding"):
        active_param_count(lite, include_embedding="no")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- vLLM KV groups ----

def test_gemma3_groups_pad_52_sliding_layers_to_60() -> None:
    gemma = MODELS["Gemma 3 27B (text)"]
    g = kv_cache_groups(gemma)
    assert (g.group_size, g.full_groups, g.sliding_groups, g.padding_layers) == (10, 1, 6, 8)
    layer_page = 16 * 2 * 16 * 128 * 2
    assert page_bytes(gemma, 16, "bf16") == 10 * layer_page
    s, t = 32768, 8192
    sw_blocks = -(-min(1024 - 1 + t, s) // 16) + 1
    assert sequence_bytes(gemma, s, 16, "bf16") == 10 * layer_page * (s // 16 + 6 * sw_blocks)


def test_group_size_rule() -> None:
    # gpt-oss: 12 + 12 (120b 18 + 18): two groups, no padding
    assert kv_cache_groups(OSS20).group_size == 12 and kv_cache_groups(OSS20).groups == 2
    assert kv_cache_groups(OSS120).group_size == 18
    # 12 sliding + 13 full (gpt-oss-20b with an EAGLE layer, kv_cache_utils.py comment):
    # 13 < 1.5 x 12, so groups of 13, one padding layer
    cfg = {**PRESET_HF_CONFIGS["gpt-oss-20b (MoE, MXFP4)"][1], "num_hidden_layers": 25,
           "layer_types": ["sliding_attention", "full_attention"] * 12 + ["full_attention"]}
    g = kv_cache_groups(ModelConfig.from_hf_config(cfg))
    assert (g.group_size, g.groups, g.padding_layers) == (13, 2, 1)
    # uniform models: one group of all layers, as before
    llama = MODELS["Llama 3.1 8B"]
    assert page_bytes(llama, 16, "bf16") == 32 * 16 * 2 * 8 * 128 * 2


# -------------------------------------------------------------------------------- GPUs ----

def test_gpu_torch_totals_are_sourced_or_marked_missing() -> None:
    assert set(GPU_TORCH_TOTAL) == set(GPUS)
    for name, src in GPU_TORCH_TOTAL_SOURCES.items():
        if src is None:
            assert GPU_TORCH_TOTAL[name] is None and torch_total_bytes(name) == GPUS[name]
        else:
            assert src[1] and GPU_TORCH_TOTAL[name] < GPUS[name]
    assert GPU_TORCH_TOTAL["NVIDIA H100 80GB"] == int(Fraction("79.11") * GIB)
    with pytest.raises(ValueError, match="is not one of"):
        torch_total_bytes("NVIDIA H300")
    with pytest.raises(ValueError, match="is not one of"):
        torch_total_note("NVIDIA H300")


def test_h200_torch_total_is_our_measurement() -> None:
    # The lead's H200 run, 2026-12-01 (torch 2.11.0+cu130, driver 580.159.04, as that day's
    # rows of data/inference_steps_h200.csv record): torch.cuda.mem_get_info() total =
    # 150,109,880,320 bytes = 139.801 GiB, 615 MiB under nvidia-smi's 143,771 MiB. The public
    # logs' 139.80 GiB (the figure it replaces) agrees to 0.01 GiB.
    h200 = "NVIDIA H200 141GB"
    assert GPU_TORCH_TOTAL[h200] == torch_total_bytes(h200) == 150_109_880_320
    assert h200 in GPU_TORCH_TOTAL_MEASURED and len(GPU_TORCH_TOTAL_MEASURED) == 1
    assert abs(GPU_TORCH_TOTAL[h200] - Fraction("139.80") * GIB) < Fraction("0.005") * GIB
    assert (GPUS[h200] - GPU_TORCH_TOTAL[h200]) / 2**20 == Fraction("615.0625")
    assert "measured" in torch_total_note(h200) and "2026-12-01" in torch_total_note(h200)
    assert "79.11 GiB" in torch_total_note("NVIDIA H100 80GB")
    assert "spec-sheet figure is used" in torch_total_note("NVIDIA L4 24GB")
    with pytest.raises(ValueError, match="is not one of"):
        torch_total_bytes(None)  # type: ignore[arg-type]


def test_serving_takes_a_gpu_name_and_checkpoint_weights() -> None:
    by_name = serving_capacity(OSS20, "NVIDIA H100 80GB", 32768, weight_dtype="checkpoint")
    by_bytes = serving_capacity(OSS20, torch_total_bytes("NVIDIA H100 80GB"), 32768,
                                weight_dtype="checkpoint")
    assert by_name == by_bytes
    assert by_name.weights_bytes == weight_bytes(OSS20, "checkpoint")
    spec = serving_capacity(OSS20, GPUS["NVIDIA H100 80GB"], 32768, weight_dtype="checkpoint")
    assert spec.num_blocks > by_name.num_blocks  # the spec figure overstates the pool


# ------------------------------------------------------------------ multimodal configs ----

def test_vision_language_configs_read_their_language_model() -> None:
    gemma = json.loads((FIXTURES / "gemma-3-27b-it.json").read_text())
    assert "language model only" in ModelConfig.from_hf_config(gemma).read_as
    mistral3 = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
                "text_config": {**PRESET_HF_CONFIGS["Mistral 7B v0.1"][1],
                                "sliding_window": None},
                "vision_config": {"model_type": "pixtral", "hidden_size": 1024}}
    m = ModelConfig.from_hf_config(mistral3)
    assert m.model_type == "mistral" and "language model only" in m.read_as
    qwen_vl = {**PRESET_HF_CONFIGS["Qwen2.5 7B"][1], "architectures":
               ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
               "vision_config": {"depth": 32, "hidden_size": 1280}}
    q = ModelConfig.from_hf_config(qwen_vl)
    assert q.attention_bias and not q.attention_out_bias  # Qwen2 decoder: q/k/v biases
    assert param_count(q) == param_count(MODELS["Qwen2.5 7B"]) and "qwen2" in q.read_as


def test_llama4_is_refused_with_the_reason() -> None:
    llama4 = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
              "text_config": {**PRESET_HF_CONFIGS["Llama 3.1 8B"][1], "model_type": "llama4_text",
                              "attention_chunk_size": 8192, "interleave_moe_layer_step": 1}}
    with pytest.raises(ValueError, match="chunked local attention"):
        ModelConfig.from_hf_config(llama4)


# ------------------------------------------------------------------- hostile arguments ----

HOSTILE = [None, -1, 0, 1.5, float("nan"), "bf16", "", "x" * 500, [], {}, True, object()]


@pytest.mark.parametrize("bad", HOSTILE)
def test_issue30_functions_refuse_hostile_input(bad: object) -> None:
    import attnmem.calc
    for fn in attnmem.calc.CHECKPOINT_FUNCTIONS:
        with pytest.raises((ValueError, TypeError)):
            fn(bad)
    if not isinstance(bad, bool):
        with pytest.raises((ValueError, TypeError)):
            active_param_count(OSS20, include_embedding=bad)  # type: ignore[arg-type]
    if not isinstance(bad, str) or bad.strip().lower() != "checkpoint":
        with pytest.raises((ValueError, TypeError)):
            serving_capacity(OSS20, bad if isinstance(bad, str) else -1, 1024)


# ----------------------------------------------- checkpoint bytes against published sizes ----

def test_checkpoint_bytes_match_published_safetensors_sizes() -> None:
    """weight_bytes(model, "checkpoint") against the published size of real checkpoints
    (issue 30: within 2%).

    - openai/gpt-oss-20b (Hugging Face Hub), model.safetensors.index.json: metadata.total_size
      = 13,761,264,768 bytes (the index as quoted verbatim in public copies found through the
      code search: {"metadata": {"total_size": 13761264768}, ...}). Ours: exactly that.
    - deepseek-ai/DeepSeek-V3 (Hub, revision afb92e1fa402c2be2a9eb085312bb02e0384d6c7): its
      safetensors weight files hold 688,586,727,753 bytes (as a public model-artifact dataset
      records them; DeepSeek-R1, the same architecture, the same figure). The checkpoint also
      stores the multi-token-prediction module (num_nextn_predict_layers = 1: layer 61, a full
      MLA + MoE decoder layer, with its own embed_tokens and shared_head.head copies of
      129,280 x 7,168 in bf16, eh_proj 7,168 x 14,336 and three norms; DeepSeek's
      README_WEIGHTS.md), which transformers and vLLM do not load for plain decoding, so
      weight_bytes leaves it out (2.24% under the files) and this test adds it: 0.002% under
      (eh_proj counted at bf16; at fp8 with block scales 0.017% under). The remaining ~12 MB
      is of the order of the 163 files' JSON headers.
    - An AWQ int4 checkpoint (Qwen/Qwen2.5-7B-Instruct-AWQ) and a bitsandbytes 4-bit one
      (e.g. unsloth/Meta-Llama-3.1-8B-Instruct-bnb-4bit): no published total size was found
      in the stored reference material (index.json total_size or file sizes), so they are NOT
      checked against a published figure here; their formulas are checked by hand against the
      tensor shapes (test_gptq_awq_int4_by_hand, test_bitsandbytes_nf4_by_hand), and the
      ranges there are the previous session's, not sourced.
    """
    # gpt-oss-20b: exact
    assert weight_bytes(OSS20, "checkpoint") == 13_761_264_768
    # DeepSeek-V3: the main model plus the MTP module the files also hold
    published = 688_586_727_753
    raw = json.loads((FIXTURES / "DeepSeek-V3.json").read_text())
    assert raw["num_nextn_predict_layers"] == 1
    main = weight_bytes(DSV3, "checkpoint")
    assert close(main, published, 0.025) and not close(main, published, 0.02)  # MTP left out
    one_more = ModelConfig.from_hf_config({**raw, "num_hidden_layers": 62})
    mtp_layer = weight_bytes(one_more, "checkpoint") - main  # layer 61: MLA + MoE, fp8
    h, vocab = DSV3.hidden_size, DSV3.vocab_size
    mtp = mtp_layer + 2 * (2 * vocab * h) + 2 * (h * 2 * h) + 3 * 2 * h
    assert close(main + mtp, published, 0.0001)
    assert close(main + mtp, published, 0.02)  # the issue's bound
