"""MoE router: post-attention RMSNorm + router GEMV + softmax + top-k, on the GPU.

    xn      = rmsnorm(x) * g                         x: [K] bf16 residual, g: [K]
    logits  = W_r @ xn                               W_r: [E, K]   (OLMoE: 64 x 2048)
    p       = softmax(logits)                        fp32, over all E experts
    ids, w  = top_k(p)                               no renormalisation (norm_topk_prob=False)

Grid: one program per BLOCK_N experts' rows of W_r. Each writes its bf16 logits; program
0 also writes ``xn``, the normalised activation every expert kernel reads; the last
program to arrive (per-launch counter, the threadfence-reduction pattern) does the
softmax and the top-k over all E logits in registers and writes, into static device
tensors that the expert kernels read on replay:

    xn        [K]          bf16   rmsnorm(x) * g, rounded as HF rounds it
    logits    [E]          fp32   bf16-rounded router logits (scratch)
    ids       [TOP_K]      int32  chosen experts, most probable first
    weights   [TOP_K]      fp32   their probabilities, rounded to bf16 (HF's routing weights)
    counter   [1]          int32  arrivals; zero between calls, reset by the last program
    log       [C, L, TOP_K] int32 ids of every step, at row pos (which experts a run read)

Top-k is TOP_K rounds of "largest probability, lowest index among equals", so ties go to
the lower expert index, as ``torch.topk`` orders them on the oracle's side. Bytes: E*K*2
of router weights (256 KB a layer for OLMoE) and K*2 of activation.
The shape of this launch never changes while the choice does: the graph stays fixed and
the expert kernels follow the ids it writes (the seed post's indirect index).
"""
import torch
import triton
import triton.language as tl

from . import config
from ._common import bf16_round, gemv_tiles, load_w_tiles, load_x_tile, pdl_wait, rms_rstd, thread_fence


@triton.jit
def _moe_router_kernel(x_ptr, g_ptr, w_ptr, xn_ptr, logits_ptr, ids_ptr, wts_ptr,
                       counter_ptr, log_ptr, pos_ptr, E, K, eps, stride_w_n, n_programs,
                       log_row, log_offset, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
                       FENCE: tl.constexpr, USE_PDL: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < E
    w0, w1, w2, w3 = load_w_tiles(w_ptr, stride_w_n, offs_n, n_mask, 0, K, BLOCK_K,
                                  PREFETCH)
    pdl_wait(USE_PDL)
    rstd = rms_rstd(x_ptr, K, eps, BLOCK_K)
    y = gemv_tiles(w_ptr, stride_w_n, offs_n, n_mask, x_ptr, g_ptr, rstd, w0, w1, w2,
                   w3, 0, K, BLOCK_K, True, PREFETCH)
    tl.store(logits_ptr + offs_n, bf16_round(y), mask=n_mask)  # bf16 logits, as HF
    if pid == 0:                                               # the experts' input
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            xt = load_x_tile(x_ptr, g_ptr, rstd, k0, K, BLOCK_K, True)
            tl.store(xn_ptr + offs_k, xt.to(xn_ptr.dtype.element_ty), mask=offs_k < K)
    thread_fence(FENCE)                                        # logits visible GPU-wide
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
    if arrived == n_programs - 1:
        route(logits_ptr, ids_ptr, wts_ptr, log_ptr, tl.load(pos_ptr), log_row,
              log_offset, E, True, TOP_K, BLOCK_E, BLOCK_E)
        tl.store(counter_ptr, 0)


@triton.jit
def route(logits_ptr, ids_ptr, wts_ptr, log_ptr, pos, log_row, log_offset, E, store,
          TOP_K: tl.constexpr, TOP_KP: tl.constexpr, BLOCK_E: tl.constexpr):
    """Softmax over the E logits, then TOP_K rounds of "largest probability, lowest
    index among equals". Returns the ids (int32) and the bf16-rounded weights (fp32) as
    [TOP_KP] vectors (slot j in lane j); with ``store`` also writes them to ids, weights
    and the log row ``pos``. The persistent MoE layer has every program route for itself
    (same logits, same result) and one program store."""
    e = tl.arange(0, BLOCK_E)
    em = e < E
    lg = tl.load(logits_ptr + e, mask=em, other=float("-inf"), volatile=True)
    p = tl.exp(lg - tl.max(lg, axis=0))
    p = p / tl.sum(p, axis=0)                                  # softmax in fp32
    p = tl.where(em, p, -1.0)                                  # padding is never chosen
    slots = tl.arange(0, TOP_KP)
    ids = tl.zeros([TOP_KP], dtype=tl.int32)
    wts = tl.zeros([TOP_KP], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, axis=0)
        # lowest index among ties
        i = tl.min(tl.where(p == best, e, BLOCK_E), axis=0)
        ids = tl.where(slots == j, i, ids)
        wts = tl.where(slots == j, bf16_round(best), wts)
        if store:
            tl.store(ids_ptr + j, i)
            tl.store(wts_ptr + j, bf16_round(best))
            tl.store(log_ptr + pos * log_row + log_offset + j, i)
        p = tl.where(e == i, -1.0, p)
    return ids, wts


def moe_router(x, g, w_router, xn, logits, ids, weights, counter, pos, eps, log=None, layer=0,
               use_pdl=False, cfg=None):
    """Route one token. x, g, xn: [K]; w_router: [E, K]; logits: fp32 [E]; ids: int32
    [top_k]; weights: fp32 [top_k]; counter: int32 [1] zero; pos: int32 [1] on the device;
    log: optional int32 [C, layers, top_k] (row pos, layer ``layer`` gets the ids)."""
    E, K = w_router.shape
    top_k = ids.numel()
    assert top_k <= E and logits.numel() >= E and weights.numel() >= top_k
    assert counter.dtype == torch.int32
    c = cfg or config.get("moe_router", x.device, (E, K))
    n_prog = triton.cdiv(E, c["BLOCK_N"])
    if log is None:
        log, log_row, log_offset = ids, 0, 0          # the ids again: a harmless re-store
    else:
        log_row, log_offset = log.stride(0), layer * log.stride(1)
    kw = {"launch_pdl": True} if use_pdl else {}
    _moe_router_kernel[(n_prog,)](
        x, g, w_router, xn, logits, ids, weights, counter, log, pos, E, K, eps,
        w_router.stride(0), n_prog, log_row, log_offset, TOP_K=top_k,
        BLOCK_E=triton.next_power_of_2(E), FENCE=not config.interpreting(), USE_PDL=use_pdl,
        BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], PREFETCH=config.prefetch(c, K),
        num_warps=c["num_warps"], **kw)
