"""Deliberate bugs, one at a time: the CPU tests must fail for every one of them.

    python ci/mutants.py             # every mutant; a table; exit 1 if a mutant survives
    python ci/mutants.py -k bias     # the mutants whose name contains "bias"
    python ci/mutants.py --list      # the mutants and the edit each makes
    python ci/mutants.py -j 2        # two at a time (each run is one pytest process)

Each mutant is one small text edit to one kernel file: the kind of bug a tolerance that is
too loose, a test on round shapes, or a check of the wrong quantity lets through (a
dropped last tile, a dropped column, a split-K boundary off by one, a lost residual, a
RoPE sign, a dropped bias, the argmax tie order, the RMS epsilon, for the mixture of
experts the expert id and the routing weight, and for split-K attention the newest token
read before the PDL wait, a tile wider than its chunk, a dropped wait, token or split, and
a share of the live length that ignores the grid). The script copies the package and the
tests to a scratch directory (the working tree is never touched), applies the edit there,
runs the tests named for that mutant in Triton's CPU interpreter and records which
failed. A mutant that no test catches is a hole in the suite: the script exits 1.

Run it before resolving any kernel issue, and after changing a kernel: an edit whose text
no longer occurs in its file is reported "stale" (exit 1), so the list keeps up with the
kernels. A mutant of a file that this tree does not have (the MoE kernels, before they
land) is reported "absent", not run. ``tests/test_gates.py`` runs the same kind of bug
through the whole gate (kernel row, ladder, sweep): see ``bias_dropped`` there.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = "onelaunch/kernels/"
FAST = "tests/test_kernels.py"          # every kernel against its reference: ~1 minute
MOE = [FAST, "-k", "moe"]               # its MoE tests: seconds
TP = "tests/test_tp_kernels.py"                 # tensor parallelism's kernel modes: ~10 s
SPLITK = ["tests/test_splitk.py"]       # split-K attention, PDL emulated: ~40 s
STREAM = ["tests/test_persistent.py", "-k", "streamed or one_launch_of"]  # the streamed layer
PERSIST_OPTS = ["tests/test_persistent.py", "-k", "groups or pdl_from or clock or kwargs"]
CLOCK = ["tests/test_profile.py", "-k", "clock_phases"]   # the phases' clock stamps read
MEGA_VM = ["tests/test_megakernel_vm.py"]      # the megakernel schedule's CPU VM: ~30 s
MEGA_MOE = ["tests/test_megakernel_moe.py"]    # the same on tiny-olmoe and OLMoE: ~30 s
PUBLISHED = ["tests/test_specs.py", "-k", "published"]   # the specs against config.json
PATHS = ["tests/test_paths.py", "-k", "attention_it_built or header or prefill_that or pdl_from"]
GEN_CHECK = ["tests/test_engine.py", "-k", "cli_generate_checks"]   # generate --check: ~1 min


@dataclass
class Mutant:
    name: str
    file: str                             # under onelaunch/kernels/, or from the root
                                          # when it starts with "onelaunch/" or "ci/"
    old: str                              # exact text; its first occurrence is replaced
    new: str
    tests: list[str] = field(default_factory=lambda: [FAST])


MUTANTS = [
    Mutant("dropped last K tile", "_common.py",
           "for k0 in range(k_start + BLOCK_K, k_end, BLOCK_K):",
           "for k0 in range(k_start + BLOCK_K, k_end - BLOCK_K, BLOCK_K):"),
    Mutant("dropped last row block", "rms_qkv.py",
           'grid = (triton.cdiv(N, c["BLOCK_N"]),)', 'grid = (N // c["BLOCK_N"],)'),
    Mutant("dropped K column", "_common.py",
           "mask = n_mask[:, None] & (offs_k[None, :] < k_end)",
           "mask = n_mask[:, None] & (offs_k[None, :] < k_end - 1)"),
    Mutant("split-K boundary off by one", "down_residual.py",       # the tile's sum, not its prefetch
           "k_end = tl.minimum(k_start + k_per_split, K)\n    y = gemv_tiles(",
           "k_end = tl.minimum(k_start + k_per_split + 1, K)\n    y = gemv_tiles("),
    # o_proj, down, the MoE down and residual_add share one epilogue (finish_rows)
    Mutant("lost residual", "_common.py",
           "bf16_round(x + bf16_round(total))", "bf16_round(bf16_round(total))"),
    Mutant("RoPE sign", "rope_kv_write.py",
           "sign = tl.where(d < HALF, -1.0, 1.0)", "sign = tl.where(d < HALF, 1.0, -1.0)"),
    Mutant("dropped bias", "rms_qkv.py",
           "y += tl.load(b_ptr + offs_n", "y += 0.0 * tl.load(b_ptr + offs_n"),
    Mutant("argmax tie order", "lm_head_argmax.py",
           "take = v > run_val", "take = v >= run_val"),
    Mutant("RMS epsilon", "_common.py",
           "tl.sqrt(ss / K + eps)", "tl.sqrt(ss / K)"),
    Mutant("MoE expert id", "moe_experts.py",
           "e = tl.load(ids_ptr + slot)", "e = tl.load(ids_ptr + 0)", MOE),
    Mutant("MoE routing weight", "moe_experts.py",
           "tl.load(wts_ptr + slot)", "tl.load(wts_ptr)", MOE),
    Mutant("TP argmax merge tie order", "_common.py",
           "tl.min(tl.where(vals == m, idxs", "tl.max(tl.where(vals == m, idxs", [TP]),
    Mutant("TP q/k norm statistic", "rope_kv_write.py",
           "rstd_of(tl.load(ss_ptr + 1), k_total", "rstd_of(tl.load(ss_ptr), k_total", [TP]),
    Mutant("attention: newest token in the early tile", "attention_splitk.py",
           "base, start,\n                                   tl.minimum(end, pos), stride_c_t",
           "base, start,\n                                   tl.minimum(end, pos + 1), stride_c_t",
           SPLITK),
    Mutant("attention: a tile wider than its chunk reads the next split's tokens",
           "attention_splitk.py",
           "base, start,\n                                   tl.minimum(end, pos), stride_c_t",
           "base, start,\n                                   tl.minimum(start + BLOCK_T, pos), "
           "stride_c_t", SPLITK),
    Mutant("attention: no PDL wait", "attention_splitk.py",
           "        pdl_wait(USE_PDL)\n        # ---- after it: q and slot pos",
           "        # ---- after it: q and slot pos", SPLITK),
    Mutant("attention: newest token dropped", "attention_splitk.py",
           "if end == pos + 1:", "if end == pos + 2:", SPLITK),
    Mutant("attention: last live split dropped", "attention_splitk.py",
           "return (units + per - 1) // per", "return units // per", SPLITK),
    Mutant("attention: share ignores the grid", "attention_splitk.py",
           "per = (units + n_share - 1) // n_share", "per = 1 + 0 * n_share", SPLITK),
    Mutant("streamed GEMV: accumulator kept across row tiles", "_common.py",
           "            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)\n",
           "            acc = acc * 1.0\n", STREAM),
    Mutant("persistent layer: phase groups that skip a phase accepted", "layer_persistent.py",
           "if [p for a, b in ranges for p in range(a, b + 1)] != list(range(last + 1)):",
           "if False:", PERSIST_OPTS),
    Mutant("persistent layer: the table's PDL=0 ignored", "layer_persistent.py",
           'pdl = opts.pdl if opts.pdl is not None else int((c_p or {}).get("PDL", 1))',
           'pdl = opts.pdl if opts.pdl is not None else 1', PERSIST_OPTS),
    Mutant("persistent layer's clock: release from the first arrival",
           "onelaunch/measure/profile.py", "rel = nxt - en.amax(1)", "rel = nxt - en.amin(1)",
           CLOCK),
    # the checks' blind spots: a wrong constant in a full-size spec, which every
    # reference built from the same spec shares; a flag that silently falls back, which a
    # comparison of two runs down the same path cannot see; and kernel bugs that only show
    # with several live splits or K tiles, which generate --check's own run never reaches
    Mutant("spec: Qwen2.5's rope_theta", "onelaunch/specs.py",
           "head_dim=128, intermediate=8960, vocab=151936, rope_theta=1e6,",
           "head_dim=128, intermediate=8960, vocab=151936, rope_theta=1e5,", PUBLISHED),
    Mutant("spec to HF: OLMoE's top-k renormalised", "onelaunch/specs.py",
           "num_experts_per_tok=self.top_k, norm_topk_prob=False,",
           "num_experts_per_tok=self.top_k, norm_topk_prob=True,", PUBLISHED),
    Mutant("engine: attention='plain' ignored", "onelaunch/engine.py",
           "        self.attention = attention\n", '        self.attention = "splitk"\n', PATHS),
    Mutant("engine: batched prefill silently steps", "onelaunch/engine.py",
           'if self.prefill_mode(n, batched_prefill) == "batched":', "if False:", PATHS),
    Mutant("plan: the attention launches drop PDL", "onelaunch/plan.py",
           's, L, pdl = e.spec, e.W["layers"][li], e.pdl',
           's, L, pdl = e.spec, e.W["layers"][li], False', PATHS),
    Mutant("split-K merge: partial maxima not rescaled", "attention_splitk.py",
           "w = tl.where(sm, tl.exp(m_s - M), 0.0)", "w = tl.where(sm, 1.0 + 0.0 * m_s, 0.0)",
           GEN_CHECK),
    Mutant("MoE router: padded lanes enter the softmax", "moe_router.py",
           'lg = tl.load(logits_ptr + e, mask=em, other=float("-inf"), volatile=True)',
           "lg = tl.load(logits_ptr + e, mask=em, other=0.0, volatile=True)",
           ["tests/test_paths.py", "-k", "covering_run_reaches"]),
    Mutant("gate/up: last K tile dropped", "rms_gate_up_swiglu.py",
           "    for k0 in range(BLOCK_K, K, BLOCK_K):\n        gate = ring_next(",
           "    for k0 in range(BLOCK_K, K - BLOCK_K, BLOCK_K):\n        gate = ring_next(",
           GEN_CHECK),
    # the agreement rule, the stop ids, the CLI's record of what ran, the checkpoint gate
    Mutant("judge: forced along the engine's own tokens", "onelaunch/measure/agree.py",
           "tf = engine.teacher_forced(prompt, ref_ids, graph=graph)",
           "tf = engine.teacher_forced(prompt, free, graph=graph)",
           ["tests/test_agreement_forcing.py"]),
    Mutant("stop ids: an integer eos_token_id dropped", "onelaunch/text.py",
           "else [] if eos is None else [eos])", "else [])", ["tests/test_text.py", "-k", "stop_ids"]),
    Mutant("generate: --prefill batched falls back to steps", "onelaunch/cli/generate.py",
           'batched = args.prefill == "batched"', "batched = False",
           ["tests/test_cli.py", "-k", "prefill"]),
    Mutant("checkpoint: floats compared within a tolerance", "onelaunch/checkpoint.py",
           "if theirs.get(k) != want]",
           "if theirs.get(k) != want and not (isinstance(want, float) and "
           "abs(theirs.get(k) - want) < 1e-4)]", ["tests/test_checkpoint.py", "-k", "eps"]),
    Mutant("checkpoint: a distinct head beside tied embeddings accepted",
           "onelaunch/checkpoint.py", "        _same_head(p, got)\n", "        pass\n",
           ["tests/test_checkpoint.py", "-k", "tied"]),
    Mutant("checkpoint: a layer past the config accepted", "onelaunch/checkpoint.py",
           "if layers and layers[-1] >= spec.layers:", "if layers and layers[-1] > spec.layers:",
           ["tests/test_checkpoint.py", "-k", "header"]),
    Mutant("checkpoint: headers read only after the weights", "onelaunch/checkpoint.py",
           "    if any(p.glob(\"*.safetensors\")):\n        check_headers(p, spec)\n", "",
           ["tests/test_checkpoint.py", "-k", "header"]),
    # the megakernel's schedule and the CPU VM that runs it (tests/test_megakernel_vm.py)
    Mutant("megakernel: a counter not waited for", "onelaunch/megakernel/stages.py",
           '    w.after = (w.c(f"merge.{l}"), s.heads)', "    w.after = (NONE, 0)", MEGA_VM),
    Mutant("megakernel: a counter bumped before its store", "onelaunch/megakernel/vm.py",
           "        self.store(c, writes)\n        yield STEP\n"
           "        (release or self.bump)(c, row)\n",
           "        (release or self.bump)(c, row)\n        yield STEP\n"
           "        self.store(c, writes)\n",
           MEGA_VM),
    Mutant("megakernel: a target count off by one", "onelaunch/megakernel/stages.py",
           'f"part.{l}.{kh}"), splits)', 'f"part.{l}.{kh}"), splits - 1)', MEGA_VM),
    Mutant("megakernel: a ring stage reused before it is consumed", "onelaunch/megakernel/vm.py",
           "return not self.rings[a.sm].full[a.need[1]]", "return True", MEGA_VM),
    Mutant("megakernel: argmax tie order", "onelaunch/megakernel/vm_ops.py",
           "if vals[j] > vals[best]:", "if vals[j] >= vals[best]:", MEGA_VM),
    # the fused attention (the one-launch kernel's lists): the last split merges
    Mutant("megakernel: the last split merges without acquiring the others' partials",
           "onelaunch/megakernel/vm_ops.py", "    m.acquire(c, row[BUMP])\n", "",
           MEGA_VM),
    Mutant("megakernel: the fused split writes the new key from every split",
           "onelaunch/megakernel/vm_ops.py", "    own = a <= pos < b\n",
           "    own = a <= pos\n", MEGA_VM),
    # the mixture of experts in the megakernel (tests/test_megakernel_moe.py)
    Mutant("megakernel MoE: expert id read before the router's counter",
           "onelaunch/megakernel/vm.py",
           '                yield ("wait", step[1], step[2])\n', "                pass\n",
           MEGA_MOE),
    Mutant("megakernel MoE: routing weight applied twice", "onelaunch/megakernel/vm_ops.py",
           "part += (y[j].to(BF16).float() * wts[j]).to(BF16).float()",
           "part += (y[j].to(BF16).float() * wts[j] * wts[j]).to(BF16).float()", MEGA_MOE),
    Mutant("megakernel MoE: top-k renormalised", "onelaunch/megakernel/vm_ops.py",
           "w = torch.tensor(wts).to(BF16).float()",
           "w = (torch.tensor(wts) / sum(wts)).to(BF16).float()", MEGA_MOE),
    Mutant("megakernel MoE: router ties to the higher expert", "onelaunch/megakernel/vm_ops.py",
           "i = int((p == best).nonzero()[0, 0])", "i = int((p == best).nonzero()[-1, 0])",
           MEGA_MOE),
    Mutant("megakernel MoE: gate/up without the loader's wait",
           "onelaunch/megakernel/stages.py", "idx=i, lwait=w.route,", "idx=i, lwait=(NONE, 0),",
           MEGA_MOE),
    Mutant("megakernel MoE: q/k norm from one QKV block", "onelaunch/megakernel/stages.py",
           "idx=kh, splits=w.qkv_blocks if s.qk_norm else 0,",
           "idx=kh, splits=1 if s.qk_norm else 0,",
           MEGA_MOE),
    # what the VM marks unwritten at a step's start against the rows' writes
    # (tests/test_vm_writes.py): a wrong slot hides a read of the new key before its store
    Mutant("megakernel VM: the KV slot after pos marked unwritten", "onelaunch/megakernel/vm.py",
           "b[name].poison((slice(None), slice(None), pos))",
           "b[name].poison((slice(None), slice(None), pos + 1))", ["tests/test_vm_writes.py"]),
    Mutant("megakernel VM: the KV slot before pos marked unwritten", "onelaunch/megakernel/vm.py",
           "b[name].poison((slice(None), slice(None), pos))",
           "b[name].poison((slice(None), slice(None), pos - 1))", ["tests/test_vm_writes.py"]),
    Mutant("megakernel VM: a prompt token marked unwritten", "onelaunch/megakernel/vm.py",
           "if pos + 1 >= self.prompt_len:\n            b[\"seq\"]",
           "if pos + 1 >= 0:\n            b[\"seq\"]", ["tests/test_vm_writes.py"]),
    # a wrong sum inside the logits' rounding noise, checked where it is summed
    # (tests/test_vm_sums.py): the first row of v in a QKV block's k squares
    Mutant("megakernel MoE: a QKV block's k squares take in one extra row",
           "onelaunch/megakernel/vm_ops.py", "(at < s.q_size + s.kv_size)].sum()",
           "(at <= s.q_size + s.kv_size)].sum()", ["tests/test_vm_sums.py"]),
]


def scratch_copy(dst: Path) -> None:
    """The package, the tests and the pytest configuration, without build outputs."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for d in ("onelaunch", "tests", "ci"):
        shutil.copytree(ROOT / d, dst / d, ignore=ignore)
    for f in ("pyproject.toml", "pytest.ini", "setup.cfg", "conftest.py"):
        if (ROOT / f).exists():
            shutil.copy2(ROOT / f, dst / f)


