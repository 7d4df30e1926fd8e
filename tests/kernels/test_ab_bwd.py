"""kernels.bench.ab_bwd: its variant and shape arguments, loading the kernel file of another
commit, the summary's ratios, and its refusal without a GPU."""

from __future__ import annotations

import argparse
import math

import pytest

from kernels.bench import ab_bwd as ab


def test_parses_a_variant() -> None:
    assert ab.parse_variant("e:key_major=1,stages=3") == ("e", {"key_major": 1, "stages": 3})


@pytest.mark.parametrize("bad, says", [
    ("stages=3", "NAME:KEY=VAL"),  # no name
    ("e:", "NAME:KEY=VAL"),
    ("e:foo=1", "unknown setting 'foo'"),
    ("e:stages=9", "stages='9'"),
    ("e:key_major=yes", "key_major='yes'"),
    ("e:block_m", "block_m=''"),
    ("base:stages=3", "taken"),
    ("fa4:stages=3", "taken"),
])
def test_refuses_bad_variants_naming_them(bad: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        ab.parse_variant(bad)


def test_every_setting_is_a_keyword_of_the_backward() -> None:
    """A variant's keys go to attention_backward_sm90 as keywords: each must be one."""
    import inspect

    b90 = pytest.importorskip("kernels.flash.bwd_sm90")
    params = inspect.signature(b90.attention_backward_sm90).parameters
    assert set(ab.SETTINGS) <= set(params)


def test_needs_something_to_compare() -> None:
    with pytest.raises(SystemExit) as e:
        ab.parse_args([])
    assert e.value.code == 2


def test_default_shapes_parse() -> None:
    args = ab.parse_args(["--variant", "e:stages=3"])
    assert len(args.shapes) == len(ab.DEFAULT_SHAPES)
    assert args.shapes[0] == (32, 32, 4096, 128, False) and args.rounds == 3


def test_loads_the_kernel_file_of_a_commit_as_its_own_module() -> None:
    b90 = pytest.importorskip("kernels.flash.bwd_sm90")
    mod = ab.load_at("HEAD")
    assert mod is not b90 and mod.attention_backward_sm90 is not b90.attention_backward_sm90
    assert mod.HEAD_DIMS == b90.HEAD_DIMS
    cands = ab.candidates([("e", {"stages": 3})], mod)
    assert list(cands) == ["base", "tree", "e"]
    assert cands["base"] is mod.attention_backward_sm90


def test_refuses_a_commit_git_does_not_know() -> None:
    with pytest.raises(SystemExit, match="no-such-commit"):
        ab.main(["--against", "no-such-commit"])


def test_summary_ratios_and_geometric_mean() -> None:
    res = {"a": {"base": 1.0, "e": 0.8, "fa4": 0.5}, "b": {"base": 2.0, "e": 2.5, "fa4": 1.0}}
    text = ab.summary(res).splitlines()
    assert text[:2] == ["speed against base (base ms / candidate ms)", "shape e"]
    assert text[2:5] == ["a 1.250", "b 0.800", "geomean 1.000"]
    assert text[5:7] == ["speed against fa4 (fa4 ms / candidate ms)", "shape base e"]
    assert text[7] == "a 0.500 0.625" and text[8] == "b 0.500 0.400"
    assert text[9] == f"geomean 0.500 {math.sqrt(0.625 * 0.4):.3f}"


def test_refuses_to_run_without_a_gpu(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        ab.main(["--variant", "e:stages=3"])
