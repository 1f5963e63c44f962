"""Decode attention, the plain version: one program per query head over the whole cache.

    s_t   = q . k_t / sqrt(D)            for t < length (= pos + 1)
    out   = sum_t softmax(s)_t v_t       online softmax (running max m, sum l)

Grid: Hq programs (12 for Qwen2.5-1.5B). Each walks the entire timeline of its KV head
in BLOCK_T tiles, so at decode, where there is one query, 12 of the GPU's 132 SMs work
while the rest idle, and each K/V tile is read again by every query head of its group.
This is the trap the split-K kernel (``attention_splitk.py``) gets out of; it is kept
because the chapter measures it. The length is read from a device tensor, so the launch
is fixed.
"""
import triton
import triton.language as tl

from ._common import bf16_round, pdl_wait


@triton.jit
def _attention_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, pos_ptr, stride_c_h, stride_c_t,
                      scale, GROUP, D: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_T: tl.constexpr, USE_PDL: tl.constexpr):
    h = tl.program_id(0)
    kh = h // GROUP
    pdl_wait(USE_PDL)
    length = tl.load(pos_ptr) + 1
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(q_ptr + h * D + d, mask=dm, other=0.0).to(tl.float32)
    m = tl.max(tl.full([BLOCK_T], float("-inf"), tl.float32), axis=0)
    l = tl.sum(tl.zeros([BLOCK_T], tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    base = kh * stride_c_h
    for t0 in range(0, length, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tm = t < length
        offs = base + t[:, None] * stride_c_t + d[None, :]
        k = tl.load(k_cache_ptr + offs, mask=tm[:, None] & dm[None, :], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale
        s = tl.where(tm, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(v_cache_ptr + offs, mask=tm[:, None] & dm[None, :], other=0.0).to(tl.float32)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(out_ptr + h * D + d, bf16_round(acc / l).to(out_ptr.dtype.element_ty), mask=dm)


def attention(q, k_cache, v_cache, out, pos, heads, kv_heads, head_dim, cfg, use_pdl=False):
    """q, out: [Hq D]; k_cache, v_cache: one layer's [Hkv, C, D]; pos: int32 [1]."""
    kw = {"launch_pdl": True} if use_pdl else {}
    _attention_kernel[(heads,)](
        q, k_cache, v_cache, out, pos, k_cache.stride(0), k_cache.stride(1),
        head_dim ** -0.5, heads // kv_heads, D=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_T=cfg["BLOCK_T"], USE_PDL=use_pdl,
        num_warps=cfg["num_warps"], **kw)
