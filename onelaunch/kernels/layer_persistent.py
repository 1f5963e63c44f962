"""One whole layer in one launch: the launcher of the persistent kernel with grid
barriers (``layer_persistent_kernel.py``: the phases, how a GEMV phase runs, the
barrier; ``layer_persistent_args.py``: its arguments in groups).

The grid is P resident programs (``grid_size``; a cooperative launch on the GPU, which a
grid barrier needs). Streamed or with the register ring, the phases' sums and roundings
are the unfused plan's at the same tiles, so the layer's bits are those of an unfused
engine at ``plan.persistent_cfgs``. The launch itself is a PDL launch on Hopper, so layer
boundaries overlap too.

Phases are a constexpr range [FIRST, LAST]. On the GPU one launch runs 0..6 (MoE 0..7).
Triton's interpreter runs programs one after another, where a spinning barrier would
never end, so there the launcher issues one launch per phase (no barrier), running the
same code; with a grid of one program the interpreter runs the one launch, barriers and
the requests before them included (a lone program never waits for another).
"""
from __future__ import annotations

import torch
import triton

from ..options import PersistentOptions
from . import config
from . import layer_persistent_args as LA
from .attention_splitk import BLOCK_S, block_m, live_share
from .down_residual import down_split
from .layer_persistent_kernel import _layer_persistent_kernel

PHASES = ("rms_qkv", "rope_kv_write", "attention_partial", "attention_reduce", "o_proj_residual",
          "rms_gate_up_swiglu", "down_residual")
LAST_PHASE = len(PHASES) - 1
MOE_PHASES = PHASES[:5] + ("router_logits", "route_experts_gate_up", "experts_down")


# ---- the launcher --------------------------------------------------------------------
def grid_size(device, cfg: dict, opts: PersistentOptions | None = None) -> int:
    """Programs of the persistent grid: ``opts.grid`` if set, else the entry's GRID, else
    SMs x PER_SM (``opts.per_sm``, else the entry's, default 1). In the interpreter a
    few programs (each then walks several tiles of most phases)."""
    opts = opts or PersistentOptions()
    g = opts.grid if opts.grid is not None else cfg.get("GRID")
    if g:
        return int(g)
    if config.interpreting() or torch.device(device).type != "cuda":
        return 3
    sms = torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    return sms * int(opts.per_sm if opts.per_sm is not None else cfg.get("PER_SM", 1))


def entry(c_p: dict, opts: PersistentOptions | None = None) -> dict:
    """The persistent kernel's table entry with ``opts``' overrides (``options.py``):
    ``stages`` (STAGES), ``tile`` (TILE, ``own``: none) and ``fold_rope`` (FOLD_ROPE)."""
    opts = opts or PersistentOptions()
    c = dict(c_p)
    c["STAGES"] = int(opts.stages if opts.stages is not None else c.get("STAGES", 0))
    if opts.fold_rope if opts.fold_rope is not None else int(c.get("FOLD_ROPE", 0)):
        c["FOLD_ROPE"] = 1
    else:
        c.pop("FOLD_ROPE", None)
    tile = opts.tile or c.get("TILE")
    c.pop("TILE", None)
    if tile and tile != "own":
        c["TILE"] = str(tile)
    return c


def launch_options(device, use_pdl: bool, c_p: dict | None = None,
                   opts: PersistentOptions | None = None) -> dict:
    """How the launch is made: cooperative (``opts.coop``, on a GPU) and PDL
    (``opts.pdl``, default: the engine's, unless the launch table's entry ``c_p`` says
    ``PDL=0``), and whether all phases run in one launch (``opts.split``: "1", one
    launch per phase, as the interpreter; "0-4,5-7", those groups of phases, see
    ``phase_ranges``)."""
    opts = opts or PersistentOptions()
    gpu = not config.interpreting() and torch.device(device).type == "cuda"
    split = opts.split or "0"
    pdl = opts.pdl if opts.pdl is not None else int((c_p or {}).get("PDL", 1))
    return dict(cooperative=gpu and bool(opts.coop),
                pdl=bool(use_pdl) and bool(pdl), split=not gpu or split != "0",
                groups=None if split in ("0", "1") else split)


