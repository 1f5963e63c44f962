"""Fused (q/k RMSNorm +) RoPE + KV-cache write.

    q[h]            = rope(qkv[q part, head h], pos)             -> q_out [Hq, D]
    k_cache[kh,pos] = rope(qkv[k part, head kh], pos)            -> cache slot
    v_cache[kh,pos] = qkv[v part, head kh]

OLMoE first RMS-normalises the whole q (Hq D values) and the whole k (Hkv D) with gains
q_norm, k_norm (``QK_NORM``). That statistic spans every head, so each program reads the
whole q (or k) it belongs to, 4 KB from L2, and computes it itself: the norm rides in
this launch instead of needing a second kernel or a last-arrival reduction in the QKV
GEMV. Under tensor parallelism a rank holds only some heads, so the statistic comes from
``ss`` instead (fp32 [2]: the sums of squares of the whole q and k, summed over the
ranks by ``qk_sumsq``), divided by the whole model's sizes ``q_total``, ``k_total``.

rotate_half is computed from a gathered index: element d pairs with d +- D/2 and takes a
sign, so no half is ever concatenated. cos/sin come from a table [max_ctx, D] (rounded
to the model dtype, as HF does) indexed by the position, which the kernel reads from a
device tensor: the recorded launch is the same at every step, as a CUDA graph needs.
Grid: one program per head, Hq + Hkv programs. Bytes: (Hq + 2Hkv) D * 2 read, as many
written: about 4 KB, so this kernel is all launch latency. It replaces about a dozen
PyTorch ops (slices, two multiplies, a concatenation and a negation per tensor, an
index_copy per cache).
"""
import triton
import triton.language as tl

from ._common import bf16_round, pdl_wait, rms_rstd, rstd_of


@triton.jit
def _rope_pair(src_ptr, cos_ptr, sin_ptr, d, partner, sign, dm, g_ptr, rstd, HAS_NORM: tl.constexpr):
    x = tl.load(src_ptr + d, mask=dm, other=0.0).to(tl.float32)
    xp = tl.load(src_ptr + partner, mask=dm, other=0.0).to(tl.float32)
    if HAS_NORM:   # OLMoE's q/k RMSNorm (HF's rounding: x * rstd to bf16, times the gain)
        x = bf16_round(bf16_round(x * rstd) * tl.load(g_ptr + d, mask=dm, other=0.0).to(tl.float32))
        xp = bf16_round(bf16_round(xp * rstd) * tl.load(g_ptr + partner, mask=dm, other=0.0).to(tl.float32))
    c = tl.load(cos_ptr + d, mask=dm, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + d, mask=dm, other=0.0).to(tl.float32)
    # HF in bf16: q*cos and rotate_half(q)*sin are each rounded, then their sum
    a = bf16_round(x * c)
    b = bf16_round(sign * xp * s)
    return a + b


