"""The step profile: kernel events attributed to the plan's launches (on synthetic events:
no CUDA profiler here), its errors, the figure, and the rung settings it shares with the
ladder."""
import inspect
import io

import pytest
import torch

from onelaunch.engine import Engine
from onelaunch.cli import profile as commands
from onelaunch.measure import agree, ladder, profile, rungs, trace
from onelaunch.measure.trace import ProfileError, attribute, split_replays
from onelaunch.report import profile_figures
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights

KNAME = {op: pats[0] for op, pats in trace.OP_KERNELS.items()}


def layer_plan(layers=2, ops=("rms_qkv", "rope_kv_write", "attention_partial", "attention_reduce",
                              "o_proj_residual", "rms_gate_up_swiglu", "down_residual")):
    """(op, bytes) per launch: a dense model's step."""
    plan = [("embed", 100)]
    for _ in range(layers):
        plan += [(op, 1000 * (i + 1)) for i, op in enumerate(ops)]
    return plan + [("lm_head_argmax", 5000)]


def events_for(plan, replays, dur=lambda k: 3.0 + k % 4, overlap=0.0, gap=10.0, t=0.0,
               name=lambda op: KNAME[op] + "_0d1d"):
    """Kernel events of ``replays`` replays: each kernel starts ``overlap`` us before the
    previous one ends (PDL: it waits inside), lasting ``dur(k)``; ``gap`` between replays."""
    ev = []
    for _ in range(replays):
        end = None
        for k, (op, _) in enumerate(plan):
            start = t if end is None else end - overlap
            end = max(start + dur(k), (end or 0) + 0.5)     # each ends after the one before
            ev.append((name(op), start, end))
        t = end + gap
    return ev


def test_times_add_up_to_the_span_without_overlap():
    plan = layer_plan()
    ev = events_for(plan, 3, overlap=0.0, gap=7.0)
    rows = attribute(ev, plan, replays=3, read_tbps=1.0)
    span_us = ev[len(plan) - 1][2] - ev[0][1]
    assert rows[0]["span_ms"] == pytest.approx(span_us / 1e3)
    assert sum(r["ms"] for r in rows) == pytest.approx(span_us / 1e3)
    assert rows[0]["gap_ms"] == pytest.approx(7.0 / 1e3)
    by = {r["op"]: r for r in rows}
    assert [r["op"] for r in rows] == list(dict.fromkeys(op for op, _ in plan))
    assert by["rms_qkv"]["launches"] == 2 and by["embed"]["launches"] == 1
    assert by["rms_qkv"]["bytes"] == 2000
    assert by["rms_qkv"]["bytes_ms"] == pytest.approx(2000 / 1e12 * 1e3)
    assert by["rms_qkv"]["beyond_ms"] == pytest.approx(by["rms_qkv"]["ms"] - by["rms_qkv"]["bytes_ms"])
    assert by["embed"]["ms"] == pytest.approx(3.0 / 1e3)          # the first: its duration
    assert by["rms_qkv"]["kernels"] == ["_rms_qkv_kernel_0d1d"]
    assert rows[0]["floor_ms"] == pytest.approx(sum(b for _, b in plan) / 1e9)


def test_pdl_overlap_attributes_what_each_launch_adds():
    """Under PDL a kernel starts early and waits: its duration overstates its cost, and
    the sum of durations exceeds the span. The time it adds (end - previous end) sums to
    the span exactly."""
    plan = layer_plan()
    ev = events_for(plan, 4, overlap=2.5, dur=lambda k: 4.0 + (k % 3))
    rows = attribute(ev, plan, replays=4)
    n = len(plan)
    one = ev[:n]
    span = one[-1][2] - one[0][1]
    assert sum(e - s for _, s, e in one) > span + 1.0               # durations overlap
    assert sum(r["ms"] for r in rows) == pytest.approx(span / 1e3)
    assert rows[0]["span_ms"] == pytest.approx(span / 1e3)
    ends = [e for _, _, e in one]
    want = {}
    for k, (op, _) in enumerate(plan):
        want[op] = want.get(op, 0.0) + (ends[k] - (ends[k - 1] if k else one[0][1]))
    for r in rows:
        assert r["ms"] == pytest.approx(want[r["op"]] / 1e3)
        assert r["bytes_ms"] is None and r["beyond_ms"] is None    # no bandwidth given


