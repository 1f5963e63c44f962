"""Lab: where the one-launch step's time goes, from ``step_check.py --clock``'s stamps.

    python lab/step_clock.py CLOCK_512.pt [--png TIMELINE.png [--until 130]]

Per op: instructions, mean wait (start to counters in) and work (counters in to end) in
µs; per layer: when each stage's last instruction ended (µs from the first start), so
the critical path reads off as the gaps between stages. ``--png``: the per-SM timeline
(each instruction's wait in grey, its work in its op's colour) up to ``--until`` µs.
"""
import sys
from collections import defaultdict

import torch

from onelaunch.megakernel.isa import LAYER, OP, OPCODES, OP_END


def main(path):
    d = torch.load(path)
    clk, prog = d["clk"][-1].double(), d["prog"]          # the last step: [P, N, 4]
    live = prog[:, :, OP] != OP_END
    t0 = clk[..., 0][live].min()
    rel = (clk - t0) / 1e3                                  # µs
    ops = defaultdict(lambda: [0, 0.0, 0.0])
    ends = defaultdict(float)
    P, N = live.shape
    for p in range(P):
        for i in range(N):
            if not live[p, i]:
                continue
            op, layer = int(prog[p, i, OP]), int(prog[p, i, LAYER])
            s, w, e = rel[p, i, 0].item(), rel[p, i, 1].item(), rel[p, i, 2].item()
            o = ops[OPCODES[op]]
            o[0] += 1
            o[1] += w - s
            o[2] += e - w
            ends[(layer, op)] = max(ends[(layer, op)], e)
    total = rel[..., 2][live].max().item()
    print(f"step: {total:.1f} µs from the first start to the last end")
    print(f"{'op':<16}{'n':>6}{'wait µs':>10}{'work µs':>10}{'sum work/SM':>12}")
    for name, (n, w, k) in sorted(ops.items(), key=lambda kv: -kv[1][2]):
        print(f"{name:<16}{n:>6}{w / n:>10.2f}{k / n:>10.2f}{k / P:>12.1f}")
    order = sorted({op for _, op in ends})
    print("layer " + " ".join(f"{OPCODES[o][3:][:9]:>10}" for o in order))
    for layer in sorted({l for l, _ in ends}):
        row = [ends.get((layer, o)) for o in order]
        print(f"{layer:>5} " + " ".join(f"{v:>10.1f}" if v else f"{'':>10}" for v in row))


def timeline(path, out, until=130.0):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = torch.load(path)
    clk, prog = d["clk"][-1].double(), d["prog"]
    live = prog[:, :, OP] != OP_END
    rel = (clk - clk[..., 0][live].min()) / 1e3
    names = sorted({OPCODES[int(o)] for o in prog[:, :, OP][live].unique()})
    colours = dict(zip(names, plt.get_cmap("tab10").colors))
    fig, ax = plt.subplots(figsize=(12, 6), dpi=120)
    for p in range(live.shape[0]):
        for i in range(live.shape[1]):
            if not live[p, i] or rel[p, i, 0] > until:
                continue
            s, w, e = (rel[p, i, k].item() for k in range(3))
            ax.barh(p, w - s, left=s, height=1.0, color="0.85", linewidth=0)
            ax.barh(p, e - w, left=w, height=1.0, linewidth=0,
                    color=colours[OPCODES[int(prog[p, i, OP])]])
    for n, c in colours.items():
        ax.barh(0, 0, color=c, label=n[3:].lower())
    ax.barh(0, 0, color="0.85", label="waiting on a counter")
    ax.set_xlim(0, until)
    ax.set_xlabel("µs from the step's first instruction")
    ax.set_ylabel("SM")
    ax.legend(loc="upper right", fontsize=8, ncol=2)
    ax.set_title("One step in one launch: each SM's instructions (first layers)")
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    main(sys.argv[1])
    if "--png" in sys.argv:
        until = float(sys.argv[sys.argv.index("--until") + 1]) if "--until" in sys.argv \
            else 130.0
        timeline(sys.argv[1], sys.argv[sys.argv.index("--png") + 1], until)
