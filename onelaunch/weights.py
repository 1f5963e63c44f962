"""Weights: seeded random tensors at exact shapes, and real checkpoints.

Weights live in one flat dict keyed by Hugging Face's own state-dict names (for the
installed transformers version), so the oracle, the HF reference model and the kernel
packer all read the same tensors: nothing is copied to build the reference.

Random weights come from a counter-based hash (murmur3's 32-bit finaliser over the element
index and a per-tensor seed) evaluated with integer tensor ops. Integer arithmetic is exact
on every device, so the same seed gives bit-identical weights on the CPU and the GPU, and
the GPU can generate OLMoE's 6.9B parameters in a second. Every value is rounded to bf16,
so an fp32 copy holds exactly the numbers the bf16 engine reads.
"""
from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import torch

from .specs import ModelSpec, get_spec

_MASK32 = 0xFFFFFFFF


class CheckpointError(ValueError):
    """A checkpoint that is missing, of another architecture, or of other shapes."""


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    # murmur3 finaliser on 32-bit values held in int64 (products wrap; the mask keeps
    # the low 32 bits, which two's-complement wrapping leaves exact)
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    x = x ^ (x >> 16)
    return x


def hash_uniform(shape, seed: int, scale: float, device="cpu", chunk: int = 1 << 26) -> torch.Tensor:
    """Uniform values in [-scale, scale], bit-identical on any device, rounded to bf16."""
    n = 1
    for d in shape:
        n *= d
    out = torch.empty(n, dtype=torch.bfloat16, device=device)
    s = _fmix32(torch.tensor(seed & _MASK32, dtype=torch.int64)).item()
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        i = torch.arange(lo, hi, dtype=torch.int64, device=device)
        x = _fmix32(((i * 0x9E3779B1) & _MASK32) ^ s)
        x = _fmix32(x ^ (i >> 32))
        k = (x >> 8) - (1 << 23)                       # exact integer in [-2^23, 2^23)
        # one int->float conversion (exact) and one multiply: a single IEEE rounding
        out[lo:hi] = (k.to(torch.float32) * (scale / float(1 << 23))).to(torch.bfloat16)
    return out.view(*shape)


def _tensor_seed(seed: int, name: str) -> int:
    return zlib.crc32(f"{seed}:{name}".encode()) & _MASK32


