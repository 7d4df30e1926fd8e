"""The causal LMs transformers builds that the trace once refused (issue 42's refused tail),
each on a tiny config (no download): answered from the real modules where they can run, and
refused with a reason a user can act on where transformers itself cannot run them.

Where a figure can be had independently, the trace is held to it: a real CPU run of the same
tiny model (the cache and state generate() leaves), or the unfolded trace (loops.py)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attnmem.trace.loops as loops  # noqa: E402
from attnmem.trace.generate import trace_inference  # noqa: E402
from attnmem.trace.inference import _cache_bytes, _module_state, record  # noqa: E402
from attnmem.trace.recorder import flat  # noqa: E402


def _d(cfg, arch: str) -> dict:
    d = cfg.to_dict()
    d["architectures"] = [arch]
    return d


def _normal(events) -> list:
    """Events with ids replaced by the order of their allocation (two runs compare equal when
    they make and free the same sizes in the same order)."""
    ids: dict[int, int] = {}
    out = []
    for ev in flat(events):  # folded loops unrolled
        if ev[0] == "a":
            ids[ev[1]] = len(ids)
            out.append(("a", ev[2], ev[3]))
        elif ev[0] == "f":
            out.append(("f", ids.get(ev[1], ("before", ev[1]))))
        else:
            out.append(ev)
    return out


def _folded_and_not(d: dict, s: int, n: int, attention: str, monkeypatch) -> tuple:
    text = json.dumps(d, sort_keys=True)
    folded = record(text, 1, s, n, attention, "bf16")
    monkeypatch.setattr(loops, "FOLD_MIN", 10**9)
    unfolded = record(text, 1, s, n, attention, "bf16")
    return folded, unfolded


def _real_state(model, ids, n: int) -> int:
    """Bytes of what a real generate() of `model` leaves: the cache it returns and the
    tensors the modules hold as state."""
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         min_new_tokens=n, do_sample=False, return_dict_in_generate=True)
    held = 0
    for v in _module_state(model).values():
        for t in v if isinstance(v, (list, tuple)) else [v]:
            held += t.untyped_storage().nbytes()
    return _cache_bytes(out.past_key_values) + held


def _recurrent_gemma():
    return transformers.RecurrentGemmaConfig(
        vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, lru_width=32, attention_window_size=16,
        block_types=["recurrent", "recurrent", "attention"])


@pytest.mark.parametrize("s,n", [(20, 2), (10, 2), (20, 5)])
def test_recurrent_gemma_counts_the_state_its_layers_keep(s, n):
    """RecurrentGemma fills generate()'s cache in place and keeps its recurrent and conv
    states in its layers: the trace counts both, byte for byte what a real run leaves."""
    cfg = _recurrent_gemma()
    t = trace_inference(_d(cfg, "RecurrentGemmaForCausalLM"), 2, s, n, attention="eager")
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.bfloat16, attn_implementation="eager").eval()
    assert t.kv_cache_bytes == _real_state(model, torch.ones(2, s, dtype=torch.long), n)
    # the layers' state is there: 2 recurrent layers, fp32 (B, lru) + bf16 (B, h, conv - 1)
    assert t.kv_cache_bytes > 2 * (2 * 32 * 4 + 2 * 32 * 3 * 2)


def test_recurrent_gemma_scan_is_folded_exactly(monkeypatch):
    """The RG-LRU scan loops over every token in Python on meta: folded, the trace records
    exactly the events of the loop run in full, far faster."""
    d = _d(_recurrent_gemma(), "RecurrentGemmaForCausalLM")
    folded, unfolded = _folded_and_not(d, 300, 4, "eager", monkeypatch)
    assert _normal(folded.events) == _normal(unfolded.events)
    assert folded.cache_bytes == unfolded.cache_bytes


def test_a_bert_style_decoder_fills_the_cache_it_is_given():
    """BERT-style decoders return no cache: generate() keeps the one it passed, filled in
    place. The trace's cache is what a real run's holds."""
    cfg = transformers.BertConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64, is_decoder=True)
    t = trace_inference(_d(cfg, "BertLMHeadModel"), 2, 12, 3, attention="eager")
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.bfloat16, attn_implementation="eager").eval()
    real = _real_state(model, torch.ones(2, 12, dtype=torch.long), 3)
    assert t.kv_cache_bytes == real == 2 * 2 * 2 * 14 * 32 * 2  # K+V, layers, B, s+n-1, h, bf16


def _rwkv():
    return transformers.RwkvConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2,
                                   attention_hidden_size=32, intermediate_size=64,
                                   context_length=4096)


def test_rwkv_carries_its_state_as_generate_does():
    """RWKV returns its recurrent state as `state`, which generate() carries through the
    class's own _update_model_kwargs_for_generation: five (B, h, layers) tensors, the first
    two in the model's dtype, the rest fp32 (modeling_rwkv.py RwkvModel.forward)."""
    b, h, layers = 2, 32, 2
    t = trace_inference(_d(_rwkv(), "RwkvForCausalLM"), b, 20, 3, attention="eager")
    assert t.kv_cache_bytes == b * h * layers * (2 + 2 + 4 + 4 + 4)
    assert t.decode_peak_bytes is not None and t.peak_bytes > t.weights_bytes