def phase_ranges(opts: dict, grid: int, last: int) -> list:
    """The launches of one layer as (first, last) phase ranges: one launch for all phases,
    one per phase (split), or the groups of ``PersistentOptions.split`` when it names them
    ("0-4,5-7": the attention block in one launch and the MoE block in another; a
    measurement of where one launch gains or loses). In the interpreter a range of more
    than one phase runs only at grid 1 (see ``one_launch``)."""
    if not opts.get("groups") or config.interpreting() and grid > 1:
        return [(0, last)] if one_launch(opts, grid) else [(p, p) for p in range(last + 1)]
    ranges = []
    for part in opts["groups"].split(","):
        a, _, b = part.partition("-")
        ranges.append((int(a), int(b or a)))
    if [p for a, b in ranges for p in range(a, b + 1)] != list(range(last + 1)):
        raise ValueError(f"split={opts['groups']!r} must cover phases "
                         f"0-{last} in order, each once (e.g. '0-4,5-{last}')")
    return ranges


def one_launch(opts: dict, grid: int) -> bool:
    """All phases in one launch: on the GPU unless split was asked for; in the interpreter
    only with one program (its barriers never wait for another program, so they run)."""
    return not opts["split"] or grid == 1


def layer_persistent(x, L: dict, qkv, q, attn, h, k_cache, v_cache, cos, sin, pos, part_o, part_m,
                     part_l, scratch, counter, bar, heads, kv_heads, head_dim, eps, chunk, cfgs: dict,
                     use_pdl=False, grid=None, opts=None, live_cap=None, moe=None, clock=None,
                     persist: PersistentOptions | None = None):
    """One layer. ``L``: the layer's packed weights (input_norm, w_qkv, b_qkv, w_o,
    post_norm, then w_gate_up, w_down, or for a mixture of experts w_router,
    w_experts_gate_up, w_experts_down); the activation buffers, caches and split-K partials
    as the unfused plan has them; ``bar`` int32 [2] zeros (left zero); ``cfgs``: op ->
    launch config for rms_qkv, o_proj, gate_up and down (MoE: router, moe_gate_up,
    moe_down), attn_split and layer_persistent (num_warps of the whole kernel, NEXT,
    STAGES: see ``entry``). ``moe``: the router's buffers (logits, ids, weights, log,
    log_row, log_offset) and the experts' h [top_k, I]; the MoE layer must stream
    (STAGES > 0). ``clock``: int64 [grid, 2 x phases] for the programs' clock stamps
    (a measurement on a GPU: ``measure.profile.clock_phases``). ``persist``: the
    engine's ``PersistentOptions`` (grid, cooperative launch, PDL, split). Returns the
    compiled kernels of the launches it made."""
    w_qkv, w_o = L["w_qkv"], L["w_o"]
    N_QKV, H = w_qkv.shape
    c_p, stages = cfgs["layer_persistent"], int(cfgs["layer_persistent"].get("STAGES", 0))
    n_splits = part_m.shape[1]
    qn, kn, b = L.get("q_norm"), L.get("k_norm"), L["b_qkv"]
    opts = opts or launch_options(x.device, use_pdl, c_p, persist)
    P = grid or grid_size(x.device, c_p, persist)
    kw = {}
    if opts["pdl"]:
        kw["launch_pdl"] = True
    if opts["cooperative"]:
        kw["launch_cooperative_grid"] = True
    last = LAST_PHASE + (moe is not None)                 # MoE: router, experts' gate/up, down
    ranges = phase_ranges(opts, P, last)
    slots = 2 * (last + 1)
    if clock is not None:
        if config.interpreting():
            raise ValueError("the layer's clock reads %globaltimer: a GPU measurement, not "
                             "for Triton's interpreter (leave PersistentOptions.clock False)")
        assert clock.dtype == torch.int64 and clock.numel() >= P * slots, "clock too small"
    # RoPE folded into the attention phase (``rope_attention_partial.rope_partial``): one
    # barrier fewer a layer; not where q and k are normed over all heads (OLMoE)
    fold = bool(c_p.get("FOLD_ROPE")) and qn is None
    if fold and any(a <= 1 and z == 2 for a, z in ranges):
        raise ValueError("with RoPE folded into attention a launch cannot end at phase 2 "
                         "(it has no barrier there): group phases 1-2 with 3")
    gu, dn, tiles, rt, ex, mt = (dense_groups(L, h, scratch, counter, cfgs, H) if moe is None
                                 else moe_groups(L, moe, h, scratch, counter, cfgs, H))
    args = (LA.Qkv(x, L["input_norm"], w_qkv, b if b is not None else w_qkv, qkv, N_QKV, H, eps,
                   w_qkv.stride(0)),
            LA.Rope(q, k_cache, v_cache, cos, sin, pos, qn if qn is not None else qkv,
                    kn if kn is not None else qkv, k_cache.stride(0), k_cache.stride(1), heads,
                    kv_heads),
            LA.Attn(part_o, part_m, part_l, attn, n_splits, live_share(n_splits, live_cap),
                    head_dim ** -0.5),
            LA.OProj(w_o, w_o.shape[1], w_o.stride(0)), gu, dn, bar, rt, ex,
            clock if clock is not None else bar)
    hc = head_consts(cfgs["attention_splitk"], b is not None, qn is not None, heads, kv_heads,
                     head_dim, chunk, n_splits)
    compiled = []
    for first, final in ranges:
        compiled.append(_layer_persistent_kernel[(P,)](
            *args, A=hc, T=tiles, M=mt, FIRST=first, LAST=final,
            NEXT=bool(c_p.get("NEXT", 1)), USE_PDL=opts["pdl"], FENCE=not config.interpreting(),
            STAGES=stages, CLOCK=clock is not None, SLOTS=slots, FOLD=fold,
            SKIP=int(fold and first <= 1 and final >= 2), num_warps=c_p["num_warps"], **kw))
    return compiled