def hf_param_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """The HF state-dict names and shapes for ``spec`` (built on the meta device)."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(spec.hf_config())
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _init_scale(name: str, shape, spec: ModelSpec) -> tuple[float, float]:
    """(offset, half-width) of the uniform init for one tensor."""
    if name.endswith("norm.weight") or "layernorm" in name:
        return 1.0, 0.1                      # norm gains near 1, not exactly 1
    if name.endswith("bias"):
        return 0.0, 0.1
    if "embed_tokens" in name or "lm_head" in name:
        # logits = x_norm . E: std ~ 3 makes the next-token distribution peaked like a
        # trained model's, so greedy decoding is not a string of near-ties
        return 0.0, 3.0 * 3 ** 0.5 / spec.hidden ** 0.5
    fan_in = shape[-1]
    gain = 1.0
    if "o_proj" in name or "down_proj" in name:
        # layer outputs several times the size of a token's own embedding row: with tied
        # embeddings a small residual would make every model repeat its input token
        gain = 3.0
    return 0.0, gain * 3 ** 0.5 / fan_in ** 0.5


def random_tensor(spec, name: str, shape, seed: int = 0, device="cpu",
                  dtype=torch.bfloat16) -> torch.Tensor:
    """One seeded random tensor, by HF name: the same bits whichever tensors are made with it."""
    spec = get_spec(spec)
    off, half = _init_scale(name, shape, spec)
    t = hash_uniform(shape, _tensor_seed(seed, name), half, device=device)
    if off:
        t = (t.float() + off).to(torch.bfloat16)
    return t.to(dtype)


def random_weights(spec, seed: int = 0, device="cpu", dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """Seeded random weights under HF names. Same seed, same bits, on any device."""
    spec = get_spec(spec)
    w = {name: random_tensor(spec, name, shape, seed, device, dtype)
         for name, shape in hf_param_shapes(spec).items() if not (spec.tie_embeddings and name == "lm_head.weight")}
    if spec.tie_embeddings:
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    return w


# ---------------------------------------------------------------------------------------
# Hugging Face model over our tensors (no copy)
# ---------------------------------------------------------------------------------------
def hf_model(spec, weights: dict[str, torch.Tensor]):
    """A transformers model whose parameters *are* ``weights`` (assigned, not copied).

    Built on the meta device, so no memory is allocated for HF's own init; the rotary
    buffers are then rebuilt on the weights' device.
    """
    from transformers import AutoModelForCausalLM
    spec = get_spec(spec)
    cfg = spec.hf_config()
    any_w = next(iter(weights.values()))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=any_w.dtype)
    model.load_state_dict(weights, assign=True, strict=True)
    if spec.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for name, mod in model.named_modules():
        if name.endswith("rotary_emb"):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            with torch.device(any_w.device):
                setattr(parent, name.rsplit(".", 1)[-1], type(mod)(config=cfg))
    for name, buf in model.named_buffers():
        if buf.is_meta:
            raise RuntimeError(f"buffer {name} was left on the meta device")
    model.eval()
    model.config.use_cache = True
    return model


# ---------------------------------------------------------------------------------------
# Real checkpoints
# ---------------------------------------------------------------------------------------
_ARCH = {"qwen2": "qwen2", "olmoe": "olmoe"}
# a hub id: "name" or "org/name" (letters, digits, "-", "_", "."); anything else that is not
# an existing folder is a path that does not exist
_HUB_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")
SMALL_FILES = ["*.json", "*.txt", "*.model", "*.jinja"]      # config, tokenizer, chat template


def _one_line(e: BaseException, n: int = 200) -> str:
    why = " ".join(str(e).split())
    return f"{type(e).__name__}: {why[:n]}" if why else type(e).__name__


def looks_like_hub_id(s: str) -> bool:
    return bool(_HUB_ID.fullmatch(s)) and ".." not in s


def checkpoint_folder(path_or_id: str, weights: bool = False) -> Path:
    """The local folder of a checkpoint: ``path_or_id`` when it is a folder; else, when it
    looks like a hub id (``org/name``), its snapshot through ``huggingface_hub``: the
    config and tokenizer files, and with ``weights`` the ``*.safetensors`` too. A path
    that does not exist, or a hub that cannot be reached or has no such model, is a
    :class:`CheckpointError` that says which."""
    if not str(path_or_id).strip():
        raise CheckpointError("the checkpoint is an empty string: give its folder, or a hub "
                              "id like org/name")
    p = Path(path_or_id)
    if p.is_dir():
        return p
    if p.exists():
        raise CheckpointError(f"checkpoint {str(path_or_id)!r} is a file, not a folder: pass the "
                              "folder that holds its config.json and *.safetensors")
    name = str(path_or_id)
    if not looks_like_hub_id(name):
        raise CheckpointError(f"checkpoint folder {name!r} does not exist (nor is it a hub id "
                              "like org/name)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)
    try:
        return Path(snapshot_download(name, allow_patterns=SMALL_FILES + (
            ["*.safetensors"] if weights else [])))
    except GatedRepoError:
        raise CheckpointError(f"{name!r} is a gated model on the Hugging Face hub: accept its "
                              "terms on its page and log in (huggingface-cli login), or pass "
                              "a local folder") from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise CheckpointError(f"{name!r} is neither a local folder nor a model on the Hugging "
                              "Face hub (no such repository there, or a private one): check "
                              "the name, or pass the folder you downloaded it to") from None
    except LocalEntryNotFoundError:
        raise CheckpointError(f"{name!r} is not a local folder, and the Hugging Face hub cannot "
                              "be reached to fetch it (no network, or HF_HUB_OFFLINE=1): "
                              f"download it where there is one (huggingface-cli download "
                              f"{name} --local-dir DIR) and pass DIR") from None
    except Exception as e:  # any other failure of the hub client: say which, in a line
        raise CheckpointError(f"could not fetch {name!r} from the Hugging Face hub "
                              f"({_one_line(e)}); download it elsewhere and pass the local "
                              "folder") from None


def read_config(p: Path):
    """``p/config.json`` as transformers parses it; a missing, broken or unsupported file
    is a :class:`CheckpointError` that says which."""
    f = Path(p) / "config.json"
    if not f.exists():
        raise CheckpointError(f"{p} has no config.json: not a transformers checkpoint folder")
    try:
        raw = json.loads(f.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{f} is not valid JSON ({e.msg} at line {e.lineno}, column "
                              f"{e.colno}): download the checkpoint again, or fix the file"
                              ) from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{f} is not UTF-8 text: download the checkpoint again") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{f} holds a JSON {type(raw).__name__}, not an object of "
                              "settings: download the checkpoint again, or fix the file")
    mt = raw.get("model_type")
    if mt not in _ARCH:
        raise CheckpointError(f"{p}: model_type {mt!r} is not supported (qwen2 or olmoe)")
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(p)
    except Exception as e:  # a field of the wrong type or value: transformers says which
        raise CheckpointError(f"{f} is not a valid {mt} config ({_one_line(e)}): download the "
                              "checkpoint again, or fix the file") from None


def _rope(cfg) -> tuple[float | None, dict | None]:
    """(theta, scaling) of a config: scaling None for plain rotary embeddings. Reads
    transformers 5's ``rope_parameters`` and the older ``rope_theta``/``rope_scaling``."""
    rp = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
    rp = dict(rp) if isinstance(rp, dict) else {}
    theta = rp.pop("rope_theta", None) or getattr(cfg, "rope_theta", None)
    kind = rp.pop("rope_type", rp.pop("type", "default"))     # "type": the older name
    return theta, (None if kind == "default" and not rp else {"rope_type": kind, **rp})


