"""Two costs of Triton's CPU interpreter that the interpreter tests do not need, removed in
the child processes that run kernels with TRITON_INTERPRET=1.

The interpreter runs a kernel as Python: each program instance calls the kernel function,
each ``tl`` operation builds numpy arrays. Profiled on tests/kernels/test_sliding_window.py's
interpreter child (cProfile, Triton 3.9), two pieces of bookkeeping took over half of it:

1. ``triton.runtime.interpreter._patch_lang``: ``GridExecutor.__call__`` swaps the
   ``triton.language`` builtins for interpreted ones once per launch (and restores them after
   it), but ``InterpretedFunction.__call__`` does the same scan again (``inspect.getmembers``
   over the modules the helper's globals name) on every call of a nested ``@triton.jit``
   helper (``_fwd_key_loop``, ``_dkdv_query_loop``, ``tl.zeros``: once per key or query block
   of every program), and never restores what that call patched. The repeat changes nothing
   when every language module the helper sees is either patched by the running launch or was
   patched by an earlier helper call (left so by Triton): a builtin already patched is no
   longer a builtin (``tl.core.is_builtin`` is False for the wrapper), and the other
   attributes it sets are stateless functions equal to those in place (``tl.tensor``,
   ``tl.dtype`` and ``tl.condition`` are the ``tl.core`` classes the launch patched). The
   repeat is skipped in exactly that case; every other call goes to Triton's function.
2. ``InterpreterOptions.sanitize_overflow`` (default True): every int32 ``+ - *`` in a kernel
   is recomputed in int64 and checked against the int32 range with a device assert. On a GPU
   the same option only adds the check in debug builds. The interpreter tests use tensors of
   at most a few hundred thousand elements, so no index they compute comes near 2**31 and the
   check cannot fire; it is switched off on the interpreter's builder.

Nothing else changes: the same kernels run the same operations on the same numpy data.
"""

from __future__ import annotations

import inspect


def quick_interpreter() -> None:
    """Apply both changes in this process (which must have TRITON_INTERPRET=1 set before it
    imported triton); a second call does nothing."""
    import dataclasses

    import triton.language as tl
    from triton.runtime import interpreter as it

    # A Triton whose interpreter lacks what this relies on runs unchanged (slower, same
    # results): the speed-up must never be what breaks a test run on another release.
    builder = getattr(it, "interpreter_builder", None)
    opts = getattr(builder, "options", None)
    if (not callable(getattr(it, "_patch_lang", None)) or not hasattr(it, "GridExecutor")
            or not dataclasses.is_dataclass(opts)
            or "sanitize_overflow" not in {f.name for f in dataclasses.fields(opts)}):
        return
    if getattr(it._patch_lang, "_quick", False):
        return
    real_patch, real_launch = it._patch_lang, it.GridExecutor.__call__
    # One entry per launch in progress: the ids of the language modules its patch covers
    # (None until GridExecutor.__call__ has patched them).
    launches: list[set[int] | None] = []
    kept: set[int] = set()  # modules a nested helper's call patched (and left patched)

    seen: dict[object, set[int]] = {}

    def langs(fn) -> set[int]:  # the modules real_patch(fn) would patch (its own rule)
        if fn not in seen:
            seen[fn] = {id(v) for v in fn.__globals__.values()
                        if inspect.ismodule(v) and v in (tl, tl.core)}
        return seen[fn]

    class _Nothing:
        def restore(self) -> None:
            pass

    def patch_lang(fn):
        if launches and launches[-1] is None:  # the launch's own patch, restored after it
            launches[-1] = langs(fn)
            return real_patch(fn)
        if launches and langs(fn) <= launches[-1] | kept:  # a nested helper, covered
            return _Nothing()
        kept.update(langs(fn))  # InterpretedFunction.__call__ never restores this patch
        return real_patch(fn)

    def launch(self, *args, **kwargs):
        launches.append(None)
        try:
            return real_launch(self, *args, **kwargs)
        finally:
            launches.pop()

    patch_lang._quick = True
    it._patch_lang = patch_lang
    it.GridExecutor.__call__ = launch
    builder.options = dataclasses.replace(opts, sanitize_overflow=False)
