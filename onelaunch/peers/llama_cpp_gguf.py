"""GGUF files at our models' exact shapes, for the llama.cpp peer: the run's own seeded
weights under the tensor names and metadata of llama.cpp's ``qwen2`` and ``olmoe``
architectures, with a synthetic vocabulary, written by llama.cpp's own gguf-py
(:func:`write_gguf`; the ``gguf`` package, or ``gguf-py/`` of the vendored source).

The layout is what llama.cpp's converter writes for these checkpoints at ``--outtype
bf16`` (``convert_hf_to_gguf.py``; ``conversion/qwen.py``, ``olmo.py`` and ``base.py``
at commit 0c1e57098) and what its loader asks for (``src/models/qwen2.cpp``,
``olmoe.cpp``):

- matrices in bf16, numpy shape ``[out, in]`` (ggml's ``{in, out}``), as in the HF
  state dict: no permutation, both architectures use NeoX RoPE;
- 1-D tensors (norms, biases) and the router (``ffn_gate_inp``) in f32, holding the
  same bf16-rounded values exactly;
- Qwen's tied head: no ``output.weight`` (llama.cpp reads ``token_embd``, as for the
  real Qwen2.5-1.5B GGUF);
- OLMoE's experts stacked ``[E, I, H]`` (``ffn_gate_exps``, ``ffn_up_exps``, split from
  HF's fused ``gate_up_proj`` [E, 2I, H], gate first) and ``[E, H, I]``
  (``ffn_down_exps``).

Checked by hand on the CPU: llama.cpp 0c1e57098 built CPU-only ran
both tiny specs' GGUFs (``llama-bench``, and its ``examples/simple`` with the token
ids printed), and its 12 greedy tokens after a 41-token prompt equalled the oracle's for
both models: the names, layouts, gate/up order, norms and routing are read as we mean them.

The vocabulary is synthetic (a SentencePiece-style list of ``spec.vocab`` pieces:
``<unk>``, ``<s>``, ``</s>``, the 256 byte pieces, then ``▁t<i>``): llama-bench feeds
random token ids, so only its size matters, and it must equal the embedding's rows.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

N_SPECIAL = 3 + 256                  # <unk> <s> </s> and the byte pieces


def _gguf():
    import gguf          # llama.cpp's gguf-py (requirements.txt; ci/llama_build.sh)
    return gguf


def arch(spec) -> str:
    """llama.cpp's architecture name for a spec's family."""
    return {"qwen2": "qwen2", "olmoe": "olmoe"}[spec.family]


def gguf_tensors(spec, weights: dict[str, torch.Tensor]):
    """``(gguf name, tensor)`` for every tensor llama.cpp loads, in file order; the
    tensors are views or slices of ``weights`` (HF names), converted by the writer."""
    T = _gguf().MODEL_TENSOR
    names = _gguf().TENSOR_NAMES
    w = weights
    yield names[T.TOKEN_EMBD] + ".weight", w["model.embed_tokens.weight"]
    for i in range(spec.layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        blk = lambda t, kind="weight": names[t].format(bid=i) + "." + kind
        yield blk(T.ATTN_NORM), w[p + "input_layernorm.weight"]
        for t, x in ((T.ATTN_Q, "q"), (T.ATTN_K, "k"), (T.ATTN_V, "v")):
            yield blk(t), w[a + f"{x}_proj.weight"]
            if spec.qkv_bias:
                yield blk(t, "bias"), w[a + f"{x}_proj.bias"]
        yield blk(T.ATTN_OUT), w[a + "o_proj.weight"]
        if spec.qk_norm:
            yield blk(T.ATTN_Q_NORM), w[a + "q_norm.weight"]
            yield blk(T.ATTN_K_NORM), w[a + "k_norm.weight"]
        yield blk(T.FFN_NORM), w[p + "post_attention_layernorm.weight"]
        if spec.is_moe:
            I = spec.intermediate
            gu = w[p + "mlp.experts.gate_up_proj"]                     # [E, 2I, H]
            yield blk(T.FFN_GATE_INP), w[p + "mlp.gate.weight"]         # [E, H]
            yield blk(T.FFN_GATE_EXP), gu[:, :I]                        # [E, I, H]
            yield blk(T.FFN_UP_EXP), gu[:, I:]                          # [E, I, H]
            yield blk(T.FFN_DOWN_EXP), w[p + "mlp.experts.down_proj"]   # [E, H, I]
        else:
            yield blk(T.FFN_GATE), w[p + "mlp.gate_proj.weight"]
            yield blk(T.FFN_UP), w[p + "mlp.up_proj.weight"]
            yield blk(T.FFN_DOWN), w[p + "mlp.down_proj.weight"]
    yield names[T.OUTPUT_NORM] + ".weight", w["model.norm.weight"]
    if not spec.tie_embeddings:
        yield names[T.OUTPUT] + ".weight", w["lm_head.weight"]


def is_f32(name: str, t: torch.Tensor) -> bool:
    """The converter's rule: 1-D tensors, norms and the router stay f32."""
    return t.dim() <= 1 or name.endswith("_norm.weight") or ".ffn_gate_inp." in name