def _sliding_layers(cfg) -> list[int]:
    types = getattr(cfg, "layer_types", None)
    if types is None:                          # older transformers: derive as they did
        if not getattr(cfg, "use_sliding_window", False):
            return []
        return list(range(getattr(cfg, "max_window_layers", 0), cfg.num_hidden_layers))
    return [i for i, t in enumerate(types) if t != "full_attention"]


def config_scalars(cfg) -> dict:
    """The settings of a transformers config that change a model's math without changing
    any tensor's shape, under their config.json names."""
    theta, scaling = _rope(cfg)
    heads = cfg.num_attention_heads
    sliding = _sliding_layers(cfg)
    out = {"rope_theta": theta, "rope_scaling": scaling, "rms_norm_eps": cfg.rms_norm_eps,
           "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
           "num_attention_heads": heads,
           "num_key_value_heads": getattr(cfg, "num_key_value_heads", None) or heads,
           "head_dim": getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads
                                                           else None),
           "hidden_act": getattr(cfg, "hidden_act", None),
           "use_sliding_window": (f"True (layers {sliding}, window "
                                  f"{getattr(cfg, 'sliding_window', None)})" if sliding else False)}
    if cfg.model_type == "olmoe":
        out.update({k: getattr(cfg, k, None) for k in (
            "num_experts", "num_experts_per_tok", "norm_topk_prob", "attention_bias", "clip_qkv")})
    return out


