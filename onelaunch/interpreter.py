"""Triton's CPU interpreter without its repeated set-up: the same kernels, the same bits.

At every launch the interpreter swaps ``triton.language``'s builtins for its own (the
modules ``tl`` and ``tl.core`` that the kernel's module sees) and swaps them back after.
Every call of a ``@triton.jit`` helper inside the kernel (``gemv_tiles``, ``tl.zeros``,
...) repeats that swap with ``inspect.getmembers`` over the whole language, and never
swaps back: a third of the interpreter's time in this package's kernels, for the state
the launch already set. :func:`speed_up` skips a helper's swap when every language
module the helper sees is already swapped in the running launch (the helper's own
swap would be a no-op), and does it otherwise. Nothing else changes: a kernel runs the
same statements on the same values.

Applied when the interpreter is on (``env.interpreting()``, at import of the package, or
``env.use_interpreter()``); a Triton whose interpreter lacks the parts named here, or
whose helper call or language swap reads otherwise than the Triton 3.6 this replaces
(``KNOWN``: hashes of their source), is left as it is.
"""
from __future__ import annotations

import hashlib
import inspect

# sha1 of the source of InterpretedFunction.__call__ and _patch_lang in Triton 3.6.0
KNOWN = ("5036b72c59d6d2c4", "0786ec22d74ef314")
_LAUNCHES: list[set] = []      # per running launch: ids of the language modules swapped
_LANGS: dict = {}              # function -> ids of the language modules it sees


def _langs(fn, tl) -> frozenset:
    if fn not in _LANGS:
        _LANGS[fn] = frozenset(id(v) for v in fn.__globals__.values()
                               if inspect.ismodule(v) and v in (tl, tl.core))
    return _LANGS[fn]


def _digest(fn) -> str:
    return hashlib.sha1(inspect.getsource(fn).encode()).hexdigest()[:16]


def speed_up() -> bool:
    """Patch Triton's interpreter once (module docstring). True when it is patched."""
    import triton.language as tl
    from triton.runtime import interpreter as I
    grid, fn_cls = getattr(I, "GridExecutor", None), getattr(I, "InterpretedFunction", None)
    if grid is None or fn_cls is None or not hasattr(I, "_patch_lang"):
        return False
    if getattr(grid, "_onelaunch", False):
        return True
    if tuple(_digest(f) for f in (fn_cls.__call__, I._patch_lang)) != KNOWN:
        return False                             # another Triton: its own code runs
    launch = grid.__call__

    def launch_call(self, *args, **kwargs):
        _LAUNCHES.append(set(_langs(self.fn, tl)))
        try:
            return launch(self, *args, **kwargs)
        finally:
            _LAUNCHES.pop()

    def helper_call(self, *args, **kwargs):
        need = _langs(self.fn, tl)
        if not _LAUNCHES or not need <= _LAUNCHES[-1]:
            I._patch_lang(self.fn)               # what Triton does at every call
            if _LAUNCHES:
                _LAUNCHES[-1] |= need
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise I.InterpreterError(repr(e)) from e

    grid.__call__, fn_cls.__call__, grid._onelaunch = launch_call, helper_call, True
    return True
