"""attnmem.kernels.flash.launcher.DirectLauncher on the CPU, with a stand-in for a JIT function: what it
keeps, when it launches directly, and when it leaves every launch to the JIT."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

pytest.importorskip("triton")
from attnmem.kernels.flash import launcher as direct  # noqa: E402


class FakeKernel:
    function, packed_metadata = "fn", "meta"

    def __init__(self, log):
        self.log = log

    def run(self, *a):
        self.log.append(("direct", a))


class FakeJIT:
    """fn[grid](*args, **kwargs) as Triton's JIT: records the call, returns a compiled kernel."""

    def __init__(self):
        self.log = []
        self.params = [SimpleNamespace(name=n, default=d) for n, d in (
            ("X", inspect.Parameter.empty), ("n", inspect.Parameter.empty),
            ("BLOCK", inspect.Parameter.empty), ("EXTRA", 5))]

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            return FakeKernel(self.log)
        return launch


def _launcher(hooks=None, max_entries=4096, fn=None, descriptor=None, stream=99):
    fn = FakeJIT() if fn is None else fn
    lau = direct.DirectLauncher(fn, max_entries=max_entries, descriptor=descriptor)
    lau._runtime = SimpleNamespace(launch_enter_hook=hooks, launch_exit_hook=None)
    lau._device, lau._stream = (lambda: 0), (lambda dev: stream)
    return fn, lau


def _logging_jit(log, kernel_cls):
    """A stand-in JIT function whose launches log ("jit", args) and return kernel_cls(log)."""
    class JIT(FakeJIT):
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                log.append(("jit", args))
                return kernel_cls(log)
            return launch
    return JIT()


def test_first_call_jit_then_direct_with_the_bound_tail():
    fn, lau = _launcher()
    for _ in range(3):
        lau((4, 2), ("k",), ("x", 10), {"BLOCK": 64, "num_warps": 4})
    assert [e[0] for e in fn.log] == ["jit", "direct", "direct"]
    # grid padded to 3-d, the raw stream, no hooks, then args and the constexprs in order
    # (BLOCK given, EXTRA its default); launch options are not parameters
    assert fn.log[1][1] == (4, 2, 1, 99, "fn", "meta", None, None, None, "x", 10, 64, 5)
    assert lau.direct_calls == 2


def test_other_keys_hooks_and_no_key_take_the_jit_path(monkeypatch):
    fn, lau = _launcher()
    lau((1,), ("a",), ("x", 1), {"BLOCK": 16})
    lau((1,), ("b",), ("x", 1), {"BLOCK": 16})  # another specialisation: compiled apart
    lau((1,), None, ("x", 1), {"BLOCK": 16})  # no key: never cached
    assert [e[0] for e in fn.log] == ["jit", "jit", "jit"] and len(lau.cache) == 2
    fn, lau = _launcher(hooks=lambda *a: None)  # a profiler's hook sees every launch
    lau((1,), ("a",), ("x", 1), {"BLOCK": 16})
    lau((1,), ("a",), ("x", 1), {"BLOCK": 16})
    assert [e[0] for e in fn.log] == ["jit", "jit"] and not lau.cache
    fn, lau = _launcher()
    monkeypatch.setattr(direct.SETTINGS, "direct_launch", False)
    lau((1,), ("a",), ("x", 1), {"BLOCK": 16})
    lau((1,), ("a",), ("x", 1), {"BLOCK": 16})
    assert [e[0] for e in fn.log] == ["jit", "jit"]


def test_a_missing_constexpr_is_not_cached_and_the_table_is_bounded():
    fn, lau = _launcher(max_entries=2)
    lau((1,), ("a",), ("x", 1), {})  # BLOCK neither given nor defaulted: keep nothing
    assert not lau.cache
    for key in "abc":
        lau((1,), (key,), ("x", 1), {"BLOCK": 16})
    assert len(lau.cache) == 1  # emptied when full, then the newest kept


# ---- Triton 3.6's launcher: the C launch function called directly, tensor maps kept -------
class FakeCLaunch:
    """Stands for the compiled C launch function (a builtin: no __code__)."""

    def __init__(self):
        self.calls = []

    def __call__(self, *a):
        self.calls.append(a)


