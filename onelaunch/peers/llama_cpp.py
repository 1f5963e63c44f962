"""llama.cpp as a peer: the engine most people run on their own GPU, timed by its own
``llama-bench`` on a GGUF of the run's weights (:class:`LlamaBench`, in
:data:`onelaunch.peers.rungs.PEERS`).

What its users run: ``llama-bench -m MODEL.gguf -ngl 99 -p 0 -n 128 -d 512 -fa 1``
(every layer on the GPU, no prompt test, 128 generated tokens after a 512-token context
that is not timed, flash attention; :func:`bench_command`), built by
``ci/llama_build.sh`` from the llama.cpp that the PyPI sdist of llama-cpp-python 0.3.36
vendors (commit 0c1e57098), CUDA backend only, into ``.llama/build`` (git-ignored).

The GGUF holds the run's own seeded weights at the model's exact shapes
(:mod:`.llama_cpp_gguf`), so llama.cpp reads the same bytes as our rungs; it is written
once per weights (the file name carries a digest of them) under ``.llama/gguf``.
llama-bench feeds random token ids and prints no logits, so no oracle check of its text
is possible: the row has ``agree`` None and says so, and its time is llama-bench's own
(wall clock around each repeat's 128 tokens, :func:`parse_bench`).

Row: ``ms_per_token`` the median over llama-bench's repeats of (repeat time / tokens),
``ms_min``/``ms_max`` their spread, ``timed`` the repeats, ``llama_avg_ms`` and
``llama_std_ms`` what llama-bench itself reports (mean and standard deviation), the
GGUF's bytes (``gguf_bytes_per_token``, counted from its tensors: f32 norms, biases and
router make it slightly more than the bf16 floor's bytes) and llama.cpp's build commit.

Chapter 6 measures it for OLMoE and chapter 8 for Qwen, each in its ladder cell; both say
what it took in the words of :func:`sentence`, and the closing page reads their rows.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
LLAMA_DIR = ROOT / ".llama"                     # ci/llama_build.sh's folder (ignored)
BINARY = LLAMA_DIR / "build" / "bin" / "llama-bench"
GGUF_DIR = LLAMA_DIR / "gguf"
N_GEN = 128                                     # -n: the tokens llama-bench times
NAME = "llama.cpp"                              # the peer's rung name in every row
LABEL = ("llama-bench's own timing, no oracle check possible on random-weight text "
         "(it feeds random token ids and shows no logits)")


def bench_command(binary, gguf, depth: int = 512, n_gen: int = N_GEN) -> list[str]:
    """The command its users run: every layer on the GPU, only generation timed, after
    ``depth`` context tokens, flash attention on, JSON out."""
    return [str(binary), "-m", str(gguf), "-ngl", "99", "-p", "0", "-n", str(n_gen),
            "-d", str(depth), "-fa", "1", "-o", "json"]


def parse_bench(text: str) -> dict:
    """llama-bench's ``-o json`` output (a list with one test) -> its times per token.

    ``samples_ns`` holds each repeat's wall time for ``n_gen`` tokens; ``avg_ns`` and
    ``stddev_ns`` are llama-bench's own mean and standard deviation of them."""
    tests = json.loads(text)
    if not isinstance(tests, list) or len(tests) != 1:
        raise ValueError(f"expected one llama-bench test, got {len(tests)}")
    t = tests[0]
    n = int(t["n_gen"])
    if n < 1 or int(t["n_prompt"]) != 0:
        raise ValueError("not a generation-only test (-p 0 -n N)")
    per_tok = sorted(s / n / 1e6 for s in t["samples_ns"])
    if not per_tok:
        raise ValueError("llama-bench reported no samples")
    return {"ms_per_token": statistics.median(per_tok), "ms_min": per_tok[0],
            "ms_max": per_tok[-1], "timed": len(per_tok),
            "llama_avg_ms": t["avg_ns"] / n / 1e6,
            "llama_std_ms": t["stddev_ns"] / n / 1e6,
            "n_gen": n, "n_depth": int(t["n_depth"]), "flash_attn": t.get("flash_attn"),
            "n_gpu_layers": t.get("n_gpu_layers"),
            "build_commit": t.get("build_commit"),
            "gpu_info": t.get("gpu_info"), "backends": t.get("backends"),
            "llama_model_size": t.get("model_size")}


def weights_digest(weights: dict[str, torch.Tensor]) -> str:
    """A short digest of the weights (each tensor's name, shape and first 2048 values):
    the GGUF of other weights gets another file name."""
    crc = 0
    for name in sorted(weights):
        t = weights[name]
        head = t.detach().flatten()[:2048].to("cpu", torch.bfloat16).view(torch.int16)
        crc = zlib.crc32(f"{name}{tuple(t.shape)}".encode(), crc)
        crc = zlib.crc32(head.numpy().tobytes(), crc)
    return f"{crc:08x}"