def _array(name: str, t: torch.Tensor):
    """(numpy array, raw ggml type or None) as the writer takes them."""
    gguf = _gguf()
    t = t.detach().to("cpu")
    if is_f32(name, t):
        return t.float().contiguous().numpy(), None
    bits = t.to(torch.bfloat16).contiguous().view(torch.int16).numpy()
    return bits, gguf.GGMLQuantizationType.BF16


def vocabulary(n: int):
    """``(pieces, scores, types)`` of the synthetic SentencePiece-style vocabulary."""
    tt = _gguf().TokenType
    if n < N_SPECIAL + 1:
        raise ValueError(f"a vocabulary of {n} pieces cannot hold the {N_SPECIAL} "
                         "special and byte pieces")
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL] + [tt.BYTE] * 256
    pieces += [f"\u2581t{i}" for i in range(N_SPECIAL, n)]
    types += [tt.NORMAL] * (n - N_SPECIAL)
    scores = [0.0] * N_SPECIAL + [-float(i) for i in range(N_SPECIAL, n)]
    return pieces, scores, [int(t) for t in types]


def _metadata(writer, spec, name: str) -> None:
    gguf = _gguf()
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    writer.add_context_length(spec.max_positions or spec.max_ctx)
    writer.add_embedding_length(spec.hidden)
    writer.add_block_count(spec.layers)
    writer.add_feed_forward_length(spec.intermediate)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_rope_freq_base(spec.rope_theta)
    writer.add_layer_norm_rms_eps(spec.rms_eps)
    if spec.is_moe:
        writer.add_expert_count(spec.experts)
        writer.add_expert_used_count(spec.top_k)
    pieces, scores, types = vocabulary(spec.vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def write_gguf(spec, weights: dict[str, torch.Tensor], path,
               seed: int | None = None) -> dict:
    """Write ``weights`` (HF names, any device, bf16 values) as a llama.cpp GGUF at
    ``path``; returns what :func:`gguf_bytes` counts in it, plus the path. One tensor is
    copied to the host at a time, then held until the file is written."""
    gguf = _gguf()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    writer = gguf.GGUFWriter(tmp, arch(spec))
    _metadata(writer, spec, f"onelaunch {spec.name} random weights"
              + ("" if seed is None else f" seed {seed}"))
    for name, t in gguf_tensors(spec, weights):
        arr, raw = _array(name, t)
        writer.add_tensor(name, arr, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return {"path": str(path), **gguf_bytes(spec, path)}


def gguf_bytes(spec, path) -> dict:
    """Bytes of a GGUF's tensors, read back from the file: ``file_tensor_bytes`` (all
    of them) and ``bytes_per_token`` (what one decode step reads: every tensor, but
    ``top_k`` of ``experts`` of the stacked experts, and the embedding once, as the
    head: tied, llama.cpp's head reads it; untied, the lookup reads one row)."""
    reader = _gguf().GGUFReader(path)
    total = per_token = 0
    for t in reader.tensors:
        n = int(t.n_bytes)
        total += n
        if "_exps." in t.name:
            n = n // spec.experts * spec.top_k
        elif t.name.startswith("token_embd.") and not spec.tie_embeddings:
            n = 0
        per_token += n
    return {"file_tensor_bytes": total, "bytes_per_token": per_token}