def test_median_over_replays_and_order_of_events_does_not_matter():
    plan = [("embed", 1), ("rms_qkv", 1), ("lm_head_argmax", 1)]
    ev = []
    t = 0.0
    for d in (1.0, 5.0, 2.0, 3.0, 100.0):                         # rms_qkv's time per replay
        ev += [("_embed_kernel", t, t + 1), ("_rms_qkv_kernel", t + 1, t + 1 + d),
               ("_lm_head_argmax_kernel", t + 1 + d, t + 2 + d)]
        t += 200
    rows = attribute(list(reversed(ev)), plan)
    assert rows[0]["replays"] == 5
    assert {r["op"]: r["ms"] for r in rows}["rms_qkv"] == pytest.approx(3.0 / 1e3)
    assert rows[0]["span_ms"] == pytest.approx(5.0 / 1e3)


def test_a_launch_of_several_kernels_and_foreign_kernels():
    """An all-reduce may issue more than one kernel: they all belong to its launch. A
    kernel of no op of the plan (a fill before a replay) is set aside and counted."""
    plan = [("embed", 1), ("o_proj_residual", 1), ("all_reduce", 0), ("residual_add", 0),
            ("lm_head_argmax", 1)]
    ev, t = [], 0.0
    for _ in range(2):
        ev += [("void at::native::vectorized_elementwise_kernel<4, FillFunctor<int>>(int)", t, t + 1),
               ("_embed_kernel", t + 2, t + 3), ("_o_proj_residual_kernel", t + 3, t + 5),
               ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", t + 5, t + 9),
               ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", t + 9, t + 10),
               ("_residual_add_kernel", t + 10, t + 11), ("_lm_head_argmax_kernel", t + 11, t + 13)]
        t += 50
    rows = attribute(ev, plan, replays=2)
    by = {r["op"]: r for r in rows}
    assert by["all_reduce"]["ms"] == pytest.approx(5.0 / 1e3)
    assert by["all_reduce"]["kernels"] == ["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]
    assert rows[0]["kernels_per_replay"] == 6 and rows[0]["dropped_kernels"] == 2
    assert rows[0]["plan_launches"] == 5 and rows[0]["dropped_names"] == [
        "at::native::vectorized_elementwise_kernel<4, FillFunctor<int>>"]
    assert rows[0]["span_ms"] == pytest.approx(11.0 / 1e3)


def test_wrong_kernel_count_is_a_clear_error():
    plan = layer_plan()
    ev = events_for(plan, 3)
    with pytest.raises(ProfileError, match="replay 3 ends after"):
        attribute(ev[:-2], plan, replays=3)
    with pytest.raises(ProfileError, match="make 3 replays of the plan .* not the 4"):
        attribute(ev, plan, replays=4)
    with pytest.raises(ProfileError, match="no GPU kernel events"):
        attribute([], plan)


def test_kernels_that_do_not_map_onto_the_plan_are_an_error():
    plan = layer_plan()
    ev = events_for(plan, 2)
    swapped = list(ev)
    swapped[2], swapped[3] = (swapped[3][0], *swapped[2][1:]), (swapped[2][0], *swapped[3][1:])
    with pytest.raises(ProfileError, match="kernel 3 of .* should be launch 3 of replay 1, op 'rope_kv_write'"):
        attribute(swapped, plan)
    # a plan op with no known kernel name: one kernel each, by position, counted strictly
    odd = [("embed", 1), ("mystery", 1), ("lm_head_argmax", 1)]
    ev = [("_embed_kernel", 0, 1), ("anything", 1, 2), ("_lm_head_argmax_kernel", 2, 3)]
    rows = attribute(ev, odd, replays=1)
    assert [r["kernels"] for r in rows][1] == ["anything"]
    with pytest.raises(ProfileError, match="should be launch 1 of replay 2, op 'embed'"):
        attribute(ev + [("x", 5, 6)], odd)
    with pytest.raises(ProfileError, match="replay 2 ends after 1 of the plan's 3 launches"):
        attribute(ev + [("_embed_kernel", 5, 6)], odd)
    with pytest.raises(ProfileError, match="none of the 1 kernels"):
        attribute([("cutlass_gemm", 0, 1)], layer_plan())


def test_kernel_events_from_a_chrome_trace():
    chrome = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "_embed_kernel", "ts": 10.5, "dur": 2.0},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset", "ts": 9.0, "dur": 1.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 1.0, "dur": 5.0},
        {"ph": "X", "cat": "Kernel", "name": "_rms_qkv_kernel", "ts": 13, "dur": 1}]}
    assert trace.kernel_events(chrome) == [("_embed_kernel", 10.5, 12.5),
                                            ("_rms_qkv_kernel", 13.0, 14.0)]


