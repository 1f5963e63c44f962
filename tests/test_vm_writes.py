"""What the CPU VM marks unwritten at a step's start is exactly what the step's
instructions write (``megakernel/vm.py``): the hazard check finds a read of an element
before its write only where the element was marked unwritten, so a VM that marks the
wrong KV slot lets a split read its newest key from the cache before the key is stored
and nothing is reported. The writes are read off the schedule's rows by the meaning of
each field (``isa.py``), not from the VM's poisoning code."""
from __future__ import annotations

import pytest
import torch

from onelaunch.megakernel import loads
from onelaunch.megakernel import schedule as S
from onelaunch.megakernel import vm as V
from onelaunch.megakernel.isa import (ARG, BUMP2, IDX, LAYER, NONE, OP, OP_ARGMAX,
                                      OP_ATTN_FUSED, OP_ATTN_MERGE, OP_ATTN_PARTIAL,
                                      OP_DOWN, OP_EMBED, OP_EXPERT_DOWN, OP_EXPERT_GATE_UP,
                                      OP_GATE_UP, OP_LM_HEAD, OP_O_PROJ, OP_RMS_QKV,
                                      OP_ROPE_KV, OP_ROUTER, OP_TOPK, ROW0, ROWS, SPLITS,
                                      UNIT)
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights
from test_megakernel_vm import TILES, ids_for

CARRIED = ("k_cache", "v_cache", "seq", "argmax", "pos")   # kept from step to step


def row_writes(spec, r, pos: int, prompt_len: int) -> list[tuple[str, tuple]]:
    """(buffer, index) of everything instruction ``r`` stores at position ``pos``, by
    the fields' meaning (``isa.py``): output rows [ROW0, ROW0 + ROWS) of its op's
    buffer, its slot IDX, its (head, split ARG), the KV slot pos of (LAYER, kv head)."""
    op, l, r0, n, D = r[OP], r[LAYER], r[ROW0], r[ROWS], spec.head_dim
    rows, g = (slice(r0, r0 + n),), spec.heads // spec.kv_heads
    kv = [("k_cache", (l, r0, pos)), ("v_cache", (l, r0, pos))]
    if op in (OP_EMBED, OP_O_PROJ):
        return [("x", rows)]
    if op == OP_RMS_QKV:
        return [("qkv", rows)] + ([("qk_ss", (r[IDX],))] if spec.qk_norm else [])
    if op == OP_ROPE_KV:                                   # ROW0 = kv head
        return [("q", (slice(r0 * g, r0 * g + g),))] + kv
    if op in (OP_ATTN_PARTIAL, OP_ATTN_FUSED):             # ROWS = the kv head's q heads
        out = [(p, (slice(r0 * n, r0 * n + n), r[ARG])) for p in ("part_m", "part_l", "part_o")]
        if op == OP_ATTN_FUSED:
            a, b = S.split_range(pos + 1, r[ARG], r[SPLITS], r[UNIT])
            out += kv if a <= pos < b else []              # the split that holds pos
            if r[BUMP2] != NONE:                           # the last split to end merges
                out.append(("attn", (slice(r0 * n * D, (r0 + 1) * n * D),)))
        return out
    if op == OP_ATTN_MERGE:                                # ROW0 = query head
        return [("attn", (slice(r0 * D, r0 * D + D),))]
    if op in (OP_GATE_UP, OP_EXPERT_GATE_UP):
        return [("h", rows)]
    if op in (OP_DOWN, OP_EXPERT_DOWN):                    # earlier splits: fp32 partials
        return [("scratch", (r[ARG],) + rows)] if r[ARG] < r[SPLITS] - 1 else [("x", rows)]
    if op == OP_LM_HEAD:
        return [("logits", rows), ("lm_val", (r[IDX],)), ("lm_idx", (r[IDX],))]
    if op == OP_ARGMAX:                                    # the token appended past the prompt
        seq = [("seq", (pos + 1,))] if pos + 1 >= prompt_len else []
        return [("token", (0,)), ("argmax", (pos + 1,)), ("pos", (0,))] + seq
    if op == OP_ROUTER:
        return [("router_logits", rows)]
    if op == OP_TOPK:
        return [("route_ids", (l,)), ("route_w", (l,))]
    raise AssertionError(f"no writes known for opcode {op}")


def declared(sched, shapes: dict, pos: int, prompt_len: int) -> dict[str, torch.Tensor]:
    """Per buffer, a mask of the elements the schedule's instructions write."""
    out = {name: torch.zeros(shape, dtype=torch.bool) for name, shape in shapes.items()}
    for _, _, r in loads.all_rows(sched):
        for name, idx in row_writes(sched.spec, r, pos, prompt_len):
            out[name][idx] = True
    return out


def diff(name: str, want: torch.Tensor, got: torch.Tensor) -> str:
    miss, extra = (want & ~got).nonzero().tolist(), (got & ~want).nonzero().tolist()
    return f"{name}: missing {miss[:4]} ({len(miss)}), extra {extra[:4]} ({len(extra)})"


def check_steps(spec, w, sched, prompt: int, start: int, steps: int, seed: int):
    """Each step from ``start``: the elements marked unwritten at its start (the VM's
    ``buffers``, which its ``step`` calls first) and those written during it (a writer
    recorded, ``Tracked.w_sm >= 0``) against the schedule's declared writes."""
    m = V.Machine(spec, w, 64, 2)
    m.start(ids_for(spec, prompt, seed), start)
    for i in range(steps):
        pos = int(m.pos)
        marked = {n: b.w_sm == V.UNWRITTEN for n, b in m.buffers(sched).items()}
        m.step(sched, seed + i)
        want = declared(sched, {n: b.w_sm.shape for n, b in m.buf.items()}, pos,
                        m.prompt_len)
        assert set(marked) == set(want)
        for name, b in m.buf.items():
            wrote = b.w_sm >= 0
            assert torch.equal(wrote, want[name]), f"step at {pos}, written " + \
                diff(name, want[name], wrote)
            if name == "pos":              # the step's input: read, then written last
                assert not marked[name].any()
            elif name in CARRIED:          # exactly what the step writes
                assert torch.equal(marked[name], want[name]), f"step at {pos}, marked " + \
                    diff(name, want[name], marked[name])
            else:                          # an activation: nothing carries over
                assert bool(marked[name].all()), name
        assert int(m.pos) == pos + 1


@pytest.mark.parametrize("attention", S.FORMS)
def test_dense_steps_mark_exactly_what_they_write(attention):
    """tiny-qwen2 on 8 SMs (4 splits a kv head), each attention form: steps inside the
    3-token prompt (no token appended), at its end and after it. The KV cache is marked
    unwritten at slot pos of every layer and kv head and nowhere else, argmax at pos +
    1, seq at pos + 1 past the prompt; pos is not (read first, then written by ARGMAX);
    every activation is. And the VM writes what the rows declare, no more."""
    spec = get_spec("tiny-qwen2")
    sched = S.build(spec, 8, 40, attention=attention, **TILES)
    check_steps(spec, random_weights(spec, 0), sched, 3, 1, 3, 5)


def test_moe_steps_mark_exactly_what_they_write():
    """tiny-olmoe on 16 SMs (the experts' down in two slot groups, partial squares of 16
    QKV blocks), from inside the prompt to past it."""
    spec = get_spec("tiny-olmoe")
    sched = S.build(spec, 16, 40, **TILES)
    check_steps(spec, random_weights(spec, 0), sched, 3, 1, 3, 9)