def config_mismatches(cfg, spec) -> list[tuple[str, object, object]]:
    """(field, checkpoint's value, spec's value) for each setting of ``cfg`` (a
    checkpoint's config) that differs from what ``spec`` encodes; [] when they agree."""
    import math
    spec = get_spec(spec)
    mine, theirs = config_scalars(spec.hf_config()), config_scalars(cfg)
    out = []
    for k, want in mine.items():
        got = theirs.get(k)
        same = (math.isclose(got, want, rel_tol=1e-9)
                if isinstance(got, (int, float)) and isinstance(want, (int, float))
                and not isinstance(got, bool) and not isinstance(want, bool) else got == want)
        if not same:
            out.append((k, got, want))
    return out


def inspect_checkpoint(path_or_id: str, spec=None):
    """Everything about a checkpoint that can be checked without reading its weights:
    the folder (or hub id), its config.json, the architecture, the spec (given, or
    inferred from the shapes in the config) and every setting the spec encodes (rope
    theta and scaling, norm epsilon, tied embeddings, heads, experts and top-k, ...).
    Returns ``(spec, folder)``; what does not fit is a :class:`CheckpointError` naming
    the field, the checkpoint's value and the spec's."""
    p = checkpoint_folder(path_or_id)
    cfg = read_config(p)
    mt = cfg.model_type
    if spec is None:
        from .specs import SPECS
        cands = [s for s in SPECS.values() if s.family == mt and s.hidden == cfg.hidden_size
                 and s.layers == cfg.num_hidden_layers and s.vocab == cfg.vocab_size]
        if not cands:
            raise CheckpointError(f"{p}: no known spec has its shapes "
                                  f"(hidden {cfg.hidden_size}, layers {cfg.num_hidden_layers})")
        spec = cands[0]
    spec = get_spec(spec)
    if spec.family != mt:
        raise CheckpointError(f"{p} is a {mt} checkpoint, but {spec.name} is {spec.family}")
    bad = config_mismatches(cfg, spec)
    if bad:
        what = "; ".join(f"{k} is {got!r} there, {want!r} in {spec.name}" for k, got, want in bad)
        raise CheckpointError(f"{p / 'config.json'} disagrees with {spec.name}: {what}; the "
                              f"engine would compute {spec.name}, not the model this checkpoint "
                              f"is: use a checkpoint of {spec.name}")
    return spec, p


def _check_safetensors(p: Path) -> None:
    """Every ``*.safetensors`` file in ``p`` has a header that parses and a body that
    covers the tensors it lists (a truncated download does not)."""
    from safetensors import safe_open
    st = sorted(p.glob("*.safetensors"))
    if not st:
        raise CheckpointError(f"{p} holds no *.safetensors files")
    for f in st:
        try:
            with safe_open(str(f), "pt"):
                pass
        except Exception as e:  # SafetensorError: header too small/large, not covered, ...
            raise CheckpointError(f"{f} is not a readable safetensors file ({_one_line(e)}): "
                                  "the download was cut short or the file is damaged; "
                                  "download it again") from None


# what a checkpoint lacks, by the spec's setting that reads it
_FEATURE_OF = {".bias": "qkv_bias", "q_norm": "qk_norm", "k_norm": "qk_norm"}