def head_consts(c_at: dict, bias: bool, qk_norm: bool, heads: int, kv_heads: int,
                head_dim: int, chunk: int, n_splits: int) -> LA.Heads:
    """The attention block's constants (``Heads``): its blocks from the head shape, the
    split-K tile ``c_at["BLOCK_T"]`` cut to the chunk."""
    group = heads // kv_heads
    block_t = min(c_at["BLOCK_T"], chunk)
    assert chunk % block_t == 0, "a tile must not straddle two chunks"
    return LA.Heads(HAS_BIAS=bias, QK_NORM=qk_norm, D=head_dim,
                    BLOCK_D=triton.next_power_of_2(head_dim),
                    BLOCK_R=min(1024, triton.next_power_of_2(heads * head_dim)), GROUP=group,
                    GROUP_PAD=max(16, triton.next_power_of_2(group)),
                    BLOCK_DA=max(16, triton.next_power_of_2(head_dim)), CHUNK=chunk,
                    BLOCK_T=block_t, DOT_F32=config.interpreting(), BLOCK_S=BLOCK_S,
                    BLOCK_M=block_m(n_splits))


def dense_groups(L: dict, h, scratch, counter, cfgs: dict, H: int) -> tuple:
    """A dense layer's MLP groups (GateUp, Down), its GEMV tiles, and MoE groups that are
    never read (pointers to W_qkv, sizes 1)."""
    w_qkv, w_o, w_gu, w_dn = L["w_qkv"], L["w_o"], L["w_gate_up"], L["w_down"]
    I = w_gu.shape[0] // 2
    c_qkv, c_o = cfgs["rms_qkv"], cfgs["o_proj_residual"]
    c_gu, c_dn = cfgs["rms_gate_up_swiglu"], cfgs["down_residual"]
    k_per_split, split = down_split(I, c_dn)
    assert not int(cfgs["layer_persistent"].get("STAGES", 0)) or split == 1, \
        "the streamed down phase runs whole rows (SPLIT_K 1)"
    n_dn_rows = triton.cdiv(H, c_dn["BLOCK_N"])
    assert counter.numel() >= n_dn_rows and scratch.numel() >= split * H, "scratch too small"
    tiles = gemv_tiles(c_qkv, c_o, c_gu, c_dn, H, w_o.shape[1], k_per_split, split)
    w = w_qkv                                                          # (not read)
    return (LA.GateUp(L["post_norm"], w_gu, h, I, w_gu.stride(0)),
            LA.Down(w_dn, scratch, counter, k_per_split, w_dn.stride(0)), tiles,
            LA.Router(w, w.stride(0), 1, w, w, w, w, 1, 1),
            LA.Experts(w, w.stride(0), 0, 1, w, w.stride(0), 0, w),
            moe_tiles(1, 1, c_qkv, c_qkv, c_qkv, False))