def _wrap(launcher, tensordesc_indices, tensordesc_meta):
    """Mirrors the shape of Triton 3.6's descriptor-expanding closure around the C launch."""
    def inner(*args):
        return launcher, tensordesc_indices, tensordesc_meta
    return inner


class CudaLauncher:
    launch_cooperative_grid, launch_pdl = False, True
    global_scratch_size = profile_scratch_size = 0

    def __init__(self, launch):
        self.launch = launch

    def __call__(self, *a):
        raise AssertionError("the raw path must not go through run()")


def test_raw_launch_knows_only_its_layout():
    c = FakeCLaunch()
    assert direct.raw_launch(CudaLauncher(c), "3.6.0") == (c, False, True, None, None)
    wrapped = CudaLauncher(_wrap(c, {2, 0}, [{"m": 0}, {"m": 2}]))
    assert direct.raw_launch(wrapped, "3.6.0") == (c, False, True, (0, 2),
                                                   ({"m": 0}, {"m": 2}))
    assert direct.raw_launch(CudaLauncher(c), "3.9.0") is None  # another version
    other = CudaLauncher(lambda *a: None)  # a closure of another shape
    assert direct.raw_launch(other, "3.6.0") is None
    scratch = CudaLauncher(c)
    scratch.global_scratch_size = 64  # needs scratch memory: run() allocates it
    assert direct.raw_launch(scratch, "3.6.0") is None
    assert direct.raw_launch(SimpleNamespace(launch=c), "3.6.0") is None  # not a CudaLauncher


def test_descriptors_encoded_once_per_tensor_and_launched_raw():
    import torch

    c = FakeCLaunch()
    log, encodes, built = [], [], []

    class Kernel(FakeKernel):
        run = CudaLauncher(_wrap(c, {0}, [{"tile": 16}]))

    def descriptor(t, rows):
        built.append(rows)
        return SimpleNamespace(base=t, rows=rows)

    def encode(desc, meta):
        encodes.append(desc.base.data_ptr())
        return ["MAP", *desc.base.shape, meta["tile"]]

    _, lau = _launcher(fn=_logging_jit(log, Kernel), descriptor=descriptor, stream=7)
    lau._version, lau._encode = "3.6.0", encode
    a, b = torch.zeros(2, 3), torch.zeros(2, 3)
    lau((5,), ("k",), ((a, 64), 11), {"BLOCK": 32})  # JIT: the descriptor object is built
    assert log[0][1][0].base is a and log[0][1][1] == 11 and built == [64]
    lau((5,), ("k",), ((a, 64), 12), {"BLOCK": 32})
    lau((5,), ("k",), ((a, 64), 13), {"BLOCK": 32})
    assert encodes == [a.data_ptr()]  # encoded once for a, reused for the same tensor
    assert c.calls[1] == (5, 1, 1, 7, "fn", False, True, None, None, "meta", None, None, None,
                          "MAP", 2, 3, 16, 13, 32, 5)
    lau((5,), ("k",), ((b, 64), 14), {"BLOCK": 32})  # another address: encoded afresh
    assert encodes == [a.data_ptr(), b.data_ptr()] and c.calls[-1][13:] == (
        "MAP", 2, 3, 16, 14, 32, 5)
    assert lau.raw_calls == 3 and lau.direct_calls == 3 and len(log) == 1


def test_unknown_launcher_gets_built_descriptors_through_run():
    """On a Triton whose launcher `raw_launch` does not know, a hit calls kernel.run as the JIT
    does, with the (tensor, *extra) tuples built into descriptor objects."""
    import torch

    log = []
    _, lau = _launcher(fn=_logging_jit(log, FakeKernel),
                       descriptor=lambda t, rows: ("DESC", t.shape[0], rows), stream=7)
    lau._version = "3.9.0"  # not a launcher this module knows: no raw path
    a = torch.zeros(2, 3)
    lau((5,), ("k",), ((a, 64), 11), {"BLOCK": 32})
    lau((5,), ("k",), ((a, 64), 12), {"BLOCK": 32})
    assert log[0] == ("jit", (("DESC", 2, 64), 11))
    assert log[1] == ("direct", (5, 1, 1, 7, "fn", "meta", None, None, None, ("DESC", 2, 64),
                                 12, 32, 5))
    assert lau.raw_calls == 0 and not lau.encoded