def load_checkpoint(path_or_id: str, spec=None, device="cpu", dtype=torch.bfloat16):
    """Load a real checkpoint (a local folder, or a hub id resolved through
    ``huggingface_hub``) into a weights dict under the installed transformers' names.

    ``spec`` may be a spec or a name; the checkpoint's architecture, every setting the spec
    encodes (:func:`inspect_checkpoint`, before any weight is read) and every tensor's
    shape must match it, or :class:`CheckpointError` says what differs. Returns
    ``(spec, weights)``; with ``spec=None`` the spec is inferred by matching shapes.
    """
    from transformers import AutoModelForCausalLM
    spec, p = inspect_checkpoint(path_or_id, spec)
    if not Path(path_or_id).is_dir():           # a hub id: now its weights too
        p = checkpoint_folder(path_or_id, weights=True)
    _check_safetensors(p)
    expected = hf_param_shapes(spec)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(p, dtype=dtype,
                                                           output_loading_info=True)
    except Exception as e:  # a shard the index names is missing, a tensor of another dtype...
        raise CheckpointError(f"{p}: transformers could not load the weights "
                              f"({_one_line(e)}); download the checkpoint again") from None
    lost = sorted(info.get("missing_keys") or ())
    if lost:
        feats = sorted({f for k in lost for part, f in _FEATURE_OF.items() if part in k})
        why = "".join(f"; {spec.name} has {f} True" for f in feats)
        raise CheckpointError(f"{p} lacks {len(lost)} tensor(s) that {spec.name} reads, e.g. "
                              f"{lost[0]}{why}: transformers would fill them with random "
                              f"numbers; use a complete checkpoint of {spec.name}")
    got = {k: v for k, v in model.state_dict().items()}
    bad = [f"{k}: checkpoint {tuple(got[k].shape)} vs {spec.name} {expected[k]}"
           for k in expected if k in got and tuple(got[k].shape) != expected[k]]
    missing = [k for k in expected if k not in got]
    if bad or missing:
        msg = "; ".join(bad[:3] + [f"missing {k}" for k in missing[:3]])
        raise CheckpointError(f"{p} does not match {spec.name}: {msg}")
    # always a copy: the loaded tensors are views into the mmap-ed safetensors file at
    # offsets aligned to 8 bytes only, and the CPU's matmuls round differently on an
    # address that is not 64-byte aligned (tiny-olmoe's logits were not bit-identical
    # to those of the same weights made in memory); a copy is torch's own, aligned
    w = {k: got[k].detach().to(device=device, dtype=dtype, copy=True,
                               memory_format=torch.contiguous_format) for k in expected}
    if spec.tie_embeddings:
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    return spec, w



# ---------------------------------------------------------------------------------------
# Packing: the layouts the kernels read
# ---------------------------------------------------------------------------------------
def pack_weights(spec, w: dict[str, torch.Tensor]) -> dict:
    """Per-layer tensors in the layouts the kernels read, made once from the HF-named dict.

    Attention: ``w_qkv = [W_q; W_k; W_v]`` [(Hq + 2Hkv) D, H] (one GEMV; a copy) and
    ``b_qkv`` (Qwen), ``q_norm``/``k_norm`` (OLMoE). Dense MLP: ``w_gate_up = [W_gate;
    W_up]`` [2I, H] (a copy), ``w_down``. MoE: ``w_router`` [E, H] and the experts as HF
    already stacks them, ``w_experts_gate_up`` [E, 2I, H] and ``w_experts_down`` [E, H, I]
    (views, no copy). Everything else is the dict's own tensor."""
    spec = get_spec(spec)
    layers = []
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        L = {
            "input_norm": w[p + "input_layernorm.weight"],
            "post_norm": w[p + "post_attention_layernorm.weight"],
            "w_qkv": torch.cat([w[a + "q_proj.weight"], w[a + "k_proj.weight"], w[a + "v_proj.weight"]]),
            "b_qkv": (torch.cat([w[a + "q_proj.bias"], w[a + "k_proj.bias"], w[a + "v_proj.bias"]])
                      if spec.qkv_bias else None),
            "w_o": w[a + "o_proj.weight"],
        }
        if spec.qk_norm:
            L["q_norm"], L["k_norm"] = w[a + "q_norm.weight"], w[a + "k_norm.weight"]
        if spec.is_moe:
            L["w_router"] = w[p + "mlp.gate.weight"]
            L["w_experts_gate_up"] = w[p + "mlp.experts.gate_up_proj"]
            L["w_experts_down"] = w[p + "mlp.experts.down_proj"]
        else:
            L["w_gate_up"] = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
            L["w_down"] = w[p + "mlp.down_proj.weight"]
        layers.append(L)
    return {"layers": layers, "embed": w["model.embed_tokens.weight"],
            "norm": w["model.norm.weight"], "lm_head": w["lm_head.weight"]}
