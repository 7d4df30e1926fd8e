"""The awkward-shape sweep (issue 16): enough points, the shapes it promises, a CLI that lists."""

from __future__ import annotations

from attnmem.measure import awkward_sweep as aw


def test_sweep_has_at_least_300_points_over_every_implementation_dtype_and_pass():
    pts = aw.points(aw.default_impls(), aw.SHAPES)
    assert len(pts) >= 300
    assert {p.impl for p in pts} >= {"naive", "naive_inplace", "sdpa_math", "sdpa_efficient",
                                     "sdpa_flash", "sdpa_cudnn", "triton"}
    assert {p.dtype for p in pts} == {"fp16", "bf16"}
    assert {p.backward for p in pts} == {False, True}
    assert {p.causal for p in pts} == {False, True}
    assert any(p.h_kv != p.heads for p in pts)  # GQA
    assert {p.batch for p in pts} >= {2, 3, 4, 5, 6, 8}
    assert {p.heads for p in pts} >= {12, 20, 40}
    assert {p.seq_len for p in pts} >= {1000, 3000, 5000, 7777, 12000}
    assert len(set(pts)) == len(pts)


def test_expandable_subset_is_about_sixty_points():
    pts = aw.points(aw.default_impls(), aw.EXPANDABLE_SHAPES, ("bf16",))
    assert 50 <= len(pts) <= 70


def test_list_prints_points_and_writes_nothing(tmp_path, capsys):
    assert aw.main(["--list", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "points ->" in out and aw.OUT_NAME in out
    assert not any(tmp_path.iterdir())


def test_unknown_implementation_is_refused(capsys):
    assert aw.main(["--impl", "nope", "--list"]) == 2


def test_check_compares_the_bundled_reference_with_calc():
    text = aw.check(aw.Path(__file__).parents[2] / "data" / "attention_calls_h200.csv")
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["impl", "mode", "rows"]
    assert any(line.startswith("sdpa_flash") for line in lines)
    assert "worst rows:" in text and "the cache was not empty before their call" in text


def test_prewarm_is_a_no_op_without_a_gpu():
    import torch

    from attnmem.measure import prewarm

    assert prewarm.WARMED == torch.cuda.is_available()
    assert not hasattr(prewarm, "make_device") and not hasattr(prewarm, "get_implementation")