def test_rwkv_wkv_loop_is_folded_exactly(monkeypatch):
    folded, unfolded = _folded_and_not(_d(_rwkv(), "RwkvForCausalLM"), 200, 3, "eager",
                                       monkeypatch)
    assert _normal(folded.events) == _normal(unfolded.events)


def test_mamba_scan_keeping_a_list_of_outputs_is_folded_exactly(monkeypatch):
    """Mamba's reference selective scan appends each token's output to a list it stacks
    afterwards: the fold extends the list with tensors of their own, so the stack, and every
    event, are those of the full loop."""
    cfg = transformers.MambaConfig(hidden_size=32, num_hidden_layers=2, vocab_size=101,
                                   pad_token_id=None)
    folded, unfolded = _folded_and_not(_d(cfg, "MambaForCausalLM"), 150, 3, "eager",
                                       monkeypatch)
    assert _normal(folded.events) == _normal(unfolded.events)


def test_a_loop_too_long_to_run_is_refused_by_its_count_naming_it(monkeypatch):
    """A loop that cannot be folded runs in full, unless its projected tensor ops are past the
    limit: then the refusal names the loop, the count, the limit and how many steps the trace
    answers, the same whatever the host's load (counts, not seconds); a prompt that short is
    answered."""
    import attnmem.trace.inference as inference

    monkeypatch.setattr(loops, "_check", lambda events, bounds: ("forced for the test", set()))
    monkeypatch.setattr(inference, "LIMITS", loops.Limits(ops=3_000, steps=10**9))
    d = _d(transformers.MambaConfig(hidden_size=32, num_hidden_layers=2, vocab_size=101,
                                    pad_token_id=None), "MambaForCausalLM")
    said = []
    for _ in range(2):
        with pytest.raises(ValueError, match=r"a Python loop of 4,000 steps .*modeling_mamba"
                                             r"\.py.* 2 MambaMixer modules cannot be folded "
                                             r"\(forced for the test\).* tensor ops .*past the "
                                             r"3,000 a trace may run here.*answers such "
                                             r"loops up to about ([0-9,]+) steps") as e:
            trace_inference(d, 1, 4000, 1, attention="eager")
        said.append(str(e.value))
    assert said[0] == said[1]
    steps = int(said[0].rsplit("up to about ", 1)[1].split()[0].replace(",", ""))
    assert 64 < steps < 4000
    assert trace_inference(d, 1, steps // 2, 1, attention="eager").peak_bytes > 0


def _xlnet():
    return transformers.XLNetConfig(vocab_size=101, d_model=32, n_layer=2, n_head=4,
                                    d_inner=64)


def test_xlnet_runs_in_fp32_and_says_why_not_in_bf16():
    """XLNet's attention parameters are `torch.FloatTensor`s: fp32 whatever dtype is asked,
    and its forward fails mixing them with bf16 activations (on a GPU too). In fp32 it runs,
    through its own generation hooks (a dummy token, `mems`)."""
    d = _d(_xlnet(), "XLNetLMHeadModel")
    t = trace_inference(d, 1, 16, 3, attention="eager", dtype="fp32")
    assert t.kv_cache_bytes > 0 and t.peak_bytes > t.weights_bytes
    with pytest.raises(ValueError, match=r"in another dtype than the bfloat16 asked .*"
                                         r"run it in fp32"):
        trace_inference(d, 1, 16, 3, attention="eager", dtype="bf16")


def test_a_config_without_an_attention_layer_says_transformers_cannot_run_it():
    """Bamba's class default has no attention layer; transformers' generate() fails on such a
    model (its mask code asks an attention layer for sizes), so the refusal says that."""
    cfg = transformers.BambaConfig(vocab_size=101, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, mamba_n_heads=8, mamba_d_head=16,
                                   mamba_d_state=16, mamba_n_groups=1)
    with pytest.raises(ValueError, match="without an attention layer"):
        trace_inference(_d(cfg, "BambaForCausalLM"), 1, 16, 1)
    cfg.attn_layer_indices = [1]
    assert trace_inference(_d(cfg, "BambaForCausalLM"), 1, 16, 2).kv_cache_bytes > 0


def test_router_counts_copied_to_the_host_are_split_evenly_with_their_exact_total():
    """JetMoE splits its tokens by `expert_size.tolist()`: counts of a one-hot scatter at topk
    indices, whose total (tokens x top_k) is known on meta though the split is not. The copy
    to the host gives the even split of that total; a vector of unknown total still raises."""
    from attnmem.trace.recorder import Recorder

    with Recorder():
        logits = torch.zeros(10, 4, device="meta").exp()  # values unknown
        _, idx = logits.topk(2, dim=1)
        gates = torch.zeros(10, 4, device="meta").scatter(1, idx, 1)
        counts = gates.long().sum(0)
        assert counts.tolist() == [5, 5, 5, 5] and counts.sum().item() == 20
        odd = torch.zeros(7, 3, device="meta").scatter(1, logits[:7, :3].topk(1, 1)[1], 1)
        assert odd.long().sum(0).tolist() == [3, 2, 2]
        with pytest.raises((RuntimeError, NotImplementedError), match="meta"):
            logits.long().sum(0).tolist()  # no known total
        with pytest.raises((RuntimeError, NotImplementedError), match="meta"):  # not topk's:
            torch.zeros(10, 4, device="meta").scatter(1, idx.clone() * 0, 1).sum(0).tolist()


def test_jetmoe_is_traced_and_caches_what_a_real_run_caches():
    cfg = transformers.JetMoeConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2,
                                    num_key_value_heads=2, kv_channels=8, intermediate_size=32,
                                    num_local_experts=4, num_experts_per_tok=2)
    t = trace_inference(_d(cfg, "JetMoeForCausalLM"), 2, 12, 3, attention="eager")
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.bfloat16, attn_implementation="eager").eval()
    assert t.kv_cache_bytes == _real_state(model, torch.ones(2, 12, dtype=torch.long), 3)
    assert t.peak_bytes > t.weights_bytes + t.kv_cache_bytes


