"""The one-launch step (``megakernel/step.py`` host, ``gluon/dense.py`` and ``gluon/moe.py``
device, ``aot.py`` their compile for sm_90): the lists
it runs are ``schedule.build``'s with the kernel's tiles (the VM runs them at full
shapes in ``test_megakernel_vm.py``), it compiles for sm_90 on a machine without a GPU,
an engine or rung asked for it where it cannot run says why in one line, and on the GPU
it passes the oracle check teacher-forced at ctx 512 in one launch a step."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
import triton

from onelaunch.engine import Engine, EngineError, megakernel_refusal
from onelaunch.megakernel import isa, loads, schedule, step
from onelaunch.megakernel.boxes import KB, down_boxes, gate_up_boxes
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
    """Qwen and OLMoE-1B-7B run (OLMoE: the MoE kernel); the tiny models' hidden sizes
    are not whole 256-column tiles; an MoE without the q/k norm, or whose experts' down
    rows are not one box, is refused."""
    assert refusal(get_spec("qwen2.5-1.5b")) is None
    olmoe = get_spec("olmoe-1b-7b")
    assert refusal(olmoe) is None
    assert "tiles" in refusal(get_spec("tiny-qwen2"))
    assert "tiles" in refusal(get_spec("tiny-olmoe"))
    assert "q/k norm" in refusal(dataclasses.replace(olmoe, qk_norm=False))
    assert "no bias" in refusal(dataclasses.replace(olmoe, qkv_bias=True))
    assert "one box" in refusal(dataclasses.replace(olmoe, intermediate=768))
    r = RUNGS[MEGA]
    assert MEGA in BENCH and r.supported(get_spec("qwen2.5-1.5b"))
    assert r.supported(olmoe) and not r.runs_on("cpu")


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


# the kernels' code (``aot.ptx_code_hash``: the PTX without its line numbers) at Qwen's and
# OLMoE-1B-7B's shapes with Triton 3.6.0: an edit to the device code that changes what the
# GPU runs changes these, so one that only moves or renames code shows it kept the bits
DENSE_CODE = {("four", 0): "465d113cb9f2e95c", ("four", 1): "2df738dab3ca9b90",
              ("three", 0): "36d5f4bcc8a6ae2a", ("three", 1): "057e31c4969855fd",
              ("two", 0): "8ea3407f592471fe", ("two", 1): "1f6283eb9727e701"}
MOE_CODE = {0: "173a5747e21fab8b", 1: "d0f60a9aa95490c2"}


def test_compiles_for_hopper_without_a_gpu():
    """The whole step's kernel at Qwen's shapes through ptxas for sm_90, in each form of
    the attention the host can pick (the engine's "three", and "four" and "two") and
    both ways of polling a counter: layouts, TMA boxes, barriers, the clock; with
    Triton 3.6.0 the code is ``DENSE_CODE``'s."""
    r = subprocess.run([sys.executable, "-m", "onelaunch.megakernel.aot",
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
        if triton.__version__ == "3.6.0":
            assert f"'code': '{DENSE_CODE[f, p]}'" in ln, (f, p, ln)


def test_moe_compiles_for_hopper_without_a_gpu():
    """The MoE kernel (``gluon/moe.py``) at OLMoE-1B-7B's shapes through ptxas for sm_90,
    both polls: TMA copies (the experts' boxes too), barriers, the clock, and its ring,
    held stage and h within sm_90's shared memory."""
    r = subprocess.run([sys.executable, "-m", "onelaunch.megakernel.aot",
                        "--model", "olmoe-1b-7b", "--poll", "0,1"],
                       capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    for p in (0, 1):
        ln = next(ln for ln in r.stdout.splitlines()
                  if f"[moe_step_kernel] sm_90 STAGES {step.MOE_STAGES} attention four poll {p}:"
                  in ln)
        info = eval(ln.split(": ", 1)[1])
        assert info["tma"] > 0 and (info["acquire"] == 0) == (p == 0), ln
        assert info["shared"] <= step.SMEM_MAX
        assert info["shared"] >= step.moe_smem(get_spec("olmoe-1b-7b")) - 1024
        if triton.__version__ == "3.6.0":
            assert info["code"] == MOE_CODE[p], (p, ln)


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


@pytest.mark.gpu
def test_one_launch_moe_step_passes_the_oracle_check():
    """OLMoE-1B-7B at ctx 512 (the MoE kernel): 16 teacher-forced tokens by the agreement
    rule, one launch a step, the experts it routed to logged per position, two replays
    from one state bit-identical, no wait timed out (its loaders' too)."""
    from onelaunch.measure.agree import judge, oracle_tokens
    from onelaunch.prompt import random_prompt
    spec, ctx = get_spec("olmoe-1b-7b"), 512
    if not RUNGS[MEGA].runs_on("cuda"):
        pytest.skip("needs Hopper")
    w = random_weights(spec, 0, device="cuda")
    prompt = random_prompt(spec, ctx, 0)
    ref = oracle_tokens(spec, w, prompt, 16, ctx + 64)
    e = Engine(spec, w, max_ctx=ctx + 64, megakernel=True)
    assert e.paths["megakernel"] and e.launches_per_step() == 1
    j = judge(e, prompt, ref, True)
    e.check_stalls()
    assert j["ok"], j["flips"]
    assert all(n >= spec.top_k for n in e.distinct_experts(ctx, ctx + 8))
    xs = []
    for _ in range(2):
        e.pos.fill_(ctx)
        e.step(True)
        torch.cuda.synchronize()
        xs.append(e.x.clone())
    e.check_stalls()
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


def test_refused_past_32_bit_cache_offsets():
    spec = get_spec("qwen2.5-1.5b")
    assert refusal(spec, 32768) is None
    assert "32-bit" in refusal(spec, 2 ** 20)


# ---- the MoE kernel (gluon/moe.py): its host side and its loader's program ------------------
PAIR = (isa.OP_RMS_QKV, isa.OP_O_PROJ, isa.OP_ROUTER, isa.OP_LM_HEAD)


def moe_kernel_stages(rows, I, stages, hold):
    """The MoE kernel's stage rules (``gluon/moe_loader.py``, ``gluon/moe.py``) in Python,
    both partitions: (loader steps, compute steps). A step is ("wait", counter, target) or ((instruction, stage), place, use): place
    ("ring", s) or ("hold", h), use its barrier's phase count. GEMV pairs take ceil(rows /
    2 TN) stages, an expert's gate/up rows / TN, its down rows / TN x ceil(slots / R)
    (R slots' boxes a stage); after the first of a run of loader-waiting instructions with
    a HOIST, the next ``hold`` GEMV-pair stages before the next run are held ones (the
    loader streams them before its wait)."""
    def n_stages(r):
        if r[isa.OP] in PAIR:
            return -(-r[isa.ROWS] // (2 * TN))
        if r[isa.OP] == isa.OP_EXPERT_GATE_UP:
            return r[isa.ROWS] // TN
        if r[isa.OP] == isa.OP_EXPERT_DOWN:                # R slots' boxes a stage
            R = 2 * step.KB * step.TK // I
            return r[isa.ROWS] // TN * -(-(r[isa.KLEN] // I) // R)
        return 0

    def run(loader):
        out, t, pend, uses, prev, last = [], 0, 0, [0] * hold, -1, -1
        for i, r in enumerate(rows):
            lw = r[isa.LWAIT]
            if lw >= 0 and prev < 0:                  # the first of a run
                pend = hold if hold and r[isa.HOIST] > 0 else 0
                n, j, past = 0, i + 1, False
                while loader and pend and j < len(rows) and n < hold:
                    r2 = rows[j]
                    if r2[isa.LWAIT] >= 0:
                        n = hold if past else n
                    else:
                        past = True
                        for q in range(min(n_stages(r2), hold - n) if r2[isa.OP] in PAIR
                                       else 0):
                            out.append(((j, q), ("hold", n), uses[n]))
                            uses[n] += 1
                            n += 1
                    j += 1
            if loader and lw >= 0 and lw != last:
                out.append(("wait", lw, r[isa.LTARGET]))
                last = lw
            prev = lw
            for q in range(n_stages(r)):
                if r[isa.OP] in PAIR and pend > 0:
                    h = hold - pend
                    pend -= 1
                    if not loader:
                        out.append(((i, q), ("hold", h), uses[h]))
                        uses[h] += 1
                else:
                    out.append(((i, q), ("ring", t % stages), t // stages))
                    t += 1
        return out
    return run(True), run(False)


def test_moe_loader_and_compute_agree_on_every_stage():
    """OLMoE-1B-7B's lists on 132 and 16 SMs through the MoE kernel's stage rules: each
    stage the compute takes is one the loader streamed, into the same place with the same
    phase; ring stages in the same order; held stages streamed before the loader's wait
    on the router, never an expert's; each loader waits once a layer, before the
    experts' stages; and the VM's hoisted tiles (``loads.stream``, the plan's hold a
    stage of them) are the tiles of the held stages, exactly."""
    spec = get_spec("olmoe-1b-7b")
    for P in (132, 16):
        sched = plan_schedule(spec, P, 512)
        assert sched.hold and step.HOLD_STAGES
        held = 0
        for sm in range(P):
            rows = sched.rows(sm)
            lo, co = moe_kernel_stages(rows, spec.intermediate, step.MOE_STAGES,
                                       step.HOLD_STAGES)
            got = [x for x in lo if x[0] != "wait"]
            assert sorted(got) == sorted(co) and len({x[0] for x in co}) == len(co)
            assert ([x[0] for x in got if x[1][0] == "ring"]
                    == [x[0] for x in co if x[1][0] == "ring"])
            waits = [k for k, x in enumerate(lo) if x[0] == "wait"]
            assert len(waits) == len({r[isa.LAYER] for r in rows if r[isa.LWAIT] >= 0})
            for k, x in enumerate(lo):
                if x[0] == "wait":
                    continue
                expert = rows[x[0][0]][isa.OP] in loads.EXPERT_OPS
                if x[1][0] == "hold":
                    held += 1
                    assert not expert and any(w > k for w in waits)
                if expert:                            # after its layer's wait
                    assert any(w < k and lo[w][1] == rows[x[0][0]][isa.LWAIT] for w in waits)
            owner = [(i, tl) for i, r in enumerate(rows) for tl in loads.tiles(sched, r)]
            kernel_held = {x[0] for x in co if x[1][0] == "hold"}
            vm_held = {k for k, (i, tl) in enumerate(owner)
                       if (i, (tl[1] - rows[i][isa.ROW0]) // (2 * TN)) in kernel_held}
            assert vm_held == {st[1] for st in loads.stream(sched, sm)
                               if st[0] == "load" and st[3][0] == "hold"}
        assert held == sum(r[isa.HOIST] > 0 for _, _, r in loads.all_rows(sched))


def small_olmoe():
    """OLMoE's shapes cut down (2 layers, hidden 512, 16 experts): what the MoE kernel's
    host side needs, weights in seconds on a CPU."""
    return dataclasses.replace(get_spec("olmoe-1b-7b"), name="small-olmoe", hidden=512,
                               layers=2, heads=4, kv_heads=4, experts=16, vocab=1024,
                               max_ctx=256)


def test_moe_host_stacks_the_experts_addressed_by_id():
    """``MegaStep`` on an MoE engine (no GPU: the host side only): the experts of every
    layer one tensor a kind, expert e of layer l's rows at (l E + e) x rows, as the
    loader addresses them; the router rows at l E; the q/k gains per layer; one TMA box
    of an expert's down rows (all of I); buffers per layer for the ids and weights, and
    the ids' log per position; the loaders' err rows after the computes'; the
    constexprs the kernel compiles with."""
    from types import SimpleNamespace

    from onelaunch.weights import pack_weights
    s = small_olmoe()
    assert refusal(s) is None
    W = pack_weights(s, random_weights(s, 0))
    e = SimpleNamespace(spec=s, W=W, device=torch.device("cpu"), max_ctx=256)
    mk = step.MegaStep(e, P=16)
    assert mk.moe and mk.stages == step.MOE_STAGES and mk.attention == "four"
    E, I, H = s.experts, s.intermediate, s.hidden
    for l, e_ in ((0, 3), (1, 15)):
        L = W["layers"][l]
        assert torch.equal(mk.w["egu"][(l * E + e_) * 2 * I + 5], L["w_experts_gate_up"][e_, 5])
        assert torch.equal(mk.w["egu"][(l * E + e_) * 2 * I + I + 5],
                           L["w_experts_gate_up"][e_, I + 5])
        assert torch.equal(mk.w["edn"][(l * E + e_) * H + 7], L["w_experts_down"][e_, 7])
        assert torch.equal(mk.w["rt"][l * E + e_], L["w_router"][e_])
        assert torch.equal(mk.q_norm[l], L["q_norm"]) and torch.equal(mk.k_norm[l], L["k_norm"])
    assert mk.d[4].block_shape == [TN, I // step.TK, step.TK]
    assert mk.route_ids.shape == mk.route_w.shape == (s.layers, s.top_k)
    assert mk.expert_log.shape == (257, s.layers, s.top_k)     # the engine's, row pos
    assert mk.h.numel() == s.top_k * I and mk.err.shape == (2 * 16, step.ERR)
    rows = mk.sched.instr.view(-1, isa.WIDTH)
    assert mk.qk_ss.shape[0] == int(rows[rows[:, isa.OP] == isa.OP_ROPE_KV, isa.SPLITS][0])
    c = mk.constexprs()
    assert (c.KE, c.TOPK, c.EP, c.HOLD, c.STAGES) == (4, 8, 16, 1, 5)
    assert mk.weight_bytes() == (sum(mk.w[k].numel() for k in ("qkv", "o", "rt"))
                                 + W["lm_head"].numel()
                                 + s.layers * s.top_k * 3 * I * H) * 2


def test_a_loaders_stall_is_named_as_the_loaders():
    """The MoE kernel's loaders record a timed-out wait on the router's counter in the
    rows after the computes': the message names the loader."""
    from types import SimpleNamespace

    from onelaunch.megakernel.step import MegaStep
    sched = plan_schedule(get_spec("olmoe-1b-7b"), 132, 512)
    mk = SimpleNamespace(err=torch.zeros(2 * 132, 4, dtype=torch.int32), sched=sched)
    MegaStep.check_stalls(mk)
    route = sched.counters.index("route.3")
    mk.err[132 + 5] = torch.tensor([40, route, 0, 1])
    with pytest.raises(RuntimeError) as e:
        MegaStep.check_stalls(mk)
    assert str(e.value).startswith("megakernel stalled: the loader of SM 5 instruction 39")
    assert "route.3" in str(e.value)


# ---- the TMA boxes (boxes.py) ---------------------------------------------------------------
@pytest.mark.parametrize("kt,kd,tail,want", [(35, 16, True, (2, 4)), (35, 16, False, (3, 0)),
                                             (32, 16, True, (2, 0)), (3, 16, True, (0, 4))])
def test_down_boxes(kt, kd, tail, want):
    nf, tb = down_boxes(kt, kd, tail)
    assert (nf, tb) == want
    assert nf * kd <= kt + (kd - 1) and nf * kd + tb >= kt    # every tile, once


@pytest.mark.parametrize("kt,tail,want", [(6, True, (4, 2)), (6, False, (8, 0)),
                                          (8, True, (8, 0)), (4, True, (4, 0)),
                                          (7, True, (4, 4))])
def test_gate_up_boxes(kt, tail, want):
    kg, gt = gate_up_boxes(kt, KB, tail)
    assert (kg, gt) == want
    assert kg + gt >= kt and kg + gt <= KB and (gt == 0 or kg % gt == 0)


def test_host_arguments_match_the_kernels_parameters():
    """``DenseStep`` and ``MoEStep`` (no GPU: the host side only) pass each kernel its
    parameters in order: a descriptor where it takes one, each group as the NamedTuple the
    sm_90 compile types it by (``aot.DENSE_GROUPS``, ``MOE_GROUPS``), then ``C``."""
    import inspect
    from types import SimpleNamespace

    from onelaunch.megakernel import aot
    from onelaunch.weights import pack_weights
    small_qwen = dataclasses.replace(get_spec("qwen2.5-1.5b"), name="small-qwen", layers=2,
                                     vocab=1024, max_ctx=256)
    for s, groups in ((small_qwen, aot.DENSE_GROUPS), (small_olmoe(), aot.MOE_GROUPS)):
        W = pack_weights(s, random_weights(s, 0))
        e = SimpleNamespace(spec=s, W=W, device=torch.device("cpu"), max_ctx=256,
                            x=None, k_cache=None, v_cache=None, cos=None, sin=None,
                            seq=None, argmax=None, pos=None, prompt_len=None)
        mk = step.MegaStep(e, P=16)
        assert type(mk) is (step.MoEStep if s.is_moe else step.DenseStep)
        names = list(inspect.signature(mk.kernel.fn).parameters)
        assert names[-2:] == ["C", "num_warps"] and len(mk.args()) == len(names) - 2
        for name, a in zip(names, mk.args()):
            if name in groups:
                assert type(a) is groups[name], name
            elif name.startswith("d_"):
                assert hasattr(a, "block_shape"), name
        assert type(mk.constexprs()).__name__ == ("MoEConsts" if s.is_moe else "Consts")