def test_every_op_of_every_rung_has_its_kernel_name():
    """Each op any rung's plan (both models) launches has a name in OP_KERNELS, and each
    Triton name is a @triton.jit function of the kernels package."""
    import onelaunch.kernels as K
    import importlib
    import pkgutil
    jit = set()
    for m in pkgutil.iter_modules(K.__path__):
        mod = importlib.import_module(f"onelaunch.kernels.{m.name}")
        jit |= {n for n in vars(mod) if n.startswith("_") and n.endswith("_kernel")}
    for op, pats in trace.OP_KERNELS.items():
        if op != "all_reduce":
            assert pats[0] in jit, (op, pats)
    for name in ("tiny-qwen2", "tiny-olmoe"):
        spec = get_spec(name)
        w = random_weights(spec, 0)
        for rung, st in rungs.RUNGS.items():
            e = Engine(spec, w, max_ctx=32, attention=st.attention, pdl=st.pdl)
            assert {L.op for L in e.plan} <= set(trace.OP_KERNELS), (name, rung)


def test_profile_needs_a_cuda_gpu():
    spec = get_spec("tiny-qwen2")
    e = Engine(spec, random_weights(spec, 0), max_ctx=32)
    with pytest.raises(ProfileError, match="needs a CUDA GPU") as ex:
        profile.step_profile(e, 4, replays=2)
    assert "\n" not in str(ex.value)
    with pytest.raises(ProfileError, match="needs a CUDA GPU"):
        profile.profile_rows(get_spec("tiny-qwen2"), {}, "cpu", ctx=4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's message")
def test_cli_says_it_needs_a_gpu(capsys):
    assert commands.profile_main(["--model", "tiny-qwen2", "--ctx", "8"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and err.count("\n") == 1


def test_ladder_uses_the_rung_registry(monkeypatch):
    """ladder_rows builds each rung's engine from its Rung in rungs.RUNGS (the registry
    the profile uses), through rungs.make_engine: a changed entry there changes the engine
    the ladder builds."""
    import dataclasses
    assert set(rungs.LADDER) <= set(rungs.RUNGS)
    assert set(profile.PROFILE_RUNGS) <= set(rungs.RUNGS)
    seen = []

    class Stop(Exception):
        pass

    class FakeEngine:
        def __init__(self, spec, w, **kw):
            seen.append(kw)
            raise Stop

    spec = get_spec("tiny-qwen2")
    monkeypatch.setattr(rungs, "Engine", FakeEngine)
    monkeypatch.setitem(rungs.RUNGS, "+ split-K",
                        rungs.Rung("+ split-K", attention="plain", graph=True, pdl=True))
    ref = (torch.zeros(2, dtype=torch.long), torch.zeros(2, 8))
    with pytest.raises(Stop):
        ladder.ladder_rows(spec, {}, "cpu", ctx=4, rungs=("+ split-K",), ref=ref)
    assert seen[-1]["attention"] == "plain" and seen[-1]["pdl"] is True
    for rung in ("fused eager", "+ split-K"):
        monkeypatch.setitem(rungs.RUNGS, rung, dataclasses.replace(
            rungs.RUNGS[rung], attention="splitk" if rung == "fused eager" else "plain"))
        with pytest.raises(Stop):
            ladder.ladder_rows(spec, {}, "cpu", ctx=4, rungs=(rung,), ref=ref)
        assert seen[-1]["attention"] == rungs.RUNGS[rung].attention
    assert "settings = {" not in inspect.getsource(ladder.ladder_rows)


def synthetic_rows():
    """Profile rows of four rungs for one model, as profile_rows returns them."""
    dense = ("rms_qkv", "rope_kv_write", "attention", "o_proj_residual", "rms_gate_up_swiglu",
             "down_residual")
    split = ("rms_qkv", "rope_kv_write", "attention_partial", "attention_reduce",
             "o_proj_residual", "rms_gate_up_swiglu", "down_residual")
    rows = []
    for rung, ops, dur, overlap, gap in (("fused eager", dense, 9.0, 0.0, 1.0),
                                         ("fused + graph", dense, 5.0, 0.0, 1.0),
                                         ("+ split-K", split, 3.5, 0.0, 1.0),
                                         ("+ PDL", split, 3.5, 1.5, 1.0)):
        plan = layer_plan(4, ops)
        ev = events_for(plan, 5, dur=lambda k, d=dur: d + (k % 5), overlap=overlap, gap=gap)
        for r in attribute(ev, plan, replays=5, read_tbps=1.5e-3):
            rows.append({"model": "qwen2.5-1.5b", "rung": rung, "ctx": 512, **r})
    return rows


def test_draw_profile_renders_with_labels():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = synthetic_rows()
    rows += [{"model": "qwen2.5-1.5b", "rung": "+ RoPE in attention", "ctx": 512, "op": None,
              "ms": None, "refused": "teacher-forced choices differ"}]
    fig = profile_figures.draw_profile(rows)
    w, h = fig.get_size_inches()
    assert w == pytest.approx(6.5) and fig.dpi >= 150
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_text().strip()]
    words = " ".join(t.get_text() for t in texts)
    for rung in ("fused eager", "fused + graph", "+ split-K", "+ PDL", "+ RoPE in attention"):
        assert rung in words
    for op in ("embed", "attention", "attention_partial", "attention_reduce", "down_residual",
               "lm_head_argmax", "beyond the bytes", "floor"):
        assert op in words
    span = next(r for r in rows if r["rung"] == "+ PDL")["span_ms"]
    assert f"{span:.3g} ms" in words and "vs above" in words and "check failed" in words
    assert min(t.get_fontsize() for t in texts) >= 10
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=150)
    assert buf.getvalue()[:4] == b"\x89PNG"
    plt.close(fig)
    assert profile_figures.op_order(rows)[:6] == ["embed", "rms_qkv", "rope_kv_write", "attention",
                                          "attention_partial", "attention_reduce"]
    cap = profile_figures.caption(rows)
    assert "+ PDL" in cap and "refused" in cap


def test_an_op_has_one_colour_in_both_models():
    """The same op (and a MoE op and its dense counterpart) gets the same colour in
    every profile figure, and no two ops of one figure share one."""
    dense = ["embed", "rms_qkv", "rope_kv_write", "attention_partial", "attention_reduce",
             "o_proj_residual", "rms_gate_up_swiglu", "down_residual", "lm_head_argmax"]
    moe = ["embed", "rms_qkv", "rope_kv_write", "attention_partial", "attention_reduce",
           "o_proj_residual", "moe_router", "moe_gate_up_swiglu", "moe_down_residual",
           "lm_head_argmax", "layer_persistent", "new_op"]
    a, b = profile_figures.op_colors(dense), profile_figures.op_colors(moe)
    for op in set(dense) & set(moe):
        assert a[op] == b[op], op
    assert a["rms_gate_up_swiglu"] == b["moe_gate_up_swiglu"]
    assert a["down_residual"] == b["moe_down_residual"]
    for c in (a, b):
        assert len(set(c.values())) == len(c)


class FakeEngine:
    """What step_profile touches of an engine, on a 'cuda' device that is never used."""

    def __init__(self, plan):
        from onelaunch.plan import Launch
        self.device = torch.device("cuda")
        self.max_ctx = 1000
        self.plan = [Launch(op, None, lambda: None, b, 2) for op, b in plan]
        self.graph = "captured"
        self.pos = torch.zeros(1, dtype=torch.int32)
        self.prompt_len = torch.zeros(1, dtype=torch.int32)
        self.steps = []

    def step(self, graph=True):
        self.steps.append((graph, int(self.pos)))
        self.pos += 1


def test_step_profile_flow_and_eager_fallback(monkeypatch):
    """The GPU path with the recorder replaced: bytes at ctx, the state put back, and
    when the graph's replays give no kernel events, the eager plan with a note."""
    from types import SimpleNamespace
    plan = [("embed", 10), ("rms_qkv", 100), ("lm_head_argmax", 50)]
    e = FakeEngine(plan)
    e.pos.fill_(7)
    calls = []

    def record(engine, graph, replays, trace_path=None):
        calls.append((graph, int(engine.pos)))
        assert replays == 4 + profile.LEAD_IN
        return [] if graph else events_for(plan, replays, dur=lambda k: 2.0)
    monkeypatch.setattr(profile, "_record", record)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(profile, "time_ms",
                        lambda fn, **kw: SimpleNamespace(median_ms=0.01, min_ms=0.009,
                                                         max_ms=0.012))
    rows = profile.step_profile(e, 64, replays=4, read_tbps=1e-3)
    assert calls == [(True, 62), (False, 62)]                  # from ctx - lead-in
    assert all(r["graph"] is False and r["note"] == profile.FALLBACK_NOTE for r in rows)
    by = {r["op"]: r for r in rows}
    assert by["rms_qkv"]["bytes"] == 100 + 64 * 2            # Launch.bytes_at(ctx)
    assert by["rms_qkv"]["ms"] == pytest.approx(2.0 / 1e3) and rows[0]["ctx"] == 64
    assert rows[0]["step_ms"] == 0.01 and rows[0]["span_over_step"] == pytest.approx(0.6)
    assert int(e.pos) == 7 and int(e.prompt_len) == 0          # put back
    calls.clear()
    monkeypatch.setattr(profile, "_record", lambda engine, graph, replays, trace_path=None:
                        calls.append(graph) or events_for(plan, replays))
    rows = profile.step_profile(e, 64, replays=3)
    assert calls == [True] and rows[0]["graph"] is True and "note" not in rows[0]
    with pytest.raises(ProfileError, match="max_ctx >= "):
        profile.step_profile(e, 990, replays=3)


def test_profile_rows_checks_each_rung_first(monkeypatch):
    """Each rung's engine is built from its Rung (rungs.RUNGS) and judged before it is profiled; a
    rung that fails the check is one refused row, never profiled."""
    judged, profiled = [], []

    def judge(e, prompt, ref, graph):
        judged.append((e.attention, e.pdl, graph, prompt.numel()))
        ok = e.attention == "plain"
        return {"ok": ok, "agree": "2/2" if ok else "1/2",
                "flips": [] if ok else [dict(step=1, ref_token=1, got_token=2, ref_top=1.0,
                                             ref_got=0.0, gap=1.0, threshold=0.1, verdict="flip")]}

    def step_profile(e, ctx, replays, read_tbps, graph=True, trace_path=None):
        profiled.append((e.attention, graph, ctx, e.max_ctx))
        return [{"op": "embed", "ms": 0.1, "span_ms": 0.1}]
    monkeypatch.setattr(profile, "_require_cuda", lambda dev: None)
    monkeypatch.setattr(profile, "step_profile", step_profile)
    monkeypatch.setattr(agree, "judge", judge)
    monkeypatch.setattr(agree, "oracle_tokens", lambda *a: (None, None))
    spec = get_spec("tiny-qwen2")
    rows = profile.profile_rows(spec, random_weights(spec, 0), "cpu", ctx=6,
                                rungs=("fused eager", "fused + graph", "+ split-K"),
                                read_tbps=1.0)
    assert judged == [("plain", False, False, 6), ("plain", False, True, 6), ("splitk", False, True, 6)]
    assert profiled == [("plain", False, 6, 6 + 12 + 100 + 64), ("plain", True, 6, 182)]
    assert [r["rung"] for r in rows] == ["fused eager", "fused + graph", "+ split-K"]
    assert rows[-1]["refused"] and rows[-1]["ms"] is None and rows[0]["agree"] == "2/2"
    from onelaunch.measure.agree import failures
    assert failures(rows) == [rows[-1]]
    def fails(e, ctx, replays, read_tbps, graph=True, trace_path=None):
        raise ProfileError("kernel 3 of 9 ('x') should be launch 3")
    monkeypatch.setattr(profile, "step_profile", fails)
    rows = profile.profile_rows(spec, random_weights(spec, 0), "cpu", ctx=6,
                                rungs=("fused + graph",), read_tbps=1.0)
    assert len(rows) == 1 and rows[0]["error"].startswith("ProfileError: kernel 3")
    assert failures(rows) == rows
    fig = profile_figures.draw_profile(synthetic_rows() + [dict(rows[0], model="qwen2.5-1.5b",
                                                        rung="+ RoPE in attention")])
    import matplotlib
    words = " ".join(t.get_text() for t in fig.findobj(matplotlib.text.Text))
    assert "no profile (error)" in words
    import matplotlib.pyplot as plt
    plt.close(fig)
    with pytest.raises(ProfileError, match="unknown rung"):
        profile.profile_rows(spec, {}, "cpu", rungs=("+ nothing",))


def test_lead_in_leaves_out_a_sessions_lost_or_corrupt_head():
    """CUPTI can lose or corrupt a recording's first kernel records: the recording runs
    lead-in steps first and the replays are taken from the last kernel backwards."""
    plan = layer_plan()
    n = len(plan)
    ev = events_for(plan, 2 + 5, overlap=1.0, t=1e6)
    clean = attribute(ev[2 * n:], plan, replays=5, read_tbps=1.0)
    lost = ev[3:]                                             # head records lost
    corrupt = [(name, s - 1e11, e - 1e11) if i < 2 else (name, s, e)
               for i, (name, s, e) in enumerate(ev)]          # ~1e14 ns early
    for head in (lost, corrupt, ev):
        rows = attribute(head, plan, replays=5, read_tbps=1.0, lead_in=2)
        assert [(r["op"], r["ms"]) for r in rows] == [(r["op"], r["ms"]) for r in clean]
        assert rows[0]["replays"] == 5
    assert attribute(corrupt, plan, replays=5, lead_in=2)[0]["bad_timestamps"] == 2
    assert attribute(ev, plan, replays=5, lead_in=2)[0]["lead_in_kernels"] == 2 * n
    with pytest.raises(ProfileError, match="kernel 1 of .* should be launch 1 of replay 1"):
        attribute(lost, plan, replays=7)                      # without a lead-in: an error
    with pytest.raises(ProfileError, match="more than the lead-in's 1 steps"):
        attribute(ev, plan, replays=5, lead_in=1)
    with pytest.raises(ProfileError, match="make 4 whole replays .* not the 5"):
        attribute(ev[2 * n + 1:], plan, replays=5, lead_in=2)      # a replay short
    broken = list(ev)
    broken[-3] = ("_embed_kernel", *broken[-3][1:])
    with pytest.raises(ProfileError, match="kernel 3 from the last .* should be launch"):
        attribute(broken, plan, replays=5, lead_in=2)


def test_clock_phases_reads_the_stamps():
    """Two layers, two programs, two phases (stamps in ns): each phase's span, median
    work, skew and the release after its last arrival; the last phase's release is the
    gap to the next layer's first start."""
    us = 1000
    layer = lambda t0: [[t0, t0 + 4 * us, t0 + 5 * us, t0 + 9 * us],          # program 0
                        [t0 + 1 * us, t0 + 3 * us, t0 + 6 * us, t0 + 8 * us]]  # program 1
    clock = torch.tensor([layer(100 * us), layer(120 * us)], dtype=torch.int64)
    rows = profile.clock_phases(clock, ["a", "b"])
    assert [r["phase"] for r in rows] == ["a", "b"]
    a, b = rows                  # (torch's median of two values is the lower one)
    assert (a["span"], a["work"], a["skew"], a["release"]) == (4, 2, 1, 1)
    assert (b["span"], b["work"], b["skew"], b["release"]) == (4, 2, 1, 11)
    clock[:, :, 0] = 0                                   # phase a not stamped: left out
    assert [r["phase"] for r in profile.clock_phases(clock, ["a", "b"])] == ["b"]


def clock_rows():
    """Phase rows as ``phase_rows`` makes them: Qwen's clock (us) in
    results/h200/2026-11-30_persistent-layer-clock/, the bytes at 4 TB/s."""
    lp = __import__("importlib").import_module("onelaunch.kernels.layer_persistent")
    clock = [(4.5, 4.0, 0.75, 6.3e6), (2.5, 0.75, 0.75, 0), (4.25, 0.25, 0.75, 5.2e5),
             (3.0, 0.25, 0.75, 0), (3.5, 2.75, 0.75, 4.7e6), (16.75, 14.5, 0.75, 5.5e7),
             (9.5, 8.25, 1.5, 2.75e7)]
    rows = []
    for ph, (span, work, rel, b) in zip(lp.PHASES, clock):
        need = b / 4e6
        rows.append({"model": "qwen2.5-1.5b", "phase": ph, "span_us": span, "work_us": work,
                     "release_us": rel, "need_us": need, "bytes_us": min(need, work),
                     "beyond_us": max(work - need, 0.0), "wait_us": span - work,
                     "skew_us": 0.0, "layers": 28})
    return rows


def test_phase_rows_needs_a_cuda_gpu():
    with pytest.raises(ProfileError, match="needs a CUDA GPU"):
        profile.phase_rows(get_spec("tiny-qwen2"), {}, "cpu", ctx=4)


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
def test_the_chains_launches_pair_with_the_phases(name):
    """phase_rows takes each phase's bytes from the chain's launch in the same place."""
    lp = __import__("importlib").import_module("onelaunch.kernels.layer_persistent")
    spec = get_spec(name)
    chain = rungs.RUNGS["+ PDL"].engine(spec, random_weights(spec, 0), 32)
    ops = [L.op for L in chain.plan if L.layer == 0]
    phases = lp.MOE_PHASES if spec.is_moe else lp.PHASES
    assert len(ops) == len(phases)
    assert ops[:5] == list(phases[:5])


def test_draw_phases_and_its_caption_add_up():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = clock_rows() + [{"model": "olmoe-1b-7b", "phase": None, "error": "x"}]
    fig = profile_figures.draw_phases(rows)
    assert fig.get_size_inches()[0] == pytest.approx(6.5)
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_text().strip()]
    words = " ".join(t.get_text() for t in texts)
    total = sum(r["span_us"] + r["release_us"] for r in clock_rows())
    assert f"one layer, {total:.3g} µs" in words and "rope_kv_write" in words
    assert "waiting for the slowest program" in words
    assert min(t.get_fontsize() for t in texts) >= 10
    plt.close(fig)
    cap = profile_figures.phase_caption(rows)
    assert cap.startswith(f"qwen2.5-1.5b: one layer takes {total:.3g} µs")
    assert "(rope_kv_write, attention_partial, attention_reduce)" in cap and "most in attention_partial" in cap
    assert f"{total * 28 / 1e3:.3g} ms" in cap and "olmoe" not in cap
    with pytest.raises(ValueError, match="no rows"):
        profile_figures.draw_phases([{"model": "m", "phase": None}])