def rel_path(m: Mutant) -> str:
    """The mutated file's path from the repository root."""
    return m.file if m.file.startswith(("onelaunch/", "ci/")) else KERNELS + m.file


def run(m: Mutant, python: str) -> dict:
    path = ROOT / rel_path(m)
    if not path.exists():
        return {"mutant": m.name, "status": "absent", "caught_by": [], "seconds": 0.0}
    text = path.read_text()
    if m.old not in text:
        return {"mutant": m.name, "status": "stale", "caught_by": [], "seconds": 0.0}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        tmp = Path(tmp)
        scratch_copy(tmp)
        (tmp / rel_path(m)).write_text(text.replace(m.old, m.new, 1))
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(tmp),
                   PYTHONDONTWRITEBYTECODE="1")
        p = subprocess.run([python, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
                            "-m", "not gpu", *m.tests], cwd=tmp, env=env,
                           capture_output=True, text=True)
    out = p.stdout + p.stderr
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)))
    status = "caught" if p.returncode != 0 else "SURVIVED"
    if p.returncode not in (0, 1):       # not a test failure: collection error, crash, ...
        failed = failed or [f"pytest exit {p.returncode}: " + out.strip().splitlines()[-1][:120]]
    return {"mutant": m.name, "status": status, "caught_by": failed,
            "seconds": round(time.time() - t0, 1), "tail": out[-2000:]}


