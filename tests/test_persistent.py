"""The persistent layer (one launch a dense layer, ``kernels/layer_persistent.py``) in the
interpreter: the same bits as the split-K plan, step after step, at any grid size, with
or without the next-phase prefetch; one launch a layer in the plan, with the bytes the
unfused blocks claim; bad requests refused in one line. The interpreter runs one launch
per phase (a spinning grid barrier cannot run there); the GPU runs all phases in one
launch (``lab/persistent_check.py`` checks the same bits there). A last test compiles the
one-launch kernel for Hopper on the CPU (barrier included), where Triton's ptxas is there.
"""
import os
import shutil
import subprocess
import sys

import pytest
import torch

from onelaunch import plan
from onelaunch.kernels import config
from onelaunch.engine import Engine, EngineError
from onelaunch.options import PersistentOptions
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights

SPEC = "tiny-qwen2"
MAX_CTX = 80            # two splits of 64 positions: the steps below cross into the second


@pytest.fixture(scope="module")
def w():
    return random_weights(SPEC, 0)


def state(e):
    return [e.x, e.logits, e.seq, e.pos, e.k_cache, e.v_cache]


def same(a, b) -> bool:
    return all(torch.equal(x.view(torch.uint8) if x.is_floating_point() else x,
                           y.view(torch.uint8) if y.is_floating_point() else y)
               for x, y in zip(state(a), state(b)))


def run_both(ref, eng, steps, graph=True):
    for i in range(steps):
        ref.step(graph)
        eng.step(graph)
        assert same(ref, eng), f"step {i} (pos {int(ref.pos) - 1}): the persistent layer differs"


def near_the_split(es, pos=62, seed=1):
    """Both engines at position ``pos`` with the same random cache (an earlier prompt), so a
    few steps cross from one split of the attention into two."""
    g = torch.Generator().manual_seed(seed)
    spec = get_spec(SPEC)
    shape = (spec.layers, spec.kv_heads, MAX_CTX, spec.head_dim)
    kc = torch.randn(shape, generator=g).to(torch.bfloat16)
    vc = torch.randn(shape, generator=g).to(torch.bfloat16)
    toks = torch.randint(0, spec.vocab, (pos + 1,), generator=g)
    for e in es:
        e.adopt_cache(kc, vc, pos, toks)


@pytest.mark.parametrize("lp", [{"STAGES": 0}, {"GRID": 16, "NEXT": 0, "STAGES": 0}])
def test_persistent_layer_is_the_splitk_step_bit_for_bit(w, lp):
    """Tokens, x, logits and the caches equal the split-K engine's (PDL off) after every step:
    from a fresh prompt, then across the first split boundary, under the (emulated) graph.
    Grid 3 (the interpreter's default: programs walk several tiles of most phases) and 16
    (more programs than tiles in every phase: idle programs), prefetch on and off; the
    register ring (STAGES 0: the unfused ops' tiles and splits, so the default engine
    is the reference)."""
    ref = Engine(SPEC, w, max_ctx=MAX_CTX)
    eng = Engine(SPEC, w, max_ctx=MAX_CTX, persistent=True, cfgs={"layer_persistent": lp})
    for e in (ref, eng):
        e.capture()
        e.start(torch.tensor([5, 17, 3]))
    run_both(ref, eng, 1)
    near_the_split((ref, eng), pos=63)       # 63 in one split, then 64 in the second
    run_both(ref, eng, 2)
    assert int(eng.pos) == 65
    assert not eng.down_counter.any() and not eng.layer_barrier.any()   # left zero