def test_boolean_mask_indexing_with_a_known_mask_runs_on_meta():
    """x[mask] needs nonzero(), which meta cannot run; where the mask's value is known (one
    value everywhere) the selection is all rows or none, and CUDA's int64 nonzero result is
    held while the op runs."""
    from attnmem.trace.recorder import Recorder, replay

    with Recorder() as rec:
        x = torch.empty(2, 5, 8, device="meta")
        rec.mark("all")
        y = x[torch.full((2, 5), 3, device="meta") == 3]
        rec.mark("none")
        z = x[torch.full((2, 5), 3, device="meta") == 4]
        assert y.shape == (10, 8) and z.shape == (0, 8)
        with pytest.raises(NotImplementedError, match="nonzero"):
            x[torch.empty(2, 5, device="meta") > 0]  # values unknown: still refused
    sizes = [ev[2] for ev in rec.events if ev[0] == "a"]
    assert 10 * 2 * 8 in sizes  # the nonzero result: 10 positions, 2 dims, int64
    assert replay(rec.events)["all"].peak >= 10 * 8 * 4 + 10 * 2 * 8


def test_xmod_runs_with_a_language_adapter():
    """X-MOD refuses input without a language; every adapter has the same shapes, so the
    trace runs the first; its language mask is known, so its masked indexing runs."""
    cfg = transformers.XmodConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64, is_decoder=True,
                                  languages=("en_XX", "de_DE"))
    t = trace_inference(_d(cfg, "XmodForCausalLM"), 2, 12, 3, attention="eager")
    assert t.kv_cache_bytes == 2 * 2 * 2 * 14 * 32 * 2  # K+V, layers, B, s+n-1, h, bf16


