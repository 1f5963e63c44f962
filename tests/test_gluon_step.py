"""The one-launch step (``megakernel/step.py`` host, ``gluon_step.py`` device): the lists
it runs are ``schedule.build``'s with the kernel's tiles (the VM runs them at full
shapes in ``test_megakernel_vm.py``), it compiles for sm_90 on a machine without a GPU,
an engine or rung asked for it where it cannot run says why in one line, and on the GPU
it passes the oracle check teacher-forced at ctx 512 in one launch a step."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from onelaunch.engine import Engine, EngineError, megakernel_refusal
from onelaunch.megakernel import isa, loads, schedule, step
from onelaunch.megakernel.step import TN, plan_ctx, plan_schedule, refusal
from onelaunch.measure.rungs import BENCH, MEGA, RUNGS
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights


def test_the_kernels_lists_keep_the_schedules_invariants():
    """Qwen at ctx 512 on 132 SMs: planned so every (kv head, split) pair of SMs is
    used with one unit of keys, no down projection split over K (the kernel takes all of
    K an instruction), every row block whole TN-row tiles, and ``loads.check``'s
    invariants (counters, stage order, the reset) hold."""
    spec = get_spec("qwen2.5-1.5b")
    sched = plan_schedule(spec, 132, 512)
    loads.check(sched)
    rows = sched.instr.view(-1, isa.WIDTH)
    part = rows[rows[:, isa.OP] == isa.OP_ATTN_FUSED]             # the "three" form
    assert not (rows[:, isa.OP] == isa.OP_ROPE_KV).any()
    assert (rows[:, isa.OP] == isa.OP_ATTN_MERGE).sum() == spec.layers * spec.heads
    assert (part[:, isa.BUMP2] == isa.NONE).all()                  # the merges merge
    assert len(part) == spec.layers * 132 and (part[:, isa.SPLITS] == 66).all()
    assert (part[:, isa.UNIT] == 16).all() and plan_ctx(spec, 132) == 66 * 16
    down = rows[rows[:, isa.OP] == isa.OP_DOWN]
    assert (down[:, isa.KLEN] == spec.intermediate).all()
    gemv = rows[torch.isin(rows[:, isa.OP], torch.tensor([isa.OP_RMS_QKV, isa.OP_O_PROJ,
                                                           isa.OP_GATE_UP, isa.OP_LM_HEAD]))]
    assert (gemv[:, isa.ROWS] % TN == 0).all()


def test_refused_where_it_cannot_run():
    assert refusal(get_spec("qwen2.5-1.5b")) is None
    assert "MoE" in refusal(get_spec("olmoe-1b-7b"))
    assert "tiles" in refusal(get_spec("tiny-qwen2"))
    r = RUNGS[MEGA]
    assert MEGA in BENCH and r.supported(get_spec("qwen2.5-1.5b"))
    assert not r.supported(get_spec("olmoe-1b-7b")) and not r.runs_on("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's refusal")
def test_engine_off_hopper_says_why_in_one_line(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    w = random_weights("tiny-qwen2", 0)
    with pytest.raises(EngineError) as e:
        Engine("tiny-qwen2", w, megakernel=True)
    assert "tiles" in str(e.value) and "\n" not in str(e.value)
    why = megakernel_refusal(get_spec("qwen2.5-1.5b"), "cpu", 1024)   # the spec would do
    assert "sm_90" in why and "\n" not in why
    with pytest.raises(EngineError, match="one launch on one GPU"):
        Engine("tiny-qwen2", w, megakernel=True, attention="plain")


def test_compiles_for_hopper_without_a_gpu():
    """The whole step's kernel at Qwen's shapes through ptxas for sm_90, in each form of
    the attention the host can pick (the engine's "three", and "four" and "two") and
    both ways of polling a counter: layouts, TMA boxes, barriers, the clock."""
    r = subprocess.run([sys.executable, "-m", "onelaunch.megakernel.step", "--aot",
                        "--attention", ",".join(schedule.FORMS),    # every form
                        "--poll", "0,1"],                           # both polls
                       capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"sm_90 STAGES {step.STAGES}" in r.stdout and "'tma'" in r.stdout
    lines = {(f, p): next(ln for ln in r.stdout.splitlines()
                          if f"attention {f} poll {p}: {{'shared'" in ln)
             for f in schedule.FORMS for p in (0, 1)}
    for (f, p), ln in lines.items():     # poll 1's waits are every thread's acquire loads
        assert ("'acquire': 0," in ln) == (p == 0), ln


@pytest.mark.gpu
@pytest.mark.parametrize("ctx", [512, 4000])
def test_one_launch_step_passes_the_oracle_check(ctx):
    """Qwen2.5-1.5B at ctx 512 and 4000 (several blocks of keys a split): 32
    teacher-forced tokens by the agreement rule, one launch a step (the engine reports
    it), two replays from one state bit-identical."""
    from onelaunch.measure.agree import judge, oracle_tokens
    from onelaunch.prompt import random_prompt
    spec = get_spec("qwen2.5-1.5b")
    if not RUNGS[MEGA].runs_on("cuda"):
        pytest.skip("needs Hopper")
    w = random_weights(spec, 0, device="cuda")
    prompt = random_prompt(spec, ctx, 0)
    ref = oracle_tokens(spec, w, prompt, 32, ctx + 128)
    e = Engine(spec, w, max_ctx=ctx + 128, megakernel=True)
    assert e.paths["megakernel"] and e.launches_per_step() == 1
    assert "one launch a step" in e.describe()
    j = judge(e, prompt, ref, True)
    assert j["ok"], j["flips"]
    xs = []
    for _ in range(2):
        e.pos.fill_(ctx)
        e.step(True)
        torch.cuda.synchronize()
        xs.append(e.x.clone())
    assert torch.equal(xs[0], xs[1])


def test_a_stall_is_named_in_one_line():
    """A wait that ran out of its bound (the kernel's err row: instruction + 1, counter,
    value seen, target) raises naming the SM, the instruction and the counter."""
    from types import SimpleNamespace

    from onelaunch.megakernel.step import MegaStep
    sched = plan_schedule(get_spec("qwen2.5-1.5b"), 132, 512)
    mk = SimpleNamespace(err=torch.zeros(132, 4, dtype=torch.int32), sched=sched,
                         n_ctr=len(sched.counters))
    MegaStep.check_stalls(mk)                             # nothing stalled: no error
    mk.err[7] = torch.tensor([12, 3, 5, 6])
    mk.err[9] = torch.tensor([2, 1, 0, 1])
    with pytest.raises(RuntimeError) as e:
        MegaStep.check_stalls(mk)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("megakernel stalled: SM 7 instruction 11")
    assert f"counter 3 ({sched.counters[3]}: saw 5, needs 6); 2 SMs stalled" in msg


def test_the_kernels_literals_are_isas():
    """The Gluon kernels branch on opcodes and read header fields by value: those values
    are the ones ``isa`` defines (its one owner)."""
    ops = (isa.OP_RMS_QKV, isa.OP_ROPE_KV, isa.OP_ATTN_PARTIAL, isa.OP_ATTN_MERGE,
           isa.OP_O_PROJ, isa.OP_GATE_UP, isa.OP_DOWN, isa.OP_LM_HEAD, isa.OP_ARGMAX,
           isa.OP_EMBED, isa.OP_ATTN_FUSED)
    assert ops == (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15)
    fields = (isa.OP, isa.LAYER, isa.ROW0, isa.ROWS, isa.WAIT0, isa.TARGET0, isa.WAIT1,
              isa.TARGET1, isa.BUMP, isa.ARG, isa.IDX, isa.SPLITS, isa.UNIT, isa.BUMP2)
    assert fields == (0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 18)


def test_refused_past_32_bit_cache_offsets():
    spec = get_spec("qwen2.5-1.5b")
    assert refusal(spec, 32768) is None
    assert "32-bit" in refusal(spec, 2 ** 20)