@pytest.mark.parametrize("lp", [{"STAGES": 2, "TILE": "16x64", "GRID": 16}])
def test_streamed_phases_are_the_reference_bit_for_bit(w, lp):
    """STAGES > 0: each GEMV phase is one flat loop over (row tile, K tile) streamed through
    shared memory (``stream_gemv``). Its bits equal an unfused engine run at the same tiles
    (``plan.persistent_cfgs``: whole rows for down, SPLIT_K 1), step after step."""
    eng = Engine(SPEC, w, max_ctx=MAX_CTX, persistent=True, cfgs={"layer_persistent": lp})
    c = plan.persistent_cfgs(eng)
    assert c["down_residual"]["SPLIT_K"] == 1 and c["layer_persistent"]["STAGES"] == lp["STAGES"]
    if "TILE" in lp:
        assert (c["rms_gate_up_swiglu"]["BLOCK_N"], c["rms_gate_up_swiglu"]["BLOCK_K"]) == (16, 64)
    ref = Engine(SPEC, w, max_ctx=MAX_CTX, cfgs=c)
    for e in (ref, eng):
        e.capture()
        e.start(torch.tensor([5, 17, 3]))
    run_both(ref, eng, 1)
    near_the_split((ref, eng), pos=63)
    run_both(ref, eng, 2)


def spy_launches(monkeypatch) -> list:
    """(grid, FIRST, LAST) of every launch of the persistent layer kernel from now on."""
    from onelaunch.kernels import layer_persistent as LP
    launches, real = [], LP._layer_persistent_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **k):
                launches.append((grid, k["FIRST"], k["LAST"]))
                return real[grid](*a, **k)
            return launch
    monkeypatch.setattr(LP, "_layer_persistent_kernel", Spy())
    return launches


@pytest.mark.parametrize("nxt,stages", [(1, 0), (0, 0), (1, 2)])
def test_one_launch_of_one_program(w, monkeypatch, nxt, stages):
    """A grid of one program runs all seven phases in ONE launch in the interpreter too
    (its barriers never wait for another program): the GPU's code path, barriers, the
    counters' reset and the requests made before each barrier included; register ring
    or streamed phases."""
    launches = spy_launches(monkeypatch)
    eng = Engine(SPEC, w, max_ctx=MAX_CTX, persistent=True,
                 cfgs={"layer_persistent": {"GRID": 1, "NEXT": nxt, "STAGES": stages}})
    ref = Engine(SPEC, w, max_ctx=MAX_CTX, cfgs=plan.persistent_cfgs(eng))
    near_the_split((ref, eng), pos=63)
    run_both(ref, eng, 2)
    assert set(launches) == {((1,), 0, 6)} and len(launches) == 2 * get_spec(SPEC).layers
    assert not eng.layer_barrier.any() and not eng.down_counter.any()


def test_phase_groups_one_launch_each(w, monkeypatch):
    """``PersistentOptions(split="0-4,5-6")``: the attention block in one launch and the MLP
    in another (grid 1, so the barriers inside each run here), same bits; a grouping that
    skips or repeats a phase is refused in one line."""
    from onelaunch.kernels import layer_persistent as LP
    launches = spy_launches(monkeypatch)
    eng = Engine(SPEC, w, max_ctx=MAX_CTX, persistent=True,
                 cfgs={"layer_persistent": {"GRID": 1}},
                 persist=PersistentOptions(split="0-4,5-6"))
    ref = Engine(SPEC, w, max_ctx=MAX_CTX, cfgs=plan.persistent_cfgs(eng))
    run_both(ref, eng, 2)
    assert {(first, last) for _, first, last in launches} == {(0, 4), (5, 6)}
    assert not eng.layer_barrier.any() and not eng.down_counter.any()
    with pytest.raises(ValueError, match="must cover phases 0-6"):
        LP.phase_ranges(dict(split=True, groups="0-3,5-6"), 1, 6)