def test_what_transformers_generate_cannot_run_is_refused_saying_so():
    """Blenderbot's causal LM has decoder_layers of its own, but generate() sizes its cache by
    num_hidden_layers (the encoder's): a real run fails as the trace says it does."""
    cfg = transformers.BlenderbotConfig(vocab_size=101, d_model=32, encoder_layers=1,
                                        decoder_layers=2, encoder_attention_heads=4,
                                        decoder_attention_heads=4, encoder_ffn_dim=64,
                                        decoder_ffn_dim=64)
    with pytest.raises(ValueError, match=r"makes a cache of 1 layers .* layers count to 2, so "
                                         r"generate\(\) fails the same way"):
        trace_inference(_d(cfg, "BlenderbotForCausalLM"), 1, 8, 2, attention="eager")
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(IndexError):
        model.generate(torch.ones(1, 8, dtype=torch.long), max_new_tokens=2, do_sample=False)


def _xlstm():
    return transformers.xLSTMConfig(vocab_size=101, hidden_size=64, embedding_dim=64,
                                    num_heads=4, num_blocks=2, num_hidden_layers=2,
                                    qk_dim_factor=1.0, v_dim_factor=1.0, chunk_size=16)


def test_xlstm_caches_what_a_real_run_caches():
    """xLSTM makes its own cache (generate() gives it none) and returns it: its recurrent
    state, the same bytes as a real run's whatever the length."""
    cfg = _xlstm()
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    for s, n in ((40, 2), (100, 3)):
        t = trace_inference(_d(cfg, "xLSTMForCausalLM"), 2, s, n, attention="eager")
        assert t.kv_cache_bytes == _real_state(model, torch.ones(2, s, dtype=torch.long), n)


def test_xlstm_chunk_loop_is_folded_exactly(monkeypatch):
    """xLSTM's chunkwise form loops over chunks of 16 here: 1,100 tokens are 69 chunks."""
    folded, unfolded = _folded_and_not(_d(_xlstm(), "xLSTMForCausalLM"), 1100, 3, "eager",
                                       monkeypatch)
    assert _normal(folded.events) == _normal(unfolded.events)


def test_serving_refuses_a_state_outside_the_cache_saying_where_it_is():
    """vLLM's layout is read from transformers' cache layers: a model whose state is in its
    layers (RecurrentGemma) or under its own name (RWKV) has none to read, and says so."""
    from attnmem.trace.serving import traced_serving

    with pytest.raises(ValueError, match="keeps part of its decoding state in its layers"):
        traced_serving(_d(_recurrent_gemma(), "RecurrentGemmaForCausalLM"), "NVIDIA H100 80GB",
                       4096)
    with pytest.raises(ValueError, match="under a name of its own"):
        traced_serving(_d(_rwkv(), "RwkvForCausalLM"), "NVIDIA H100 80GB", 4096)


def test_experts_held_as_one_tensor_are_not_refused_by_their_count(monkeypatch):
    """Doge's 16,384 experts are two embeddings, not modules: the size guard counts modules as
    the model is built, not experts in the config, and stops a build past its limit."""
    import attnmem.trace.weights as weights

    cfg = transformers.DogeConfig(vocab_size=101, hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, num_experts=16384,
                                  num_experts_per_tok=4, is_moe=True)
    d = _d(cfg, "DogeForCausalLM")
    assert trace_inference(d, 1, 16, 2, attention="eager").peak_bytes > 0
    monkeypatch.setattr(weights, "MAX_MODULES", 20)
    with pytest.raises(ValueError, match=r"more than 20 modules"):
        weights.build_meta(d)


