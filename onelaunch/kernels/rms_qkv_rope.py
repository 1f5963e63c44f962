"""Fused RMSNorm + QKV projection (+ bias) + RoPE + KV-cache write: one launch instead of
``rms_qkv`` followed by ``rope_kv_write``.

    xn          = rmsnorm(x) * g
    y           = W_qkv @ xn + b                             W_qkv: [(Hq + 2Hkv) D, K]
    q[h]        = rope(y[q part, head h], pos)               -> q_out [Hq D]
    k_cache[kh] = rope(y[k part, head kh], pos)  at slot pos
    v_cache[kh] = y[v part, head kh]             at slot pos

RoPE mixes element j of a head with element j + D/2 (rotate_half), so a program that
owns *both* rows of each pair can rotate in its epilogue: program p owns BLOCK_P pairs
(j, j + D/2) of one head and runs two GEMVs over the same normalised x, one for the
rows j and one for the rows j + D/2. The weight layout is the concatenated W_qkv of
``rms_qkv``: no permutation, no extra copy. q, k and v leave the kernel already rotated
and in place, so the separate RoPE launch (about 1.5 us on the H200, all fixed cost) and
the round trip of the qkv vector disappear. Rounding follows HF's bf16 model exactly as
``rms_qkv`` and ``rope_kv_write`` do.
Grid: (Hq + 2Hkv) * D / 2 / BLOCK_P programs; BLOCK_P divides D / 2, so a program's pairs
lie in one head and it knows at launch whether it writes q, k or v.
Not for q/k-normalised models (OLMoE): their RMS over the whole projection needs every
program's output first.
"""
import triton
import triton.language as tl

from . import config
from ._common import bf16_round, gemv2_tiles, load_w_tiles, pdl_wait, rms_rstd


@triton.jit
def _rotate(ya, yb, cos_row, sin_row, j, HALF: tl.constexpr):
    """HF's q*cos + rotate_half(q)*sin for the pair (j, j + HALF), rounded as in bf16."""
    ca = tl.load(cos_row + j).to(tl.float32)
    sa = tl.load(sin_row + j).to(tl.float32)
    cb = tl.load(cos_row + j + HALF).to(tl.float32)
    sb = tl.load(sin_row + j + HALF).to(tl.float32)
    out_a = bf16_round(bf16_round(ya * ca) + bf16_round(-yb * sa))
    out_b = bf16_round(bf16_round(yb * cb) + bf16_round(ya * sb))
    return out_a, out_b


@triton.jit
def _rms_qkv_rope_kernel(x_ptr, g_ptr, w_ptr, b_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
                         cos_ptr, sin_ptr, pos_ptr, K, eps, stride_w_n, stride_c_h, stride_c_t,
                         HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                         HAS_BIAS: tl.constexpr, USE_PDL: tl.constexpr,
                         BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    HALF: tl.constexpr = D // 2
    pid = tl.program_id(0)
    pair = pid * BLOCK_P + tl.arange(0, BLOCK_P)
    head = (pid * BLOCK_P) // HALF                         # one head per program
    j = pair - head * HALF                                 # [BLOCK_P] positions in the head
    rows_a = head * D + j
    rows_b = rows_a + HALF
    ok = j < HALF
    a0, a1, a2, a3 = load_w_tiles(w_ptr, stride_w_n, rows_a, ok, 0, K, BLOCK_K, PREFETCH)
    b0, b1, b2, b3 = load_w_tiles(w_ptr, stride_w_n, rows_b, ok, 0, K, BLOCK_K, PREFETCH)
    pdl_wait(USE_PDL)
    rstd = rms_rstd(x_ptr, K, eps, BLOCK_K)
    # rows_b = rows_a + HALF: the second matrix is the same one, HALF rows further on
    ya, yb = gemv2_tiles(w_ptr, w_ptr + HALF * stride_w_n, stride_w_n, rows_a, ok, x_ptr, g_ptr, rstd,
                         a0, a1, a2, a3, b0, b1, b2, b3, K, BLOCK_K, PREFETCH)
    ya = bf16_round(ya)                                    # the projection's bf16 output
    yb = bf16_round(yb)
    if HAS_BIAS:
        ya = bf16_round(ya + tl.load(b_ptr + rows_a).to(tl.float32))
        yb = bf16_round(yb + tl.load(b_ptr + rows_b).to(tl.float32))
    pos = tl.load(pos_ptr)
    if head < HQ + HKV:                                    # q or k: rotate
        oa, ob = _rotate(ya, yb, cos_ptr + pos * D, sin_ptr + pos * D, j, HALF)
        if head < HQ:
            tl.store(q_out_ptr + rows_a, oa.to(q_out_ptr.dtype.element_ty))
            tl.store(q_out_ptr + rows_b, ob.to(q_out_ptr.dtype.element_ty))
        else:
            slot = (head - HQ) * stride_c_h + pos * stride_c_t
            tl.store(k_cache_ptr + slot + j, oa.to(k_cache_ptr.dtype.element_ty))
            tl.store(k_cache_ptr + slot + j + HALF, ob.to(k_cache_ptr.dtype.element_ty))
    else:                                                  # v: as it is
        slot = (head - HQ - HKV) * stride_c_h + pos * stride_c_t
        tl.store(v_cache_ptr + slot + j, ya.to(v_cache_ptr.dtype.element_ty))
        tl.store(v_cache_ptr + slot + j + HALF, yb.to(v_cache_ptr.dtype.element_ty))


def rms_qkv_rope(x, g, w_qkv, b_qkv, q_out, k_cache, v_cache, cos, sin, pos, eps, heads,
                 kv_heads, head_dim, use_pdl=False, cfg=None):
    """x: [K]; w_qkv: [(Hq + 2Hkv) D, K]; q_out: [Hq D]; k_cache, v_cache: one layer's
    [Hkv, C, D]; cos, sin: [C, D]; pos: int32 [1] on the device."""
    N, K = w_qkv.shape
    assert N == (heads + 2 * kv_heads) * head_dim and head_dim % 2 == 0
    c = cfg or config.get("rms_qkv", x.device)
    half = head_dim // 2
    block_p = min(max(1, c["BLOCK_N"] // 2), half)          # as many rows as rms_qkv's tile
    while half % block_p:
        block_p //= 2
    kw = {"launch_pdl": True} if use_pdl else {}
    _rms_qkv_rope_kernel[(N // 2 // block_p,)](
        x, g, w_qkv, b_qkv if b_qkv is not None else w_qkv, q_out, k_cache, v_cache, cos, sin,
        pos, K, eps, w_qkv.stride(0), k_cache.stride(0), k_cache.stride(1), HQ=heads, HKV=kv_heads,
        D=head_dim, HAS_BIAS=b_qkv is not None, USE_PDL=use_pdl, BLOCK_P=block_p,
        BLOCK_K=c["BLOCK_K"], PREFETCH=config.prefetch(c, K), num_warps=c["num_warps"], **kw)