def test_pdl_from_the_table_and_the_options():
    """The layer kernel launches with PDL when the engine does, unless its table entry
    says PDL=0 (the H200's, from
    results/h200/2026-11-30_persistent-layer-variants/*_nopdl.json);
    ``PersistentOptions.pdl`` overrides either way."""
    from onelaunch.kernels import layer_persistent as LP
    assert LP.launch_options("cpu", True, {})["pdl"]
    assert not LP.launch_options("cpu", True, {"PDL": 0})["pdl"]
    assert not LP.launch_options("cpu", False, {"PDL": 1})["pdl"]
    on, off = PersistentOptions(pdl=True), PersistentOptions(pdl=False)
    assert LP.launch_options("cpu", True, {"PDL": 0}, on)["pdl"]
    assert not LP.launch_options("cpu", True, {"PDL": 1}, off)["pdl"]
    assert not LP.launch_options("cpu", False, {}, on)["pdl"]
    assert config.TABLE["sm_90"]["layer_persistent"]["PDL"] == 0


def test_clock_refused_in_the_interpreter(w):
    eng = Engine(SPEC, w, max_ctx=MAX_CTX, persistent=True,
                 persist=PersistentOptions(clock=True))
    with pytest.raises(ValueError, match="globaltimer"):
        eng.generate(torch.tensor([1, 2, 3]), 1)


def test_generate_same_tokens(w):
    """The default persistent engine (streamed) and the unfused one at its tiles."""
    eng = Engine(SPEC, w, max_ctx=MAX_CTX, persistent=True)
    ref = Engine(SPEC, w, max_ctx=MAX_CTX, cfgs=plan.persistent_cfgs(eng))
    prompt = torch.tensor([1, 2, 3])
    assert torch.equal(ref.generate(prompt, 2), eng.generate(prompt, 2))


def test_plan_one_launch_a_layer_same_bytes(w):
    """layers + 2 launches; the persistent launch claims what the unfused blocks do."""
    spec = get_spec(SPEC)
    ref = Engine(SPEC, w, max_ctx=MAX_CTX)
    eng = Engine(SPEC, w, max_ctx=MAX_CTX, persistent=True)
    assert [L.op for L in eng.plan] == ["embed"] + ["layer_persistent"] * spec.layers + ["lm_head_argmax"]
    assert eng.launches_per_step() == spec.layers + 2
    for ctx in (0, 7, 70):
        assert plan.bytes_per_step(eng.plan, ctx) == plan.bytes_per_step(ref.plan, ctx)
    for li in range(spec.layers):
        mine = [L for L in eng.plan if L.layer == li]
        theirs = [L for L in ref.plan if L.layer == li]
        assert mine[0].weight_bytes == sum(L.weight_bytes for L in theirs)
        assert mine[0].kv_bytes_per_ctx == sum(L.kv_bytes_per_ctx for L in theirs)


def test_reference_cfgs_run_the_same_tiles(w):
    """``plan.persistent_cfgs``: the unfused ops' tiles at the persistent kernel's warps;
    an engine built with them is the bit-for-bit reference on a GPU."""
    eng = Engine(SPEC, w, max_ctx=MAX_CTX, persistent=True,
                 cfgs={"layer_persistent": {"num_warps": 8}})
    c = plan.persistent_cfgs(eng)
    assert {op: c[op]["num_warps"] for op in c} == {op: 8 for op in c}
    assert c["attention_splitk"]["reduce_warps"] == 8
    L = eng.W["layers"][0]
    assert c["rms_gate_up_swiglu"]["BLOCK_K"] == eng.cfg("rms_gate_up_swiglu", L["w_gate_up"])["BLOCK_K"]
    ref = Engine(SPEC, w, max_ctx=MAX_CTX, cfgs=c)
    assert ref.launches_per_step() == 2 + 7 * get_spec(SPEC).layers


