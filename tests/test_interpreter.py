"""onelaunch.interpreter: Triton's interpreter without its repeated set-up, same results."""
import pytest
import torch
import triton
import triton.language as tl

from onelaunch import env

pytestmark = pytest.mark.skipif(not env.interpreting(), reason="Triton's interpreter only")


@triton.jit
def _row_sum(x_ptr, N: tl.constexpr):
    acc = tl.zeros([N], dtype=tl.float32)       # standard.py's helper: it sees tl.core
    return tl.sum(acc + tl.load(x_ptr + tl.arange(0, N)), axis=0)


@triton.jit
def _scaled_sums(x_ptr, out_ptr, N: tl.constexpr):
    p = tl.program_id(0)
    tl.store(out_ptr + p, _row_sum(x_ptr, N) * (p + 1))


def test_applied_once_in_the_interpreter():
    from triton.runtime import interpreter as I

    from onelaunch.interpreter import speed_up
    assert I.GridExecutor._onelaunch                    # applied at import of the package
    call = I.InterpretedFunction.__call__
    assert speed_up() and I.InterpretedFunction.__call__ is call     # a second time: no-op


def test_a_helper_that_sees_more_of_the_language_still_gets_it_swapped():
    """The kernel's module sees ``tl`` only; its helper calls ``tl.zeros``, whose module
    sees ``tl.core``, which the launch did not swap: that swap still happens, launch after
    launch, and the sums are exact."""
    x = torch.arange(8, dtype=torch.float32)
    for _ in range(2):                                  # the swap undone between launches
        out = torch.zeros(3)
        _scaled_sums[(3,)](x, out, 8)
        assert out.tolist() == [28.0, 56.0, 84.0]


def test_another_triton_is_left_as_it_is(monkeypatch):
    """A Triton whose helper call reads otherwise than the one the patch replaces keeps
    its own code: the patch checks the source it replaces before it replaces it."""
    from triton.runtime import interpreter as I

    from onelaunch import interpreter
    monkeypatch.setattr(I.GridExecutor, "_onelaunch", False, raising=False)
    monkeypatch.setattr(interpreter, "KNOWN", ("0" * 16, "0" * 16))
    call = I.InterpretedFunction.__call__
    assert interpreter.speed_up() is False and I.InterpretedFunction.__call__ is call
