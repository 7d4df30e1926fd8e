"""Parameter counts of a decoder-only transformer.

The count adds up the weight matrices that the Hugging Face `transformers` modeling code
creates for each architecture (modeling_llama.py and the files derived from it, modeling_gpt2.py):

- token embedding: vocab x hidden; the output projection (lm_head) is another vocab x hidden
  unless tied to it (Press & Wolf, "Using the Output Embedding to Improve Language Models",
  arXiv 1608.05859); GPT-2 adds a learned position table of n_positions x hidden.
- attention (Vaswani et al., arXiv 1706.03762, sec. 3.2.2, with grouped-query K/V of Ainslie
  et al., arXiv 2305.13245): q hidden x H·d, k and v hidden x H_kv·d each, o H·d x hidden;
  plus biases where the architecture has them, plus the q/k RMSNorm weights (d each) of Qwen3
  and Gemma 3.
- MLP: gated (SwiGLU/GeGLU, Shazeer arXiv 2002.05202; Llama, arXiv 2302.13971) has gate and up
  (hidden x I) and down (I x hidden): 3·hidden·I; non-gated (GPT-2) 2·hidden·I.
- mixture of experts (Mixtral, arXiv 2401.04088): every expert is a full MLP of width I, plus a
  router hidden x E; Qwen2-MoE adds a shared expert and its hidden x 1 gate.
- norms: one weight vector of width hidden per norm (RMSNorm, Zhang & Sennrich arXiv
  1910.07467), a second one (bias) for LayerNorm; 2 per block (Gemma 2/3: 4) plus a final norm.
- multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, sec. 2.1; modeling_deepseek_v3.py
  DeepseekV3Attention): q_a hidden x q_lora, its RMSNorm, q_b q_lora x H·(nope + rope) (or a
  direct q hidden x H·(nope + rope) when q_lora_rank is null), kv_a hidden x (kv_lora + rope),
  its RMSNorm, kv_b kv_lora x H·(nope + v), o H·v x hidden. DeepSeek's shared experts are
  plain MLPs of n_shared x moe_intermediate_size, without the Qwen sigmoid gate.
- gated attention (Qwen3-Next, modeling_qwen3_next.py): q_proj is 2·H·d wide (query + gate).
- gpt-oss (modeling_gpt_oss.py): biases on q, k, v and o; one learned sink logit per query
  head per layer (GptOssAttention.sinks); a router of hidden x E with an E bias
  (GptOssTopKRouter); experts stored fused, gate_up_proj [E, hidden, 2·I] with a 2·I bias and
  down_proj [E, I, hidden] with a hidden bias (GptOssExperts): the gated count with biases.
- hybrids: only `attention_layers` layers have attention, `mlp_layers` an MLP; the
  `state_layers` others hold the mixer that attnmem/calc/mixers.py counts (Mamba, Mamba-2, Gated
  DeltaNet).

Counts are exact integers; attnmem/calc/weights.py turns them into bytes (the count times the
bytes per parameter, or the checkpoint's storage through attnmem/calc/quant.py).
"""

from __future__ import annotations

from attnmem.calc.models import ModelConfig, check_model
from attnmem.calc.units import check_int

#: Upper bound of the experts argument for dense models (where it is ignored).
MAX_EXPERTS_ARG = 1_000_000


def _mlp_params(model: ModelConfig, width: int) -> int:
    """One MLP (or one expert) of inner width `width`: matrices plus biases when set."""
    matrices = 3 if model.gated_mlp else 2
    params = matrices * model.hidden_size * width
    if model.mlp_bias:  # one bias per output: gate and up (or fc) of width, down of hidden
        params += (matrices - 1) * width + model.hidden_size
    return params


def _mla_params(model: ModelConfig) -> int:
    """One multi-head latent attention block (layout in the module docstring)."""
    h, heads, d_qk = model.hidden_size, model.num_heads, model.head_dim
    nope = d_qk - model.qk_rope_head_dim
    bias = model.attention_bias  # DeepseekV3Config.attention_bias: q_a, kv_a and o
    if model.q_lora_rank:
        q = h * model.q_lora_rank + model.q_lora_rank + model.q_lora_rank * heads * d_qk
        q += model.q_lora_rank if bias else 0
    else:
        q = h * heads * d_qk
    kv = h * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank
    kv += (model.kv_lora_rank + model.qk_rope_head_dim) if bias else 0
    kv += model.kv_lora_rank * heads * (nope + model.v_head_dim)
    out = heads * model.v_head_dim * h + (h if bias else 0)
    return q + kv + out


