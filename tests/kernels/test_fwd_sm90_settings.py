"""The A/B tool of the Hopper (Gluon) forward (kernels.bench.ab_fwd): its settings are
keywords of `fwd_sm90.attention_forward_sm90`, its arguments parse and refuse, and it refuses
to run without a GPU. (EXP2_EMU, the setting this file first tested, measured slower on the
H200 and is gone: kernels/flash/NOTES.md, "DQ_FLAT kept, the others deleted".)
"""

from __future__ import annotations

import argparse
import inspect

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def _k90():
    try:
        from kernels.flash import fwd_sm90
    except Exception as e:  # Triton without Gluon's Hopper API
        pytest.skip(f"kernels.flash.fwd_sm90 does not import here: {type(e).__name__}: {e}")
    return fwd_sm90


def test_ab_fwd_arguments():
    from kernels.bench import ab_fwd

    k90 = _k90()
    assert set(ab_fwd.SETTINGS) <= set(inspect.signature(k90.attention_forward_sm90).parameters)
    args = ab_fwd.parse_args(["--variant", "e:consumers=2,stages=3"])
    assert args.variant == [("e", {"consumers": 2, "stages": 3})]
    assert args.shapes[0] == (1, 32, 32, 8192, 64, True) and args.rounds == 3
    for bad in ("1/32/32/8192/96/1", "1/32/5/8192/64/1", "x/1/1/1/64/0", "1/1/1/1/64"):
        with pytest.raises(argparse.ArgumentTypeError, match="shape"):
            ab_fwd.parse_shape(bad)
    for gone in ("e:block_m=64", "e:exp2_emu=1"):  # not a forward setting (any more)
        with pytest.raises(SystemExit):
            ab_fwd.parse_args(["--variant", gone])
    with pytest.raises(SystemExit):
        ab_fwd.parse_args([])


def test_ab_fwd_refuses_to_run_without_a_gpu(monkeypatch):
    from kernels.bench import ab_fwd

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        ab_fwd.main(["--variant", "e:stages=3"])