def test_tile_override_own_means_the_ops_tiles():
    """``PersistentOptions(tile="own")`` drops a table's TILE (the ops' own tiles stream);
    a ``BNxBK`` value replaces it; unset, the table's stays."""
    from onelaunch import kernels as K
    c_p = {"num_warps": 4, "STAGES": 4, "TILE": "8x512"}
    assert K.layer_persistent.entry(c_p)["TILE"] == "8x512"
    assert "TILE" not in K.layer_persistent.entry(c_p, PersistentOptions(tile="own"))
    tile = K.layer_persistent.entry(c_p, PersistentOptions(tile="16x256"))["TILE"]
    assert tile == "16x256"
    ops = {"rms_gate_up_swiglu": {"BLOCK_N": 8, "BLOCK_K": 512, "PREFETCH": 2},
           "down_residual": {"BLOCK_N": 2, "BLOCK_K": 1024, "SPLIT_K": 3}, "attention_splitk": {}}
    own = plan.persistent_tiles({"num_warps": 4, "STAGES": 4}, ops)
    assert own["rms_gate_up_swiglu"]["BLOCK_N"] == 8 and own["down_residual"]["SPLIT_K"] == 1
    assert own["rms_gate_up_swiglu"]["PREFETCH"] == 1


@pytest.mark.parametrize("kw,msg", [
    (dict(attention="plain"), "attention='splitk'"),
    (dict(tp=object()), "leave out tp"),
])
def test_bad_requests_say_what_to_use(w, kw, msg):
    with pytest.raises(EngineError, match=msg) as ei:
        Engine(SPEC, w, max_ctx=32, persistent=True, **kw)
    assert "\n" not in str(ei.value)


def test_moe_ring_refused_in_one_line():
    """The MoE layer streams its experts; asked for the register ring it says what to use."""
    with pytest.raises(EngineError, match="persistent=False") as ei:
        Engine("tiny-olmoe", random_weights("tiny-olmoe", 0), max_ctx=32, persistent=True,
               cfgs={"layer_persistent": {"STAGES": 0}})
    assert "STAGES" in str(ei.value) and "\n" not in str(ei.value)
    from onelaunch.measure import rungs
    assert not rungs.rung_supported(get_spec("tiny-olmoe"), "persistent, tiles ahead")
    assert rungs.rung_supported(get_spec("tiny-olmoe"), "+ persistent layer")


@pytest.mark.parametrize("lp", [{"STAGES": 2}, {"STAGES": 2, "GRID": 1}])
def test_moe_persistent_layer_is_the_reference_bit_for_bit(lp):
    """OLMoE's layer in one launch (phases 5-7: the router's logits; every program routes
    for itself, one stores the ids, weights and log; the chosen experts' gate/up; their
    down, weighted and summed in slot order): x, logits, tokens, caches and the expert log
    equal the unfused engine's at the same tiles, step after step (grid 1: all eight
    phases in one launch, barriers included)."""
    mw = random_weights("tiny-olmoe", 0)
    eng = Engine("tiny-olmoe", mw, max_ctx=MAX_CTX, persistent=True,
                 cfgs={"layer_persistent": lp})
    ref = Engine("tiny-olmoe", mw, max_ctx=MAX_CTX, cfgs=plan.persistent_cfgs(eng))
    assert [L.op for L in eng.plan][1:-1] == ["layer_persistent"] * get_spec("tiny-olmoe").layers
    for e in (ref, eng):
        e.capture()
        e.start(torch.tensor([5, 17, 3]))
    for i in range(2):
        ref.step(True)
        eng.step(True)
        assert same(ref, eng), f"step {i}: the persistent MoE layer differs"
        assert torch.equal(ref.expert_log, eng.expert_log)
    assert not eng.layer_barrier.any()


def _ptxas():
    import triton
    p = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    return p if os.path.exists(p) else shutil.which("ptxas")


