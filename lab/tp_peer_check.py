"""Lab probe (2 GPUs): are the fused TP kernels bit-for-bit the unfused path, replayed in
a CUDA graph, and what does the exchange cost per call inside a graph?

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 torchrun --nproc-per-node 2 \
        lab/tp_peer_check.py
    python lab/tp_peer_check.py            # the same: spawns the 2 ranks itself
    TP_CHECK_ONLY=down python lab/tp_peer_check.py   # the fused split-K down alone

Measured (`results/h200/2026-11-30_tp-peer-and-split-caps/tp_peer_check.json`): the fused
exchange hung on 50 fused downs in one graph until a race in ``peer_sum`` was fixed; after
the fix 100 checked replays bit-identical on both ranks, the split-K down 7.2 us a call
fused against 4.8 plain, the MoE expert down 11.0 against 8.9.

Shapes are one rank's of TP=2 on the real models: Qwen2.5-1.5B (hidden 1536; O K = 768,
down K = 4480, lm_head 75968 rows per rank) and OLMoE-1B-7B (hidden 2048; O K = 1024; 64
experts with I = 512 per rank, top-8; q/k 1024 + 1024 per rank). Weights are seeded random.

Correctness: each case's graph restores its inputs, runs the fused kernel (``peer=``) and
compares the result on the GPU with the unfused reference (partials from ``out=``, gathered
with NCCL, summed in rank order, ``residual_add``; LM head keys summed, ``argmax_merge``),
counting mismatches on the device; replayed 100 times. The LM head's weights hold an exact
tie between a row of each rank (the lower global index must win).

Timing, per call inside one graph of CALLS launches (median over reps, both ranks at once):
allreduce_residual alone, and each fused GEMV against the same kernel without the exchange.

Writes $OUT/tp_peer.json (rank 0). Every host wait is bounded (an event polled with a
deadline, and a watchdog over the whole run); the script ends with os._exit (never
destroy_process_group after a captured collective: it hangs on these machines).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback

for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
             ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[k] = v            # NVLink multicast stays off on these machines
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

WATCHDOG_S = float(os.environ.get("TP_CHECK_WATCHDOG_S", 500))
REPLAYS, REPS = 100, 15
CALLS = int(os.environ.get("TP_CHECK_CALLS", 50))


def main(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    from onelaunch import kernels as K
    from onelaunch.kernels import config

    threading.Timer(WATCHDOG_S, lambda: (print(f"rank {rank}: watchdog", flush=True),
                                         os._exit(3))).start()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", device_id=dev)
    R = {"world": world, "device": torch.cuda.get_device_name(dev)}
    pdl = config.pdl_supported(dev) and os.environ.get("TP_CHECK_PDL", "1") == "1"
    only = os.environ.get("TP_CHECK_ONLY", "")        # time only the cases naming this
    bf, f32, i32 = torch.bfloat16, torch.float32, torch.int32

    def log(*a):
        if rank == 0:
            print(*a, flush=True)

    def wait(timeout=60.0, what=""):
        ev = torch.cuda.Event()
        ev.record()
        t0 = time.time()
        while not ev.query():
            if time.time() - t0 > timeout:
                print(f"rank {rank}: timed out waiting for {what}", flush=True)
                json_out({**R, "error": f"rank {rank} timed out: {what}"})
                os._exit(2)
            time.sleep(1e-4)

    def json_out(res):
        if rank == 0:
            path = os.path.join(os.environ.get("OUT", "."), "tp_peer.json")
            with open(path, "w") as f:
                json.dump(res, f, indent=1)

    def barrier():
        wait(60, "before a barrier")
        dist.barrier()

    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(bf)

    def gather(t):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        return parts

    def rank_sum(t):               # an all-reduce in rank order: what peer_sum must give
        parts = gather(t)
        s = parts[0].clone()
        for p in parts[1:]:
            s = s + p
        return s

    bufs = K.peer.PeerBuffers.cuda(dist.group.WORLD.group_name, rank, world, sites=20, n_max=4096,
                              tiles_max=1024, device=dev)
    barrier()

    # ---- inputs (the same seed on both ranks: the full weights, then this rank's slice)
    def cols(t, dim=-1):
        n = t.shape[dim] // world
        return t.narrow(dim, rank * n, n).contiguous()

    Q = dict(H=1536, KO=1536, KD=8960, V=151936)
    O = dict(H=2048, KO=2048, E=64, I=1024, top=8, q=2048, kv=2048)
    q_x = rnd(Q["H"])
    q_wo, q_a = cols(rnd(Q["H"], Q["KO"], scale=0.03)), cols(rnd(Q["KO"]))
    q_wd, q_h = cols(rnd(Q["H"], Q["KD"], scale=0.02)), cols(rnd(Q["KD"]))
    # the LM head: an exact tie of the maximum between global rows 1000 (rank 0) and
    # V/2 + 5 (rank 1): rows equal to the normalised x, far above every random logit
    g = torch.ones(Q["H"], dtype=bf, device=dev)
    xh = rnd(Q["H"])
    xn = (xh.float() * torch.rsqrt(xh.float().pow(2).mean() + 1e-6)).to(bf)
    w_head = rnd(Q["V"], Q["H"], scale=0.05)
    tie = (1000, Q["V"] // 2 + 5)
    w_head[list(tie)] = xn
    vr = Q["V"] // world
    w_head_r = w_head[rank * vr:(rank + 1) * vr].contiguous()
    del w_head
    o_x = rnd(O["H"])
    o_wo, o_a = cols(rnd(O["H"], O["KO"], scale=0.03)), cols(rnd(O["KO"]))
    o_wd = cols(rnd(O["E"], O["H"], O["I"], scale=0.03))
    o_h = cols(rnd(O["top"], O["I"]))
    ids = torch.randperm(O["E"], generator=gen, device=dev)[:O["top"]].to(i32)
    wts = torch.rand(O["top"], generator=gen, device=dev) / 4
    qkv_full = rnd(3, 16, 128)                               # OLMoE q, k, v heads
    qkv = qkv_full[:, rank * 8:(rank + 1) * 8].reshape(-1).contiguous()
    partial = torch.randn(Q["H"], generator=gen, device=dev) * (rank + 1)

    def scratch(n):
        return torch.empty(64 * n, dtype=f32, device=dev), torch.zeros(n, dtype=i32, device=dev)

    # ---- the cases: (name, fused(x) in place, unfused partial(x) -> fp32 [N], x0)
    sc_d, cnt_d = scratch(Q["H"])
    sc_m, cnt_m = scratch(O["H"])
    cases = {
        "o_proj_qwen": (lambda x, **kw: K.o_proj_residual.o_proj_residual(q_a, q_wo, x, use_pdl=pdl, **kw), q_x, 0),
        "down_qwen": (lambda x, **kw: K.down_residual.down_residual(q_h, q_wd, x, sc_d, cnt_d, use_pdl=pdl,
                                                      **kw), q_x, 1),
        "o_proj_olmoe": (lambda x, **kw: K.o_proj_residual.o_proj_residual(o_a, o_wo, x, use_pdl=pdl, **kw), o_x, 2),
        "moe_down_olmoe": (lambda x, **kw: K.moe_experts.moe_down_residual(o_h, o_wd, ids, wts, x, sc_m, cnt_m,
                                                               use_pdl=pdl, **kw), o_x, 3),
        "allreduce_residual": (None, q_x, 4),
    }
    R["correct"], R["timing_us"] = {}, {}

    def graph(fn):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        g_ = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g_, stream=s):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        return g_

    def replay_checked(fn, ref_check, n=REPLAYS):
        """fn restores inputs and runs the fused kernel; ref_check() -> bool tensor of
        mismatch. Captured together; the mismatches counted on the device."""
        bad = torch.zeros(1, dtype=torch.int64, device=dev)

        def body():
            fn()
            bad.add_(ref_check().to(torch.int64))
        body()                                          # eager once (compiles)
        barrier()
        g_ = graph(body)
        barrier()
        bad.zero_()
        for _ in range(n):
            g_.replay()
        wait(120, "the checked replays")
        return int(bad.item())

    for name, (fn, x0, site) in cases.items():
        if only and only not in name:
            continue
        try:
            x = x0.clone()
            if fn is None:                               # allreduce_residual
                ref = x0.clone()
                K.tp_ops.residual_add(rank_sum(partial), ref)
                run = lambda: (x.copy_(x0), K.tp_ops.allreduce_residual(partial, x, bufs.site(site), use_pdl=pdl))  # noqa: E731
            else:
                out = torch.full((x0.numel(),), float("nan"), dtype=f32, device=dev)
                fn(x0.clone(), out=out)
                ref = x0.clone()
                K.tp_ops.residual_add(rank_sum(out), ref)
                run = lambda fn=fn, site=site: (x.copy_(x0), fn(x, peer=bufs.site(site)))  # noqa: E731
            bad = replay_checked(run, lambda: (x != ref).any())
            parts = gather(x)
            same = all(torch.equal(p, parts[0]) for p in parts)
            R["correct"][name] = {"mismatched_replays": bad, "ranks_identical": same,
                                  "equal_unfused": bad == 0}
            log(name, R["correct"][name])
        except Exception:
            R["correct"][name] = {"error": traceback.format_exc()[-1500:]}
            log(name, R["correct"][name])

    # LM head: fused (peer) against keys + argmax_merge; the tie must go to row 1000
    try:
        n_prog = K.lm_head_argmax.programs_for(vr, dev, Q["H"])
        lg = torch.empty(vr, dtype=f32, device=dev)
        pv, pi = torch.empty(n_prog, dtype=f32, device=dev), torch.empty(n_prog, dtype=i32, device=dev)
        cnt = torch.zeros(1, dtype=i32, device=dev)
        plen = torch.zeros(1, dtype=i32, device=dev)

        def head(seq, pos, am, **kw):
            K.lm_head_argmax.lm_head_argmax(xh, g, w_head_r, lg, pv, pi, cnt, seq, pos, plen, 1e-6, use_pdl=pdl,
                             argmax=am, vocab_offset=rank * vr, **kw)
        keys = torch.zeros(2 * world, dtype=f32, device=dev)
        st_ref = [torch.zeros(16, dtype=i32, device=dev), torch.full((1,), 3, dtype=i32, device=dev),
                  torch.full((16,), -1, dtype=i32, device=dev)]
        head(*[t.clone() for t in st_ref], keys=keys, rank=rank, world=world)
        ref_st = [t.clone() for t in st_ref]
        K.tp_ops.argmax_merge(rank_sum(keys), ref_st[0], ref_st[1], plen, world, argmax=ref_st[2])
        st = [t.clone() for t in st_ref]

        def run_head():
            for t, t0 in zip(st, st_ref):
                t.copy_(t0)
            head(*st, peer=bufs.site(5))
        bad = replay_checked(run_head, lambda: torch.stack([(a != b).any() for a, b in zip(st, ref_st)]).any())
        R["correct"]["lm_head_qwen"] = {"mismatched_replays": bad, "equal_unfused": bad == 0,
                                        "token": int(ref_st[0][4]), "tie_rows": list(tie),
                                        "tie_to_lower": int(ref_st[0][4]) == tie[0]}
        log("lm_head_qwen", R["correct"]["lm_head_qwen"])
    except Exception:
        R["correct"]["lm_head_qwen"] = {"error": traceback.format_exc()[-1500:]}
        log(R["correct"]["lm_head_qwen"])

    # qk_sumsq: fused against local sums gathered and summed in rank order
    try:
        ss_l = torch.empty(2, dtype=f32, device=dev)
        K.tp_ops.qk_sumsq(qkv, ss_l, 1024, 1024)
        ss_ref = rank_sum(ss_l)
        ss = torch.empty(2, dtype=f32, device=dev)
        bad = replay_checked(lambda: K.tp_ops.qk_sumsq(qkv, ss, 1024, 1024, use_pdl=pdl, peer=bufs.site(6)),
                             lambda: (ss != ss_ref).any())
        R["correct"]["qk_sumsq_olmoe"] = {"mismatched_replays": bad, "equal_unfused": bad == 0}
        log("qk_sumsq_olmoe", R["correct"]["qk_sumsq_olmoe"])
    except Exception:
        R["correct"]["qk_sumsq_olmoe"] = {"error": traceback.format_exc()[-1500:]}

    # ---- timing: CALLS launches in one graph, per call, median of REPS replays
    def time_graph(fn):
        fn()
        barrier()
        g_ = graph(lambda: [fn() for _ in range(CALLS)])
        ts = []
        for _ in range(REPS):
            barrier()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g_.replay()
            b.record()
            wait(60, "a timed replay")
            ts.append(a.elapsed_time(b) * 1e3 / CALLS)
        ts.sort()
        return round(ts[len(ts) // 2], 2)

    def timed(name, fn):
        if only not in name:
            return
        try:
            R["timing_us"][name] = time_graph(fn)
        except Exception:
            R["timing_us"][name] = "error: " + traceback.format_exc()[-800:]
        log(name, R["timing_us"][name])

    xq, xo = q_x.clone(), o_x.clone()
    timed("allreduce_residual", lambda: K.tp_ops.allreduce_residual(partial, xq, bufs.site(8), use_pdl=pdl))
    timed("residual_add (unfused tail, no exchange)", lambda: K.tp_ops.residual_add(partial, xq, use_pdl=pdl))
    for name, (fn, x0, site) in cases.items():
        if fn is None:
            continue
        x = xq if x0 is q_x else xo
        timed(f"{name} fused", lambda fn=fn, x=x, site=site: fn(x, peer=bufs.site(9 + site)))
        timed(f"{name} plain", lambda fn=fn, x=x: fn(x))
        if only:
            print(rank, name, "counters", int(cnt_d.abs().sum()), int(cnt_m.abs().sum()),
                  "seqno", bufs.seqno[9 + site, :4].tolist(), flush=True)
        p, f = R["timing_us"].get(f"{name} plain"), R["timing_us"].get(f"{name} fused")
        if isinstance(p, float) and isinstance(f, float):
            R["timing_us"][f"{name} fused - plain"] = round(f - p, 2)
    st = [torch.zeros(16, dtype=i32, device=dev), torch.zeros(1, dtype=i32, device=dev),
          torch.zeros(16, dtype=i32, device=dev)]
    # (pos advances each call: keep it inside the 16-slot buffers by resetting it)
    timed("lm_head_qwen plain", lambda: (st[1].zero_(), head(*st)))
    timed("lm_head_qwen fused", lambda: (st[1].zero_(), head(*st, peer=bufs.site(16))))
    timed("qk_sumsq plain", lambda: K.tp_ops.qk_sumsq(qkv, ss, 1024, 1024, use_pdl=pdl))
    timed("qk_sumsq fused", lambda: K.tp_ops.qk_sumsq(qkv, ss, 1024, 1024, use_pdl=pdl, peer=bufs.site(17)))
    R["pdl"] = pdl
    R["ok"] = all(v.get("equal_unfused", False) and v.get("ranks_identical", True)
                  for v in R["correct"].values())
    log(json.dumps(R, indent=1))
    json_out(R)
    wait(60, "the end")
    os._exit(0)


def _spawned(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    try:
        main(rank, world)
    except Exception:
        traceback.print_exc()
        os._exit(1)


if __name__ == "__main__":
    if "RANK" in os.environ:
        main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    else:
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        ps = [ctx.Process(target=_spawned, args=(r, 2, 29511)) for r in range(2)]
        for p in ps:
            p.start()
        deadline = time.time() + WATCHDOG_S + 60
        for p in ps:
            p.join(timeout=max(1.0, deadline - time.time()))
        codes = [p.exitcode for p in ps]
        for p in ps:
            if p.is_alive():
                p.terminate()
        print("exit codes", codes, flush=True)
        os._exit(0 if codes == [0, 0] else 1)