def _kolibri(**kw):
    """Kolibri-1.1 cut small: layers 4 and 9 are indexed (every fifth), 4 an indexer; the
    budgets are small so that a 60-token prompt has rows past them (pool 32, top-k 8 + 4 local
    + 2 sink)."""
    base = dict(vocab_size=101, hidden_size=64, num_hidden_layers=10, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, intermediate_size=64,
                moe_intermediate_size=32, shared_expert_intermediate_size=32,
                mlp_only_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                index_topk=8, index_pool_size=32, index_compression=4,
                index_num_local_tokens=4, index_num_sink_tokens=2, index_num_heads=2,
                sliding_window=16, mlp_only_layers=[0])
    base.update(kw)
    return transformers.Kolibri1_1Config(**base)


class _Shapes(torch.utils._python_dispatch.TorchDispatchMode):
    """Every op's name and output shapes, in order, leaving out copies between devices (a
    real run's `torch.tensor([])`, meta's `.tolist()`)."""

    def __init__(self):
        super().__init__()
        self.log = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func)
        if "lift_fresh" not in name and "_to_copy" not in name:
            outs = out if isinstance(out, (tuple, list)) else [out]
            self.log.append((name, [tuple(o.shape) for o in outs
                                    if isinstance(o, torch.Tensor)]))
        return out


@pytest.mark.parametrize("s", [12, 60])
def test_kolibri_indexer_reads_the_values_a_real_run_reads(s):
    """Kolibri-1.1's indexer groups its queries by their first visible key (`unique`,
    `nonzero`) and keeps the rows past its budget (`rows[long_rows]`), all read from the causal
    mask. On meta those values are computed from the aranges the mask is made of
    (attnmem.trace.known): every op of a prefill and a decode step makes tensors of exactly the
    shapes a real CPU run of the same model makes, the data-dependent ones included."""
    from attnmem.trace.recorder import Recorder

    cfg = _kolibri()
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.bfloat16, attn_implementation="eager").eval()
    model.set_experts_implementation("grouped_mm")  # the trace's, as CUDA runs the experts

    def run(m, ids, log):
        cache = transformers.DynamicCache(config=cfg)
        with log:
            m(input_ids=ids, cache=cache, use_cache=True)
            m(input_ids=ids[:, :1], cache=cache, use_cache=True)

    real = _Shapes()
    with torch.no_grad():
        run(model, torch.randint(0, 101, (2, s)), real)
    meta = _Shapes()
    with torch.no_grad(), Recorder(values=True):
        run(model.to("meta"), torch.zeros(2, s, dtype=torch.long, device="meta"), meta)
    ops = {name for name, _ in real.log}
    assert {"aten._unique2.default", "aten.nonzero.default"} <= ops
    assert meta.log == real.log


def test_kolibri_is_traced_and_caches_what_a_real_run_caches():
    cfg = _kolibri()
    d = _d(cfg, "Kolibri1_1ForCausalLM")
    for s, n in ((60, 3), (12, 2)):
        t = trace_inference(d, 2, s, n, attention="eager")
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=torch.bfloat16, attn_implementation="eager").eval()
        assert t.kv_cache_bytes == _real_state(model, torch.ones(2, s, dtype=torch.long), n)
        assert t.peak_bytes > t.weights_bytes + t.kv_cache_bytes


def test_values_too_large_to_compute_are_refused_saying_so(monkeypatch):
    import attnmem.trace.known as known

    monkeypatch.setattr(known, "MAX_BYTES", 2 * 60 * 60 * 4 - 1)  # the mask as int32
    with pytest.raises(ValueError, match=r"reads values computed from a tensor of 28,800 bytes"
                                         r".*up to 28,799 bytes a tensor; a shorter prompt"):
        trace_inference(_d(_kolibri(), "Kolibri1_1ForCausalLM"), 2, 60, 1, attention="eager")


