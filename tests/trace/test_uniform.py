"""attnmem.trace.uniform: `.item()` on the meta device answers exactly where the value is known,
and still raises where it is not."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnmem.trace.recorder import Recorder  # noqa: E402


def _meta(*shape, dtype=torch.long):
    return torch.ones(*shape, device="meta", dtype=dtype)


def test_values_followed_through_masks_ops():
    with Recorder():
        m = _meta(2, 5)
        assert bool(m.sum() == m.numel()) is True  # masking_utils.fast_all
        assert m[:, :3].bool().all().item() is True
        assert (~m[:, 3:].bool()).all().item() is False
        assert m.to(torch.float32).mean().item() == 1.0
        assert torch.zeros(3, device="meta").sum().item() == 0.0
        assert torch.full((2, 2), 7, device="meta").sum(dim=0)[0].item() == 14
        idx = torch.arange(3, device="meta")  # values unknown, but a uniform tensor's gather
        assert m[:, idx].all().item() is True  # is uniform whatever the indices


def test_unknown_values_still_raise():
    with Recorder():
        m = _meta(2, 5)
        with pytest.raises(RuntimeError, match="meta"):
            m.cumsum(-1)[0, -1].item()  # not uniform
        with pytest.raises(RuntimeError, match="meta"):
            torch.arange(4, device="meta").sum().item()
        v = m[0]
        v.add_(torch.arange(5, device="meta"))  # written in place: the base forgets too
        with pytest.raises(RuntimeError, match="meta"):
            m.all().item()
        with pytest.raises(RuntimeError, match="meta"):
            v.all().item()
        m.fill_(0)  # a fill makes it known again
        assert m.any().item() is False


class _Items(torch.utils._python_dispatch.TorchDispatchMode):
    """The values every `.item()` returns in a real run."""

    def __init__(self):
        super().__init__()
        self.values = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._local_scalar_dense.default:
            self.values.append(out)
        return out


class _MetaItems(Recorder):
    def __init__(self):
        super().__init__()
        self.values = []
        real = self.uniform.scalar

        def scalar(func, args):
            v = real(func, args)
            if v is not None:
                self.values.append(v)
            return v

        self.uniform.scalar = scalar


@pytest.mark.parametrize("model_type", ["biogpt", "bart"])
def test_meta_items_equal_a_real_runs(model_type):
    """A model that builds its own all-ones mask and reads it (`fast_all`) gets, on meta, the
    very values a CPU run of the same forward reads."""
    from transformers import AutoConfig, AutoModelForCausalLM

    small = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, d_model=32, decoder_layers=2, decoder_attention_heads=4,
                 decoder_ffn_dim=64, encoder_layers=2, encoder_attention_heads=4,
                 encoder_ffn_dim=64, max_position_embeddings=64)
    cfg = AutoConfig.for_model(model_type, **small)
    cfg._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, 101, (2, 9))
    real = _Items()
    with torch.no_grad(), real:
        model(input_ids=ids, use_cache=True)
    assert real.values, "the model reads no value: nothing to check"
    meta_model = model.to("meta")
    rec = _MetaItems()
    with torch.no_grad(), rec:
        meta_model(input_ids=ids.to("meta"), use_cache=True)
    assert [bool(v) if isinstance(v, bool) else v for v in rec.values] == real.values


def test_a_bert_style_decoder_is_traced():
    """BertLMHeadModel makes its position ids from a buffer (values unknown on meta) and its
    mask from ones: the packed-rows check answers None for the trace's whole rows, the mask
    check from the known ones, and the cache holds K and V of every layer."""
    from transformers import BertConfig

    from attnmem.trace.generate import trace_inference

    d = BertConfig(vocab_size=101, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=128, is_decoder=True).to_dict()
    d["architectures"] = ["BertLMHeadModel"]
    t = trace_inference(d, 2, 40, 1, attention="sdpa", dtype="bf16")
    assert t.model_class == "BertLMHeadModel"
    assert t.kv_cache_bytes == 2 * 2 * 2 * 40 * 64 * 2  # K+V, layers, B, s, hidden, bf16