def test_a_folded_phase_has_no_barrier_of_its_own():
    """RoPE folded into attention (FOLD_ROPE): its row stays (its stamps' time counts in
    the layer), labelled as inside the next phase, and the caption counts one release
    fewer, without the folded row's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = clock_rows()
    rows[1].update(span_us=0.25, work_us=0.0, wait_us=0.25, release_us=-0.25,
                   inside="attention_partial")
    cap = profile_figures.phase_caption(rows)
    rel = sum(r["release_us"] for i, r in enumerate(rows) if i != 1)
    assert f"the 6 releases take {rel:.2g} µs (rope_kv_write runs inside attention_partial" in cap
    fig = profile_figures.draw_phases(rows)
    words = " ".join(t.get_text() for t in fig.findobj(matplotlib.text.Text))
    assert "rope_kv_write (in the next)" in words
    plt.close(fig)


def test_tp_split_draws_compute_then_communication():
    import matplotlib
    matplotlib.use("Agg")
    rows = [{"rung": "one GPU", "ms_per_token": 1.2},
            {"rung": "nccl", "ms_per_token": 1.28, "compute_ms": 0.82, "comm_ms": 0.46},
            {"rung": "fused", "ms_per_token": 0.97},          # no split measured: grey
            {"rung": "none", "ms_per_token": 0.82}]
    fig = profile_figures.draw_tp_split([("m", rows)])
    ax = fig.axes[0]
    bars = [(round(p.get_x(), 3), round(p.get_width(), 3)) for p in ax.patches]
    assert bars == [(0, 0.82), (0.82, 0.46), (0, 0.97)]      # compute, comm after it, whole
    assert [t.get_text() for t in ax.get_yticklabels()] == ["nccl", "fused"]
    assert ax.lines[0].get_xdata()[0] == 1.2                 # the one-GPU step, dashed