def test_xlm_counts_its_tokens_and_caches_what_a_real_run_caches():
    """XLM's forward asserts `lengths.max().item() <= slen`, lengths counted from the ids its
    prepare_inputs_for_generation makes (`torch.cat` of the ids and a mask token): the trace's
    tokens are known (its prompt, and each generated token taken to be the same), so the count
    is read; the cache is what a real run of random ids leaves."""
    cfg = transformers.XLMConfig(vocab_size=101, emb_dim=32, n_layers=2, n_heads=4)
    d = _d(cfg, "XLMWithLMHeadModel")
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.bfloat16, attn_implementation="eager").eval()
    for s, n in ((12, 3), (20, 1), (9, 5)):
        t = trace_inference(d, 2, s, n, attention="eager")
        ids = torch.randint(0, 101, (2, s))
        assert t.kv_cache_bytes == _real_state(model, ids, n)


def test_known_values_follow_cuda_allocations_and_forget_writes():
    """nonzero and unique run on meta where their input's values are known, with the storages
    their CUDA kernels allocate (Nonzero.cu: one int64 (k, ndim); UniqueCub.cu: the sorted
    copy, an output of the input's size resized down, the empty inverse and counts, the
    one-int64 length); values read after a write in place, or from weights, still raise."""
    from attnmem.trace.recorder import Recorder

    rec = Recorder(values=True)
    with rec:
        mask = torch.arange(6, device="meta")[:, None] >= torch.arange(6, device="meta")
        starts = mask.int().argmax(-1)  # (6,): all 0
        assert starts.unique().tolist() == [0]
        rec.mark("nonzero")
        rows = (mask.sum(-1) > 4).nonzero()  # rows 4 and 5 see 5 and 6 keys
        assert rows.shape == (2, 1) and rows[:, 0].tolist() == [4, 5]
        assert mask[mask.sum(-1) > 5].shape == (1, 6)
        mask.fill_(True)  # uniform again: known
        assert mask.all().item() is True
        mask[0, 0] = False  # written in place: no longer known
        with pytest.raises(RuntimeError, match="meta"):
            mask.sum().item()
        w = torch.empty(4, device="meta")
        with pytest.raises(RuntimeError, match="meta"):
            (w > 0).any().item()
    sizes = [ev[2] for ev in rec.events if ev[0] == "a"]
    i = sizes.index(6 * 6 * 4)  # mask.int()
    # argmax (6 int64), then unique: sorted 6 int64, empty inverse, data_out 6 int64, empty
    # counts, length 1 int64
    assert sizes[i + 1:i + 7] == [48, 48, 0, 48, 0, 8]
    # the sum, the comparison, then nonzero's (2, 1) int64
    assert sizes[sizes.index(2 * 8, i + 7)] == 16


def _xlnet_generate(model):
    ids = torch.ones(1, 8, dtype=torch.long)
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2,
                          do_sample=False)


def test_xlnet_runs_in_bf16_neither_as_built_nor_cast():
    """A real CPU run: XLNet built with dtype=bfloat16 keeps its `torch.FloatTensor`
    parameters in fp32 and fails; cast whole with `.to(torch.bfloat16)` it fails too, in the
    two-stream attention generate() runs (the fp32 relative position encoding against the
    bf16 `r`). The trace's refusal says both."""
    cfg = _xlnet()
    built = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    assert {p.dtype for p in built.parameters()} == {torch.bfloat16, torch.float32}
    with pytest.raises(RuntimeError, match="dtype|scalar type"):
        _xlnet_generate(built)
    cast = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).eval()
    with pytest.raises(RuntimeError, match="dtype|scalar type"):
        _xlnet_generate(cast)
    with pytest.raises(ValueError, match=r"cast whole \(model\.to\(torch\.bfloat16\)\), as a "
                                         r"user would, it fails too .*run it in fp32"):
        trace_inference(_d(cfg, "XLNetLMHeadModel"), 1, 16, 3, attention="eager",
                        dtype="bf16")


def test_gemma3n_without_timm_is_refused_naming_timm():
    """Gemma-3n's causal LM is the multimodal model, whose vision tower is timm's: where timm
    is not installed transformers cannot build it, and the refusal names timm."""
    import importlib.util

    if importlib.util.find_spec("timm") is not None:
        pytest.skip("timm is installed: transformers builds Gemma-3n")
    d = _d(transformers.Gemma3nConfig(), "Gemma3nForConditionalGeneration")
    with pytest.raises(ValueError, match=r"cannot build a causal LM .*requires the timm "
                                         r"library"):
        trace_inference(d, 1, 16, 1)
