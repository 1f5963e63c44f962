"""Lab probe (GPU): is the persistent layer (one launch a dense layer) bit-identical to
the chain at full shape, and how many ms a token does it take at each num_warps, grid,
pipeline depth and tile? Qwen2.5-1.5B (or ``--model``), seeded random weights: bits
against the split-K + PDL engine, then ms per token.

    python lab/persistent_check.py [OUT.json] [--ctx 512] [--warps 4,8] [--grids 1,2]
                                   [--timeout 150] [--variants 4:4:8x512:2,8:6:8x512:1]
                                   [--persist clock=1,pdl=0,split=0-4,5-6]

(On a CPU, ``TRITON_INTERPRET=1 python lab/persistent_check.py /tmp/p.json --model
tiny-qwen2 --ctx 8 --steps 2 --iters 2 --warps 4 --grids 1`` is a dry run of the script.)

Measured (every variant bit-identical to its reference;
`results/h200/2026-11-30_tp-peer-and-split-caps/persistent_check.json`): the register
ring, best at 4 warps and 2 programs an SM, 1.904 ms against the chain's 1.19;
`results/h200/2026-11-30_persistent-layer/persistent_stream.json`: streamed through
shared memory, 1.54 ms; `results/h200/2026-11-30_persistent-layer-variants/`: each op's
own tiles; `results/h200/2026-11-30_persistent-layer-clock/`: 3-4 programs an SM slower,
and the phases' clock (a layer 50 us, a quarter of it in the three weightless phases);
`results/h200/2026-11-30_o-merge-and-l2-prefetch/fold_qwen_*.json`: RoPE folded into the
attention phase (``--persist fold_rope=1``).

Writes OUT.json (default $OUT/persistent.json, else ./persistent.json) and prints it.
Each num_warps runs in a child process under a timeout (a persistent kernel whose
programs are not all resident would spin forever; the child also has a watchdog thread
that ends it with os._exit), so the check always ends. A child:

  * builds four engines on one set of weights: ``pdl`` (split-K + PDL, the tuned launch
    configurations: the engine's default), ``ref`` (the same at the persistent kernel's
    num_warps: ``plan.persistent_cfgs``, the bit-for-bit reference; equal to ``pdl`` when
    every tuned op already runs at those warps), ``persistent`` and ``persistent_noprefetch``
    (NEXT=0: no weight tile requested before a barrier);
  * gives all four the same random KV cache up to ``ctx`` and runs 16 CUDA-graph steps in
    lockstep: x, logits and the token must equal ``ref``'s bit for bit after every step
    (``x_identical``), and the tokens are compared with ``pdl``'s;
  * times each (graph replay, ``timing.time_ms``, every engine from the same position);
  * repeats the check and the timing of ``persistent`` at other grid sizes (``--grids``:
    programs per SM; a grid that cannot be co-resident fails to launch, recorded);
  * records the compiled persistent kernel's registers and spills (``n_regs``,
    ``n_spills``), the grid, and whether the launch was cooperative and PDL.

``--variants``: one child each, in place of ``--warps``:
``warps:stages:tile:per_sm``
(stages 0: the register ring; N > 0: the GEMV phases streamed through shared memory,
``stream_gemv``; tile ``BNxBK``, ``own`` for the ops' own tiles, or empty for the
table's TILE).

``--persist``: the persistent engines' ``onelaunch.options.PersistentOptions``, as
``field=value`` pairs: grid (programs), per_sm, coop=0 (plain launch), pdl=0 (no PDL on
the layer kernel), split=1 (one launch per phase, no barrier: isolates a barrier bug),
split=0-4,5-7 (those groups of phases, one launch each), stages, tile, fold_rope=1,
clock=1 (each program stamps %globaltimer at every phase's start and end; ``clock_us`` in
the report: per phase, its span, the median program's work, the skew and the release
after the last arrival, ``measure.profile.clock_phases``). A comma inside split's
groups stays with split (``split=0-4,5-7,clock=1``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MODEL = "qwen2.5-1.5b"
STEPS = 16


def _text(b) -> str:
    return b.decode("utf8", "replace") if isinstance(b, bytes) else (b or "")


def parent(a) -> int:
    out = a.out or os.path.join(os.environ.get("OUT", "."), "persistent.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    report = {"model": a.model, "ctx": a.ctx, "children": []}
    t0 = time.time()
    runs = ([dict(zip(("warps", "stages", "tile", "per_sm"),
                      v.split(":")))
             for v in a.variants.split(",")] if a.variants
            else [{"warps": v} for v in a.warps.split(",")])
    for i, var in enumerate(runs):
        w = int(var["warps"])
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--warps", str(w),
               "--grids", "" if a.variants else a.grids, "--ctx", str(a.ctx), "--timeout", str(a.timeout),
               "--model", a.model, "--steps", str(a.steps), "--iters", str(a.iters)]
        child_out = f"{out}.{i}.part"
        cmd += [child_out]
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        persist = [a.persist] if a.persist else []
        persist += [f"{k}={var[k]}" for k in ("stages", "tile", "per_sm") if var.get(k)]
        cmd[-1:-1] = ["--persist", ",".join(persist)]
        t = time.time()
        try:
            r = subprocess.run(cmd, env=env, timeout=a.timeout + 15, capture_output=True, text=True)
            rc, tail = r.returncode, (r.stdout + r.stderr)[-3000:]
        except subprocess.TimeoutExpired as ex:
            rc, tail = "timeout", _text(ex.stdout)[-1500:] + _text(ex.stderr)[-1500:]
        res = {}
        if os.path.exists(child_out):
            with open(child_out) as f:
                res = json.load(f)
            os.remove(child_out)
        res.update(warps=w, variant=var, rc=rc, child_s=round(time.time() - t, 1))
        if rc != 0:
            res["tail"] = tail
        report["children"].append(res)
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    report["total_s"] = round(time.time() - t0, 1)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    ok = all(c.get("rc") == 0 and c.get("x_identical") for c in report["children"])
    print("PERSISTENT CHECK", "OK" if ok else "FAILED", "->", out)
    return 0 if ok else 1


def child(a) -> int:
    res: dict = {"stage": "start"}

    def save():
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)

    def watchdog():
        res["watchdog"] = f"killed after {a.timeout} s at stage {res.get('stage')}"
        try:
            save()
        finally:
            os._exit(3)
    timer = threading.Timer(a.timeout, watchdog)
    timer.daemon = True
    timer.start()

    import dataclasses

    import torch
    from onelaunch import plan
    from onelaunch.engine import Engine
    from onelaunch.specs import get_spec
    from onelaunch.measure.timing import time_ms
    from onelaunch.weights import random_weights
    from onelaunch.kernels import layer_persistent as LP
    from onelaunch.measure.profile import clock_phases

    spec = get_spec(a.model)
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")    # cpu: a dry run of this script (interpreter)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if gpu else 3
    res.update(gpu=torch.cuda.get_device_name(dev) if gpu else "cpu (dry run)", sms=sms)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    STEPS = a.steps
    res["stage"] = "weights"
    save()
    w = random_weights(spec, 0, device=dev)
    max_ctx = a.ctx + STEPS + 2 * a.iters + 64
    lp = {"num_warps": int(a.warps)}
    po = persist_options(a.persist)
    res["persist"] = dataclasses.asdict(po)
    res["stage"] = "engines"
    save()
    eng = {"persistent": Engine(spec, w, max_ctx=max_ctx, pdl=True, persistent=True,
                                cfgs={"layer_persistent": dict(lp, NEXT=1)}, persist=po)}
    cfgs = plan.persistent_cfgs(eng["persistent"])
    res["cfgs"] = cfgs
    eng["persistent_noprefetch"] = Engine(spec, w, max_ctx=max_ctx, pdl=True, persistent=True,
                                          cfgs={"layer_persistent": dict(lp, NEXT=0)},
                                          persist=po)
    eng["ref"] = Engine(spec, w, max_ctx=max_ctx, pdl=True, cfgs=cfgs)
    eng["pdl"] = Engine(spec, w, max_ctx=max_ctx, pdl=True)
    res["launches"] = {k: e.launches_per_step() for k, e in eng.items()}
    res["pdl_on"] = {k: e.pdl for k, e in eng.items()}
    res["grid"] = LP.grid_size(dev, cfgs["layer_persistent"], po)
    res["launch_options"] = LP.launch_options(dev, eng["persistent"].pdl,
                                              cfgs["layer_persistent"], po)
    del w
    if gpu:
        torch.cuda.empty_cache()

    g = torch.Generator().manual_seed(1)
    shape = (spec.layers, spec.kv_heads, max_ctx, spec.head_dim)
    kc = (torch.randn(shape, generator=g) * 0.5).to(torch.bfloat16).to(dev)
    vc = (torch.randn(shape, generator=g) * 0.5).to(torch.bfloat16).to(dev)
    toks = torch.randint(0, spec.vocab, (a.ctx + 1,), generator=g)

    def rewind(e):
        e.adopt_cache(kc, vc, a.ctx, toks)

    def lockstep(names) -> dict:
        """16 graph steps of ``ref`` and ``names`` from the same state; bits after each."""
        for n in ["ref", "pdl", *names]:
            rewind(eng[n])
        r = {n: {"x_identical": True, "tokens_equal_ref": True, "tokens_equal_pdl": True}
             for n in names}
        r["ref_vs_pdl_x_identical"] = True
        for _ in range(STEPS):
            for n in ["ref", "pdl", *names]:
                eng[n].step(True)
            sync()
            ref, pdl = eng["ref"], eng["pdl"]
            p = int(ref.pos)
            r["ref_vs_pdl_x_identical"] &= bool(torch.equal(ref.x.view(torch.int16), pdl.x.view(torch.int16)))
            for n in names:
                e = eng[n]
                r[n]["x_identical"] &= bool(torch.equal(e.x.view(torch.int16), ref.x.view(torch.int16))
                                            and torch.equal(e.logits, ref.logits))
                r[n]["tokens_equal_ref"] &= int(e.seq[p]) == int(ref.seq[p])
                r[n]["tokens_equal_pdl"] &= int(e.seq[p]) == int(pdl.seq[p])
        r["tokens"] = eng["ref"].seq[a.ctx + 1: a.ctx + 1 + STEPS].tolist()
        return r

    def timed(n) -> float:
        rewind(eng[n])
        return round(time_ms(lambda: eng[n].step(True), iters=a.iters, warmup=min(20, a.iters),
                             device=dev).median_ms, 4)

    res["stage"] = "capture"
    save()
    for n, e in eng.items():
        try:
            e.capture()
        except Exception as ex:                                   # noqa: BLE001
            res.setdefault("errors", {})[n] = repr(ex)[:500]
    if "errors" in res:
        save()
        return 2
    res["stage"] = "bits"
    save()
    bits = lockstep(["persistent", "persistent_noprefetch"])
    res["bits"] = bits
    res["x_identical"] = bits["persistent"]["x_identical"] and bits["persistent_noprefetch"]["x_identical"]
    res["stage"] = "timing"
    save()
    res["ms_per_token"] = {n: timed(n) for n in ("pdl", "ref", "persistent", "persistent_noprefetch")}
    save()
    clock = eng["persistent"].buffers.get("layer_clock")
    if clock is not None:      # --persist clock=1: the last timed replay's stamps
        torch.cuda.synchronize(dev)
        res["clock_us"] = clock_phases(clock, LP.MOE_PHASES if spec.is_moe else LP.PHASES)
        save()

    res["stage"] = "grids"
    res["grids"] = []
    for per_sm in [float(v) for v in a.grids.split(",") if v]:
        programs = max(1, int(per_sm * sms))
        if programs == res["grid"]:
            continue                                  # the default grid, measured above
        row = {"programs": programs}
        try:
            for n in ("persistent", "persistent_noprefetch"):
                eng[n].replan(persist=dataclasses.replace(po, grid=programs))
                eng[n].capture()
            b = lockstep(["persistent", "persistent_noprefetch"])
            row["x_identical"] = b["persistent"]["x_identical"] and b["persistent_noprefetch"]["x_identical"]
            row["ms_per_token"] = {n: timed(n) for n in ("persistent", "persistent_noprefetch")}
        except Exception as ex:                                   # noqa: BLE001
            row["error"] = repr(ex)[:500]
        res["grids"].append(row)
        save()
    for n in ("persistent", "persistent_noprefetch"):
        eng[n].replan(persist=po)

    res["stage"] = "kernel"
    try:           # one more eager launch of layer 0 returns the compiled kernel (state is spent)
        k = [L for L in eng["persistent"].plan if L.op == "layer_persistent"][0].run()[0]
        res["kernel"] = {"n_regs": getattr(k, "n_regs", None), "n_spills": getattr(k, "n_spills", None),
                         "num_warps": k.metadata.num_warps, "shared": k.metadata.shared,
                         "launch_cooperative_grid": getattr(k.metadata, "launch_cooperative_grid", None),
                         "launch_pdl": getattr(k.metadata, "launch_pdl", None)}
        sync()
    except Exception as ex:                                       # noqa: BLE001
        res["kernel"] = repr(ex)[:500]
    res["stage"] = "done"
    save()
    timer.cancel()
    return 0


def persist_options(text: str):
    """``--persist`` (``field=value,...``) as ``PersistentOptions``; split's groups keep
    their commas (a part without ``=`` belongs to the field before it)."""
    import dataclasses

    from onelaunch.options import PersistentOptions
    kv: dict[str, str] = {}
    last = None
    for part in filter(None, (text or "").split(",")):
        k, eq, v = part.partition("=")
        if not eq and last:
            kv[last] += "," + part
            continue
        kv[k.strip()] = v.strip()
        last = k.strip()
    types = {f.name: f.type for f in dataclasses.fields(PersistentOptions)}
    out = {}
    for k, v in kv.items():
        if k not in types:
            raise SystemExit(f"--persist: unknown field {k!r} (fields: {', '.join(types)})")
        t = str(types[k])
        out[k] = (v if "str" in t else bool(int(v)) if "bool" in t else int(v))
    return PersistentOptions(**out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--warps", default="4,8", help="num_warps of the persistent kernel, one child each")
    ap.add_argument("--grids", default="1,2,0.5", help="programs per SM to try (1: the default)")
    ap.add_argument("--variants", default="", help="warps:stages:tile:per_sm, one child each")
    ap.add_argument("--timeout", type=int, default=150, help="seconds a child may take")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--steps", type=int, default=STEPS, help="lockstep steps compared bit for bit")
    ap.add_argument("--iters", type=int, default=200, help="timed graph replays per engine")
    ap.add_argument("--persist", default="", help="PersistentOptions fields, "
                    "field=value,... (clock=1,pdl=0,split=0-4,5-6)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    return child(a) if a.child else parent(a)


if __name__ == "__main__":
    sys.exit(main())
