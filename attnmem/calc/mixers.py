"""Non-attention sequence mixers of hybrid models: their weights and their per-sequence state.

Hybrid models (Jamba, Nemotron-H, Qwen3-Next) replace most attention layers with a block that
keeps a *constant* state per sequence instead of a KV cache that grows with s. Each function
here returns a `Mixer`: the parameter count of one such block and the elements of the two
states it carries between decode steps, as vLLM allocates them
(vllm/model_executor/layers/mamba/mamba_utils.py, MambaStateShapeCalculator):

- conv state: the last (kernel - 1) inputs of the causal depthwise convolution, per channel;
- recurrent (SSM / delta-rule) state: fixed-size, independent of the sequence length.

Parameter counts follow the module layouts of the `transformers` modeling files named on
each function.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mixer:
    """One non-attention block: what it stores and what it keeps per sequence (elements)."""

    kind: str  # "mamba" (Mamba-1), "mamba2", "gated_deltanet"
    params: int  # weights of one block
    conv_state: int  # elements of the convolution state per sequence
    recurrent_state: int  # elements of the SSM / delta-rule state per sequence

    @property
    def state_elements(self) -> int:
        return self.conv_state + self.recurrent_state


def mamba1(hidden: int, d_inner: int, d_state: int, d_conv: int, dt_rank: int, *,
           conv_bias: bool, proj_bias: bool, inner_norms: bool) -> Mixer:
    """Mamba-1 mixer (Gu & Dao, arXiv 2312.00752), layout of modeling_jamba.py JambaMambaMixer:
    in_proj hidden x 2·d_inner, depthwise conv1d d_inner x d_conv (+ bias), x_proj d_inner x
    (dt_rank + 2·d_state), dt_proj dt_rank x d_inner + bias, A_log d_inner x d_state, D d_inner,
    out_proj d_inner x hidden; Jamba adds RMSNorms of dt (dt_rank), B and C (d_state each).
    State (mamba1_state_shape): conv (d_conv - 1) x d_inner, SSM d_inner x d_state.
    """
    params = hidden * 2 * d_inner + (2 * d_inner if proj_bias else 0)
    params += d_inner * d_conv + (d_inner if conv_bias else 0)
    params += d_inner * (dt_rank + 2 * d_state)
    params += dt_rank * d_inner + d_inner
    params += d_inner * d_state + d_inner
    params += d_inner * hidden + (hidden if proj_bias else 0)
    if inner_norms:
        params += dt_rank + 2 * d_state
    return Mixer("mamba", params, (d_conv - 1) * d_inner, d_inner * d_state)


def mamba2(hidden: int, heads: int, head_dim: int, n_groups: int, d_state: int, d_conv: int, *,
           conv_bias: bool, proj_bias: bool) -> Mixer:
    """Mamba-2 mixer (Dao & Gu, arXiv 2405.21060), layout of modeling_nemotron_h.py
    NemotronHMamba2Mixer: d_inner = heads·head_dim; conv_dim = d_inner + 2·n_groups·d_state;
    in_proj hidden x (d_inner + conv_dim + heads), depthwise conv1d conv_dim x d_conv (+ bias),
    dt_bias, A_log, D (heads each), gated RMSNorm d_inner, out_proj d_inner x hidden.
    State (mamba2_state_shape): conv (d_conv - 1) x conv_dim, SSM heads x head_dim x d_state.
    """
    d_inner = heads * head_dim
    conv_dim = d_inner + 2 * n_groups * d_state
    proj = d_inner + conv_dim + heads
    params = hidden * proj + (proj if proj_bias else 0)
    params += conv_dim * d_conv + (conv_dim if conv_bias else 0)
    params += 3 * heads + d_inner
    params += d_inner * hidden + (hidden if proj_bias else 0)
    return Mixer("mamba2", params, (d_conv - 1) * conv_dim, heads * head_dim * d_state)


def gated_deltanet(hidden: int, k_heads: int, v_heads: int, k_dim: int, v_dim: int,
                   kernel: int) -> Mixer:
    """Gated DeltaNet (Yang et al., arXiv 2412.06464), layout of modeling_qwen3_next.py
    Qwen3NextGatedDeltaNet: key_dim = k_heads·k_dim, value_dim = v_heads·v_dim;
    in_proj_qkvz hidden x (2·key_dim + 2·value_dim), in_proj_ba hidden x 2·v_heads, depthwise
    conv1d (2·key_dim + value_dim) x kernel (no bias), dt_bias and A_log (v_heads each), gated
    RMSNorm v_dim, out_proj value_dim x hidden. State (gated_delta_net_state_shape): conv
    (kernel - 1) x (2·key_dim + value_dim), recurrent v_heads x v_dim x k_dim.
    """
    key_dim, value_dim = k_heads * k_dim, v_heads * v_dim
    conv_dim = 2 * key_dim + value_dim
    params = hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * v_heads
    params += conv_dim * kernel + 2 * v_heads + v_dim + value_dim * hidden
    return Mixer("gated_deltanet", params, (kernel - 1) * conv_dim, v_heads * v_dim * k_dim)