def _attention_params(model: ModelConfig) -> int:
    """One attention block: q, k, v, o projections, their biases and q/k norms."""
    if model.is_mla:
        return _mla_params(model)
    h, d = model.hidden_size, model.head_dim
    q_width, kv_width = model.num_heads * d, model.num_kv_heads * d
    params = h * q_width + 2 * h * kv_width + q_width * h  # q, k, v, o
    if model.attention_output_gate:  # q_proj emits query and gate: another H·d outputs
        params += h * q_width
    if model.attention_bias:
        params += q_width + 2 * kv_width
    if model.attention_out_bias:
        params += h
    if model.qk_norm:
        params += 2 * d
    if model.attention_sinks:  # gpt-oss: one learned logit per query head
        params += model.num_heads
    return params


def _norm_params(model: ModelConfig) -> int:
    """One norm: weight (and bias for LayerNorm) of width hidden."""
    return model.hidden_size * (2 if model.norm_bias else 1)


def _moe_mlp_params(model: ModelConfig, experts: int) -> int:
    """The MLP of one MoE layer counting `experts` experts, the router and the shared expert."""
    params = experts * _mlp_params(model, model.intermediate_size)
    params += model.hidden_size * model.num_experts  # router
    if model.router_bias:  # gpt-oss: GptOssTopKRouter.bias
        params += model.num_experts
    if model.shared_expert_intermediate_size:
        params += _mlp_params(model, model.shared_expert_intermediate_size)
        if model.shared_expert_gate:
            params += model.hidden_size  # shared-expert gate: hidden x 1
    return params


def param_breakdown(model: ModelConfig, experts: int | None = None) -> dict[str, int]:
    """Parameters by part: embeddings, lm_head, positions, attention, mlp, norms (counts).

    `experts` counts that many experts per MoE layer (default: all of them, i.e. stored
    weights); pass `model.experts_per_token` for the parameters one token uses.
    """
    check_model(model)
    if experts is not None:  # ignored by dense models; at most the experts a MoE layer has
        experts = check_int("experts", experts, 1, max(model.num_experts, MAX_EXPERTS_ARG))
    layers = model.num_layers
    mlp_layers = layers if model.mlp_layers is None else model.mlp_layers
    if model.num_experts > 1:
        moe_layers = mlp_layers - model.dense_mlp_layers
        mlp = moe_layers * _moe_mlp_params(model, experts or model.num_experts)
        mlp += model.dense_mlp_layers * _mlp_params(model, model.dense_intermediate_size)
    else:
        mlp = mlp_layers * _mlp_params(model, model.intermediate_size)
    embed = model.vocab_size * model.hidden_size
    parts = {
        "embeddings": embed,
        "lm_head": 0 if model.tie_embeddings else embed,
        "positions": model.learned_positions * model.hidden_size,
        "attention": model.kv_layers * _attention_params(model),
        "mlp": mlp,
        "norms": (layers * model.norms_per_layer + 1) * _norm_params(model),
    }
    if model.state_mixer is not None:  # hybrids: the non-attention mixers (attnmem/calc/mixers.py)
        parts["state mixers"] = model.state_layers * model.state_mixer.params
    return parts


def param_count(model: ModelConfig) -> int:
    """Total stored parameters (a count, not bytes), all MoE experts included.

    Sum of the parts listed in this module's docstring; matches the published counts of the
    presets within 0.5% (tests/calc/test_model_configs.py lists them with their sources).
    """
    return sum(param_breakdown(model).values())


#: The two conventions of "active parameters", for labels: model cards differ on whether the
#: input embedding (a table lookup, no multiply per token) counts. Mixtral's 12.9B counts it;
#: DeepSeek-V2/V3's "activated" figures and the gpt-oss card (arXiv 2508.10925, Table 1:
#: 3.61B / 5.13B) leave it out and count the unembedding (lm_head).
ACTIVE_CONVENTIONS: dict[bool, str] = {
    True: "active parameters, input embedding included (Mixtral card convention)",
    False: "active parameters, input embedding excluded (DeepSeek, gpt-oss card convention)",
}


def active_param_count(model: ModelConfig, include_embedding: bool = True) -> int:
    """Parameters used per token: as param_count, but only experts_per_token experts per MoE
    layer (router, shared expert, attention and lm_head in full). Equals param_count for a dense
    model when the embedding is included.

    include_embedding=True (the default, unchanged) counts the input embedding table, as the
    Mixtral card's 12.9B does; False leaves it out, as the DeepSeek and gpt-oss cards do (the
    lm_head counts either way; with tied embeddings the shared table counts once, as lm_head).
    ACTIVE_CONVENTIONS names both for labels.
    """
    check_model(model)
    if not isinstance(include_embedding, bool):
        raise ValueError(f"include_embedding must be true or false, got {include_embedding!r:.40}")
    if model.num_experts <= 1:
        parts = param_breakdown(model)
    else:
        parts = param_breakdown(model, experts=model.experts_per_token)
    total = sum(parts.values())
    if not include_embedding and not model.tie_embeddings:
        total -= parts["embeddings"]
    return total


#: weight_bytes' argument for "as the checkpoint stores it" (attnmem/calc/weights.py).
CHECKPOINT = "checkpoint"