def gguf_for(spec, weights, seed=None, folder=GGUF_DIR) -> dict:
    """The GGUF of ``weights`` (written if missing) and its bytes
    (:func:`.llama_cpp_gguf.gguf_bytes`)."""
    from .llama_cpp_gguf import gguf_bytes, write_gguf
    path = Path(folder) / f"{spec.name}-bf16-{weights_digest(weights)}.gguf"
    if path.exists():
        return {"path": str(path), **gguf_bytes(spec, path)}
    return write_gguf(spec, weights, path, seed=seed)


def why_no_row(device, binary=BINARY) -> str | None:
    """Why the peer makes no row on ``device``, in words a page can print (None: it
    runs): it is timed on a GPU only, with the binary ``ci/llama_build.sh`` builds and
    gguf-py."""
    if torch.device(device).type != "cuda":
        return "llama-bench is timed on a GPU only (-ngl 99)"
    if not Path(binary).exists():
        return "llama-bench was not built on this machine (ci/llama_build.sh builds it)"
    try:
        import gguf  # noqa: F401
    except ImportError:
        return "the gguf package is missing (requirements.txt)"
    return None


def sentence(row: dict | None, device, binary=BINARY) -> str:
    """What a chapter says of llama.cpp's row of its run (``row``: the ladder's, or None
    where it has none), without a final period: the time, its spread and its ratio to the
    floor, that the time is llama-bench's own and that no oracle check of random-weight
    text is possible through it; else why there is no time (:func:`why_no_row`)."""
    if row is not None and row.get("ms_per_token") is not None:
        ms, lo, hi = row["ms_per_token"], row.get("ms_min"), row.get("ms_max")
        how = [f"{lo:.4g}–{hi:.4g} over its {row.get('timed')} repeats"
               if lo is not None and hi is not None else "",
               f"{row['x_floor']:.2f} times the floor"
               if row.get("x_floor") is not None else ""]
        how = "; ".join(h for h in how if h)
        return (f"llama.cpp's llama-bench takes {ms:.4g} ms a token"
                + (f" ({how})" if how else "") + " on a GGUF of the same weights, by "
                "its own timing; no oracle check of its text is possible, since it feeds "
                "random token ids and prints no logits")
    if row is not None:
        why = str(row.get("error") or row.get("refused") or "no time").splitlines()[0]
        return f"llama.cpp gave no time in this run: {why[:200]}"
    return (f"llama.cpp has no row in this run: "
            f"{why_no_row(device, binary) or 'it made none'}")


@dataclass
class LlamaBench:
    """The llama.cpp peer (the :class:`onelaunch.peers.rungs.Peer` interface): a GGUF of
    the run's weights timed by llama-bench at depth ``run.ctx``. Where the binary or
    gguf-py is missing, or on the CPU, it prints one line and makes no row (None), so
    no table, figure or results file shows a peer that did not run."""
    name: str = NAME
    binary: str | Path = BINARY
    gguf_dir: str | Path = GGUF_DIR
    n_gen: int = N_GEN
    timeout_s: int = 600
    kind = "peer"

    def tokens(self, new_tokens: int, eager_new_tokens: int) -> int:
        return self.n_gen

    def measure(self, run, n: int) -> dict | None:
        why = why_no_row(run.device, self.binary)
        if why:
            print(f"{self.name}: {why}", file=sys.stderr)
            return None
        r = run.row(self.name, n, None, LABEL)
        r["unchecked"] = True               # no reference: not the oracle's own row
        r["peer"] = True                    # a peer for the ladder (report.ladder_file)
        g = gguf_for(run.spec, run.weights, seed=run.seed, folder=self.gguf_dir)
        out = subprocess.run(bench_command(self.binary, g["path"], run.ctx, n),
                             capture_output=True, text=True, timeout=self.timeout_s)
        if out.returncode != 0:
            said = [ln for ln in out.stderr.splitlines() if ln.strip()]
            r["error"] = (f"llama-bench exited {out.returncode}: "
                          f"{said[-1][:300] if said else 'no message'}")   # its last word
            return r
        b = parse_bench(out.stdout)
        run.timed(r, b.pop("ms_per_token"))
        r.update({k: round(v, 4) if isinstance(v, float) else v
                  for k, v in b.items()})
        r.update(gguf=Path(g["path"]).name, gguf_bytes_per_token=g["bytes_per_token"],
                 ctx_timed=[run.ctx, run.ctx + n - 1], agree=None)
        return r