def moe_groups(L: dict, moe: dict, h, scratch, counter, cfgs: dict, H: int) -> tuple:
    """A mixture of experts' groups (Router, Experts), its tiles, and dense MLP groups that
    are never read (W_qkv in place of the dense weights, sizes 1)."""
    assert int(cfgs["layer_persistent"].get("STAGES", 0)), \
        "the persistent MoE layer streams its phases: STAGES > 0"
    w_qkv, w_o = L["w_qkv"], L["w_o"]
    c_qkv, c_o = cfgs["rms_qkv"], cfgs["o_proj_residual"]
    w_r, w_egu, w_edn = L["w_router"], L["w_experts_gate_up"], L["w_experts_down"]
    ids, eh = moe["ids"], moe["h"]
    w = w_qkv                                                          # (not read)
    return (LA.GateUp(L["post_norm"], w, h, 1, w.stride(0)),
            LA.Down(w, scratch, counter, 1, w.stride(0)),
            gemv_tiles(c_qkv, c_o, c_qkv, c_qkv, H, w_o.shape[1], 1, 1),
            LA.Router(w_r, w_r.stride(0), w_r.shape[0], moe["logits"], ids, moe["weights"],
                      moe["log"], moe["log_row"], moe["log_offset"]),
            LA.Experts(w_egu, w_egu.stride(0), w_egu.stride(1), w_edn.shape[2], w_edn,
                       w_edn.stride(0), w_edn.stride(1), eh),
            moe_tiles(w_r.shape[0], ids.numel(), cfgs["moe_router"], cfgs["moe_gate_up_swiglu"],
                      cfgs["moe_down_residual"], True))


def gemv_tiles(c_qkv, c_o, c_gu, c_dn, H: int, K_O: int, k_per_split: int,
               split: int) -> LA.Tiles:
    """The dense GEMV phases' tiles from the unfused ops' configs (prefetch: each one's
    share of K)."""
    return LA.Tiles(BN_QKV=c_qkv["BLOCK_N"], BK_QKV=c_qkv["BLOCK_K"],
                    PF_QKV=config.prefetch(c_qkv, H), BN_O=c_o["BLOCK_N"], BK_O=c_o["BLOCK_K"],
                    PF_O=config.prefetch(c_o, K_O), BN_GU=c_gu["BLOCK_N"],
                    BK_GU=c_gu["BLOCK_K"], PF_GU=config.prefetch(c_gu, H),
                    BN_DN=c_dn["BLOCK_N"], BK_DN=c_dn["BLOCK_K"],
                    PF_DN=config.prefetch(c_dn, k_per_split), SPLIT_K=split)


def moe_tiles(E: int, top_k: int, c_r, c_egu, c_edn, moe: bool) -> LA.MoETiles:
    """A mixture of experts' constants from the router's and the experts' configs."""
    return LA.MoETiles(MOE=moe, TOP_K=top_k, TOP_KP=triton.next_power_of_2(top_k),
                       BLOCK_E=triton.next_power_of_2(E), BN_R=c_r["BLOCK_N"],
                       BK_R=c_r["BLOCK_K"], BN_EGU=c_egu["BLOCK_N"], BK_EGU=c_egu["BLOCK_K"],
                       BN_EDN=c_edn["BLOCK_N"], BK_EDN=c_edn["BLOCK_K"])