def caught_by(test_ids: list[str]) -> str:
    """"n failed: f1, f2, ..." with each test function once (parameters left out)."""
    names = []
    for t in test_ids:
        n = re.sub(r"\[.*\]$", "", t.replace("tests/", "").replace(".py::", "::"))
        if n not in names:
            names.append(n)
    return f"{len(test_ids)} failed: " + ", ".join(names) if test_ids else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python ci/mutants.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", default="", help="only mutants whose name contains this")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="mutants run at a time")
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args(argv)
    todo = [m for m in MUTANTS if a.k.lower() in m.name.lower()]
    if a.list:
        for m in todo:
            print(f"{m.name:30} {m.file}: {m.old!r} -> {m.new!r}")
        return 0
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        results = []
        for r in ex.map(lambda m: run(m, a.python), todo):
            results.append(r)
            print(f"{r['mutant']:28} {r['status']:8} {r['seconds']:6.1f} s  "
                  f"{caught_by(r['caught_by'])}", flush=True)
    bad = [r for r in results if r["status"] in ("SURVIVED", "stale")]
    for r in bad:
        print(f"\n--- {r['mutant']}: {r['status']}\n{r.get('tail', '')}", file=sys.stderr)
    n_run = sum(r["status"] in ("caught", "SURVIVED") for r in results)
    print(f"\n{sum(r['status'] == 'caught' for r in results)} of {n_run} mutants caught "
          f"({sum(r['status'] == 'absent' for r in results)} absent from this tree) "
          f"in {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