@pytest.mark.parametrize("stages,fold", [(0, 1), (4, 0), (4, 1)])
def test_one_launch_kernel_compiles_for_hopper(stages, fold):
    """All seven phases with their six grid barriers, compiled for sm_90 at Qwen2.5-1.5B's
    tiles (the tuned table's), PDL on: Triton lowers the barrier's atomics and ptxas
    assembles it. (The interpreter never runs the barrier; this is its CPU check.) With
    STAGES 4 the GEMV phases' weight loads become asynchronous copies into shared memory
    (Triton's pipeliner took the loops); with 0 there are none. ``fold``: RoPE inside the
    attention phase (FOLD_ROPE), one barrier fewer."""
    if _ptxas() is None:
        pytest.skip("no ptxas")
    code = AOT.format(repo=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code, str(stages), str(fold)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "registers" in r.stdout, r.stdout


# compiled in a subprocess: the kernels' module must be imported without TRITON_INTERPRET
AOT = r'''
import inspect, os, re, subprocess, sys, tempfile, typing
sys.path.insert(0, {repo!r})
import triton
from triton.backends.compiler import GPUTarget
from onelaunch.kernels import layer_persistent as LP
from onelaunch.kernels import layer_persistent_args as LA
ce = dict(HAS_BIAS=True, QK_NORM=False, D=128, BLOCK_D=128, BLOCK_R=1024, GROUP=6, GROUP_PAD=16,
          BLOCK_DA=128, CHUNK=64, BLOCK_T=64, DOT_F32=False, BLOCK_S=32, BLOCK_M=32,
          BN_QKV=8, BK_QKV=2048, PF_QKV=1, BN_O=8, BK_O=2048, PF_O=1, BN_GU=8, BK_GU=512, PF_GU=2,
          BN_DN=2, BK_DN=1024, PF_DN=2, SPLIT_K=1, FIRST=0, LAST=6, NEXT=True, USE_PDL=True,
          FENCE=True, STAGES=int(sys.argv[1]), MOE=False, TOP_K=1, TOP_KP=1, BLOCK_E=1,
          BN_R=8, BK_R=512, BN_EGU=8, BK_EGU=512, BN_EDN=8, BK_EDN=512,
          CLOCK=int(sys.argv[1]) == 0, SLOTS=14,   # the ring build also stamps the clock
          FOLD=sys.argv[2] == "1", SKIP=int(sys.argv[2]))
# the kernel's tuple parameters (each field one kernel parameter) and constexpr groups
GROUPS = dict(qkv=LA.Qkv, rope=LA.Rope, att=LA.Attn, oproj=LA.OProj, gu=LA.GateUp, dn=LA.Down,
              rt=LA.Router, ex=LA.Experts)
CONSTS = dict(A=LA.Heads, T=LA.Tiles, M=LA.MoETiles)
f32 = set("att.po att.pm att.pl dn.scratch rt.logits rt.wts".split())
i32 = set("rope.pos dn.counter rt.ids rt.log bar_ptr".split())
def leaf(name, kind):
    if kind is float:
        return "fp32"
    if kind is int:
        return "i32"
    return ("*fp32" if name in f32 else "*i32" if name in i32 else "*i64" if name == "clock_ptr"
            else "*bf16")
sig, consts, attrs = {{}}, {{}}, {{}}
for i, n in enumerate(inspect.signature(LP._layer_persistent_kernel.fn).parameters):
    if n in GROUPS:
        kinds = typing.get_type_hints(GROUPS[n])
        sig[n] = GROUPS[n](*(leaf(f"{{n}}.{{f}}", kinds[f]) for f in GROUPS[n]._fields))
        # pointers 16-byte aligned and sizes multiples of 16, as the launcher's tensors are
        # (the streamed phases' copies are pipelined only when the compiler knows that)
        attrs.update({{(i, j): [["tt.divisibility", 16]] for j, f in enumerate(GROUPS[n]._fields)
                      if sig[n][j] != "fp32" and f"{{n}}.{{f}}" != "rope.pos"}})
    elif n in CONSTS:
        sig[n], consts[n] = "constexpr", CONSTS[n](**{{f: ce[f] for f in CONSTS[n]._fields}})
    elif n in ce:
        sig[n], consts[n] = "constexpr", ce[n]
    else:
        sig[n] = leaf(n, object)
        attrs[(i,)] = [["tt.divisibility", 16]]
def build(stages):
    k = triton.compile(triton.compiler.ASTSource(fn=LP._layer_persistent_kernel, signature=sig,
                                                 constexprs=dict(consts, STAGES=stages),
                                                 attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8))
    return k, k.asm["ttgir"].count("async_copy_global_to_local")
c, copies = build(ce["STAGES"])
if ce["STAGES"]:   # the four GEMV loops' weight and input loads, on top of the ring's few
    ring = build(0)[1]
    assert copies >= ring + 4 * ce["STAGES"], f"async copies: {{copies}} streamed, {{ring}} ring"
assert "atom" in c.asm["ptx"] and "griddepcontrol.wait" in c.asm["ptx"]
assert ("%globaltimer" in c.asm["ptx"]) == ce["CLOCK"], "the clock stamps, only with CLOCK"
d = tempfile.mkdtemp()
open(os.path.join(d, "k.ptx"), "w").write(c.asm["ptx"])
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
r = subprocess.run([ptxas, "-arch=sm_90a", "-v", os.path.join(d, "k.ptx"), "-o", os.path.join(d, "k.o")],
                   capture_output=True, text=True)
assert r.returncode == 0, r.stderr
print(" ".join(re.findall(r"Used \d+ registers|\d+ bytes spill stores", r.stdout + r.stderr)))
'''


def test_ladder_rung_is_judged_then_timed(w):
    """``ladder.ladder_rows`` runs "+ persistent layer" (on request) like any rung: judged
    against the oracle, then timed. (Its bits are the split-K step's: the tests above.)"""
    from onelaunch.measure import ladder
    rows = ladder.ladder_rows(get_spec(SPEC), w, "cpu", ctx=2, tokens=2, iters=1,
                              rungs=("+ persistent layer",))
    [pers] = rows
    assert pers["rung"] == "+ persistent layer" and pers["launches"] == get_spec(SPEC).layers + 2
    assert pers["agree"] == "2/2" and not pers["flips"] and pers["ms_per_token"] is not None


@pytest.mark.parametrize("grid", [1, 3])
def test_rope_folded_into_attention(w, monkeypatch, grid):
    """``PersistentOptions(fold_rope=True)``: RoPE and the KV write inside the attention phase
    (``rope_attention_partial.rope_partial``), one barrier fewer: bit for bit the unfused
    reference across the split boundary, in one launch (grid 1: the barriers' targets one
    fewer after the missing one, the counters reset) and one launch per phase (grid 3).
    A group of phases ending at the missing barrier is refused in one line."""
    from onelaunch.kernels import layer_persistent as LP
    launches = spy_launches(monkeypatch)
    fold = PersistentOptions(fold_rope=True)
    eng = Engine(SPEC, w, max_ctx=MAX_CTX, persistent=True,
                 cfgs={"layer_persistent": {"GRID": grid}}, persist=fold)
    cfgs = plan.persistent_cfgs(eng)
    assert cfgs["layer_persistent"]["FOLD_ROPE"] == 1
    ref = Engine(SPEC, w, max_ctx=MAX_CTX, cfgs=cfgs)
    near_the_split((ref, eng), pos=63)
    run_both(ref, eng, 2)
    assert torch.equal(ref.k_cache, eng.k_cache) and torch.equal(ref.v_cache, eng.v_cache)
    assert not eng.layer_barrier.any()
    assert {(first, last) for _, first, last in launches} == (
        {(0, 6)} if grid == 1 else {(p, p) for p in range(7)})
    if grid == 1:
        bad = Engine(SPEC, w, max_ctx=MAX_CTX, persistent=True,
                     cfgs={"layer_persistent": {"GRID": 1}},
                     persist=PersistentOptions(fold_rope=True, split="0-2,3-6"))
        with pytest.raises(ValueError, match="cannot end at phase 2"):
            bad.step(False)
