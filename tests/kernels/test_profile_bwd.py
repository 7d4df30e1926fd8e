"""kernels.bench.profile_bwd: its shape argument, and its refusal without a GPU."""

from __future__ import annotations

import argparse

import pytest

from kernels.bench import profile_bwd as pb


def test_parses_a_shape() -> None:
    assert pb.parse("32/8/4096/128/1") == (32, 8, 4096, 128, True)


@pytest.mark.parametrize("bad", ["32/8/4096/128", "32/8/4096/96/0", "32/5/4096/128/0",
                                 "32/8/4096/128/2", "32/8/x/128/0", "0/1/4096/64/0"])
def test_refuses_bad_shapes_naming_them(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="shape"):
        pb.parse(bad)


def test_refuses_to_run_without_a_gpu(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        pb.main(["32/32/4096/128/0"])