@triton.jit
def rope_kv_head(h, pos, qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr,
                 qn_ptr, kn_ptr, ss_ptr, eps, q_total, k_total, stride_c_h, stride_c_t,
                 HQ, HKV, D: tl.constexpr, BLOCK_D: tl.constexpr, QK_NORM: tl.constexpr,
                 HAS_SS: tl.constexpr, BLOCK_R: tl.constexpr):
    """Head ``h`` (q heads first, then kv heads) at position ``pos``: the body of a program
    of this kernel, and of the persistent layer's RoPE phase."""
    HALF: tl.constexpr = D // 2
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    partner = tl.where(d < HALF, d + HALF, d - HALF)     # rotate_half as a gather
    sign = tl.where(d < HALF, -1.0, 1.0)
    cos_row = cos_ptr + pos * D
    sin_row = sin_ptr + pos * D
    if h < HQ:
        rstd = 1.0
        if QK_NORM:   # the norm spans all heads of q: every program reads the whole q
            if HAS_SS:    # (TP: the ranks' summed statistic)
                rstd = rstd_of(tl.load(ss_ptr), q_total, eps)
            else:
                rstd = rms_rstd(qkv_ptr, HQ * D, eps, BLOCK_R)
        y = _rope_pair(qkv_ptr + h * D, cos_row, sin_row, d, partner, sign, dm,
                       qn_ptr + h * D, rstd, QK_NORM)
        tl.store(q_out_ptr + h * D + d, bf16_round(y).to(q_out_ptr.dtype.element_ty), mask=dm)
    else:
        kh = h - HQ
        rstd = 1.0
        if QK_NORM:
            if HAS_SS:
                rstd = rstd_of(tl.load(ss_ptr + 1), k_total, eps)
            else:
                rstd = rms_rstd(qkv_ptr + HQ * D, HKV * D, eps, BLOCK_R)
        y = _rope_pair(qkv_ptr + (HQ + kh) * D, cos_row, sin_row, d, partner, sign, dm,
                       kn_ptr + kh * D, rstd, QK_NORM)
        slot = kh * stride_c_h + pos * stride_c_t
        tl.store(k_cache_ptr + slot + d, bf16_round(y).to(k_cache_ptr.dtype.element_ty), mask=dm)
        v = tl.load(qkv_ptr + (HQ + HKV + kh) * D + d, mask=dm, other=0.0)
        tl.store(v_cache_ptr + slot + d, v, mask=dm)


@triton.jit
def _rope_kv_write_kernel(qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, pos_ptr,
                          qn_ptr, kn_ptr, ss_ptr, eps, q_total, k_total, stride_c_h, stride_c_t,
                          HQ, HKV, D: tl.constexpr, BLOCK_D: tl.constexpr, QK_NORM: tl.constexpr,
                          HAS_SS: tl.constexpr,
                          BLOCK_R: tl.constexpr, USE_PDL: tl.constexpr):
    h = tl.program_id(0)
    pdl_wait(USE_PDL)
    pos = tl.load(pos_ptr)
    rope_kv_head(h, pos, qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, qn_ptr,
                 kn_ptr, ss_ptr, eps, q_total, k_total, stride_c_h, stride_c_t, HQ, HKV, D, BLOCK_D,
                 QK_NORM, HAS_SS, BLOCK_R)


def rope_kv_write(qkv, q_out, k_cache, v_cache, cos, sin, pos, heads, kv_heads, head_dim,
                  use_pdl=False, q_norm=None, k_norm=None, eps=0.0, ss=None, q_total=0, k_total=0):
    """qkv: [(Hq+2Hkv) D]; q_out: [Hq D]; k_cache, v_cache: one layer's [Hkv, C, D];
    cos, sin: [C, D]; pos: int32 [1] on the device. With ``q_norm`` [Hq D] and ``k_norm``
    [Hkv D] (OLMoE), q and k are RMS-normalised over all their heads before RoPE.
    TP: ``ss`` fp32 [2] (sums of squares of q and k over all ranks, from ``qk_sumsq``) gives
    the norm's statistic, mean square = ss[0] / q_total and ss[1] / k_total (the whole
    model's q and kv sizes), instead of this rank's heads."""
    qk_norm = q_norm is not None
    assert qk_norm == (k_norm is not None), "q_norm and k_norm come together"
    assert ss is None or (qk_norm and q_total > 0 and k_total > 0), "ss needs the norms and sizes"
    kw = {"launch_pdl": True} if use_pdl else {}
    _rope_kv_write_kernel[(heads + kv_heads,)](
        qkv, q_out, k_cache, v_cache, cos, sin, pos, q_norm if qk_norm else qkv,
        k_norm if qk_norm else qkv, qkv if ss is None else ss, eps, q_total, k_total,
        k_cache.stride(0), k_cache.stride(1), heads, kv_heads, D=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim), QK_NORM=qk_norm, HAS_SS=ss is not None,
        BLOCK_R=min(1024, triton.next_power_of_2(heads * head_dim)), USE_PDL=use_pdl,
        num_warps=1 if not qk_norm else 4, **kw)
