"""Real checkpoints: a transformers folder (or hub id) read into the weights dict.

Everything that can be refused is refused before a weight is read: the folder, its
``config.json`` against the spec (every setting, floats compared exactly), and the
safetensors headers (every tensor's name, shape and dtype, read from the 8-byte length and
the JSON header at the start of each file, no tensor data) against what the spec and the
config imply. Only then does transformers load the tensors.
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import torch

from .specs import get_spec
from .weights import hf_param_shapes


class CheckpointError(ValueError):
    """A checkpoint that is missing, of another architecture, or of other shapes."""



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
    """The settings of a transformers config that a spec encodes (the sizes that set the
    tensors' shapes, and those that change the math without changing any shape), under
    their config.json names."""
    theta, scaling = _rope(cfg)
    heads = cfg.num_attention_heads
    sliding = _sliding_layers(cfg)
    out = {"hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
           "vocab_size": cfg.vocab_size, "num_hidden_layers": cfg.num_hidden_layers,
           "rope_theta": theta, "rope_scaling": scaling, "rms_norm_eps": cfg.rms_norm_eps,
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
    spec = get_spec(spec)
    mine, theirs = config_scalars(spec.hf_config()), config_scalars(cfg)
    # exact, floats included: an epsilon of 1e-5 is not the spec's 1e-6, however close
    return [(k, theirs.get(k), want) for k, want in mine.items() if theirs.get(k) != want]


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
    if any(p.glob("*.safetensors")):
        check_headers(p, spec)
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


# ---- the safetensors headers against the spec: names, shapes, dtypes, no tensor data ----
FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")
# the config.json sizes a tensor's shape comes from, by the end of its name
_SHAPE_FIELDS = (
    ("embed_tokens.weight", "vocab_size x hidden_size"),
    ("lm_head.weight", "vocab_size x hidden_size"),
    ("q_proj.weight", "num_attention_heads*head_dim x hidden_size"),
    ("q_proj.bias", "num_attention_heads*head_dim"),
    ("k_proj.weight", "num_key_value_heads*head_dim x hidden_size"),
    ("k_proj.bias", "num_key_value_heads*head_dim"),
    ("v_proj.weight", "num_key_value_heads*head_dim x hidden_size"),
    ("v_proj.bias", "num_key_value_heads*head_dim"),
    ("o_proj.weight", "hidden_size x num_attention_heads*head_dim"),
    ("gate_proj.weight", "intermediate_size x hidden_size"),
    ("up_proj.weight", "intermediate_size x hidden_size"),
    ("down_proj.weight", "hidden_size x intermediate_size"),
    ("mlp.gate.weight", "num_experts x hidden_size"),
    ("norm.weight", "hidden_size (or head_dim)"),
    ("layernorm.weight", "hidden_size"),
)
_LAYER = re.compile(r"model\.layers\.(\d+)\.")
# what a checkpoint lacks, by the spec's setting that reads it
_FEATURE_OF = {".bias": "qkv_bias", "q_norm": "qk_norm", "k_norm": "qk_norm"}


def read_headers(p: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """``{name: (dtype, shape, file name)}`` over every ``*.safetensors`` in ``p``, read
    from each file's header alone (an 8-byte little-endian length, then that much JSON)."""
    out = {}
    files = sorted(Path(p).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{p} holds no *.safetensors files")
    for f in files:
        size = f.stat().st_size
        try:
            with open(f, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                if not 2 <= n <= size - 8:
                    raise ValueError(f"header length {n} in a file of {size} bytes")
                head = json.loads(fh.read(n))
            tensors = {k: v for k, v in head.items() if k != "__metadata__"}
            for k, v in tensors.items():
                out[k] = (str(v["dtype"]), tuple(int(d) for d in v["shape"]), f.name)
        except Exception as e:  # too short, a length past the end, JSON that is not a header
            raise CheckpointError(f"{f} is not a readable safetensors file ({_one_line(e)}): "
                                  "the download was cut short or the file is damaged; "
                                  "download it again") from None
    return out


def file_shapes(spec, stacked_experts: bool = False) -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint file of ``spec`` holds, by their on-disk names: the HF
    state dict, with the experts one tensor each (``experts.{e}.gate_proj.weight``, ...)
    unless ``stacked_experts``, and no ``lm_head.weight`` when the embeddings are tied."""
    out = {}
    for k, shape in hf_param_shapes(spec).items():
        pre = k.rsplit(".", 1)[0] + "."
        if k.endswith("mlp.experts.gate_up_proj") and not stacked_experts:
            e, two_i, h = shape
            for i in range(e):
                out[f"{pre}{i}.gate_proj.weight"] = out[f"{pre}{i}.up_proj.weight"] = (two_i // 2, h)
        elif k.endswith("mlp.experts.down_proj") and not stacked_experts:
            e, h, i_ = shape
            for i in range(e):
                out[f"{pre}{i}.down_proj.weight"] = (h, i_)
        else:
            out[k] = shape
    if spec.tie_embeddings:
        out.pop("lm_head.weight", None)
    return out


def _fields_of(name: str) -> str:
    return next((f for end, f in _SHAPE_FIELDS if name.endswith(end)), "the config's sizes")


def check_headers(p: Path, spec) -> None:
    """Refuse, in one line, a checkpoint whose safetensors headers contradict ``spec`` (and
    the ``config.json`` already checked against it): a tensor that is not float, a
    layer the config does not have, a tensor the spec does not read or lacks, a shape other
    than the config implies, or a distinct ``lm_head.weight`` beside tied embeddings."""
    spec = get_spec(spec)
    got = read_headers(p)
    for k, (dtype, _, f) in sorted(got.items()):
        if dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{p / f}: {k} is {dtype}, not a float type: onelaunch reads "
                                  f"bf16, fp16 or fp32 checkpoints of {spec.name} (a quantised "
                                  "checkpoint needs its own loader)")
    layers = sorted({int(m.group(1)) for k in got for m in [_LAYER.match(k)] if m})
    if layers and layers[-1] >= spec.layers:
        raise CheckpointError(f"{p}: the safetensors hold layers 0-{layers[-1]} "
                              f"({layers[-1] + 1}), but config.json's num_hidden_layers is "
                              f"{spec.layers}: the config is not this checkpoint's")
    stacked = any(k.endswith("mlp.experts.gate_up_proj") for k in got)
    want = file_shapes(spec, stacked_experts=stacked)
    if spec.tie_embeddings and "lm_head.weight" in got:
        _same_head(p, got)
    extra = sorted(k for k in got if k not in want and not (spec.tie_embeddings
                                                             and k == "lm_head.weight"))
    if extra:
        raise CheckpointError(f"{p}: the safetensors hold {len(extra)} tensor(s) that "
                              f"{spec.name} does not read, e.g. {extra[0]}: a checkpoint of "
                              "another model, or a config.json that is not this checkpoint's")
    lost = sorted(k for k in want if k not in got)
    if lost:
        raise _lacks(p, spec, lost)
    for k, shape in want.items():
        have = got[k][1]
        if have != shape:
            how = " (transposed)" if have == shape[::-1] else ""
            raise CheckpointError(f"{p}: {k} is {list(have)} in {got[k][2]}{how}, but "
                                  f"config.json implies {list(shape)} ({_fields_of(k)}): the "
                                  "tensors and the config are of different models")


def _lacks(p: Path, spec, lost: list[str]) -> CheckpointError:
    """The refusal of a checkpoint without tensors the spec reads (and which setting of the
    spec reads them: biases and q/k norms are not config fields)."""
    feats = sorted({f for k in lost for part, f in _FEATURE_OF.items() if part in k})
    why = "".join(f"; {spec.name} has {f} True" for f in feats)
    return CheckpointError(f"{p} lacks {len(lost)} tensor(s) that {spec.name} reads, e.g. "
                           f"{lost[0]}{why}: transformers would fill them with random "
                           f"numbers; use a complete checkpoint of {spec.name}")


def _same_head(p: Path, got: dict) -> None:
    """Tied embeddings with an ``lm_head.weight`` in the file: transformers decodes with the
    file's head and onelaunch with the embedding, so the two must be the same numbers."""
    from safetensors import safe_open

    def read(name):
        with safe_open(str(p / got[name][2]), "pt") as fh:
            return fh.get_tensor(name)
    if "model.embed_tokens.weight" in got and torch.equal(read("lm_head.weight"),
                                                          read("model.embed_tokens.weight")):
        return
    raise CheckpointError(f"{p}: config.json says tie_word_embeddings true, but the "
                          "safetensors also hold a distinct lm_head.weight (transformers "
                          "would decode with it, onelaunch with the embedding): set "
                          "tie_word_embeddings to false in a spec of this model, or drop the "
                          "tensor")


def positions_fit(p: Path, positions: int) -> None:
    """Refuse a run of more positions than the checkpoint's ``max_position_embeddings``."""
    most = read_config(p).max_position_embeddings
    if most and positions > most:
        raise CheckpointError(f"the run needs {positions} positions (prompt + new tokens), "
                              f"but {Path(p) / 'config.json'} has max_position_embeddings "
                              f"{most}: use a shorter prompt or fewer --tokens")



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
    check_headers(p, spec)
    expected = hf_param_shapes(spec)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(p, dtype=dtype,
                                                           output_loading_info=True)
    except Exception as e:  # a shard the index names is missing, a tensor of another dtype...
        raise CheckpointError(f"{p}: transformers could not load the weights "
                              f"({_one_line(e)}); download the checkpoint again") from None
    lost = sorted(info.get("missing_keys") or ())
    if lost:
        raise _lacks(p, spec, lost)
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
