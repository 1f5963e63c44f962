"""Lab: where the one-launch step's time goes, from ``step_check.py --clock``'s stamps.

    python lab/step_clock.py CLOCK_512.pt

Per op: instructions, mean wait (start to counters in) and work (counters in to end) in
µs; per layer: when each stage's last instruction ended (µs from the first start), so
the critical path reads off as the gaps between stages.
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


if __name__ == "__main__":
    main(sys.argv[1])
