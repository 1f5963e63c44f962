"""Lab: where the one-launch step's time goes, from ``step_check.py --clock``'s stamps
(the reading and the drawing are ``onelaunch/report/step_clock.py``, as in chapter 8).

    python lab/step_clock.py CLOCK_512.pt [--png TIMELINE.png [--until 130]]

Per op: instructions, mean wait (start to counters in) and work (counters in to end) in
µs; per layer: when each stage's last instruction ended (µs from the first start), so
the critical path reads off as the gaps between stages. ``--png``: the per-SM timeline
(waits in grey, work in its op's colour, the loader's asks; with the loader's stamps the
bytes in flight below) up to ``--until`` µs. The weight bytes come from the schedule
replanned at the file's shape (``qwen2.5-1.5b`` at ctx 512, the engine's attention form,
unless ``--model``/``--ctx``/``--attention``).
"""
import argparse

from onelaunch.megakernel.step import ATTENTION, STAGES, ring_bytes
from onelaunch.report import step_clock as sc
from onelaunch.specs import get_spec


def clock_of(path, model, ctx, attention):
    try:
        return sc.from_file(path, get_spec(model), ctx, attention)
    except ValueError as ex:
        raise SystemExit(f"{ex} (give --ctx/--attention)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--png")
    ap.add_argument("--until", type=float, default=130.0)
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--attention", default=ATTENTION,
                    help="the attention's form the file's kernel ran (schedule.FORMS)")
    a = ap.parse_args()
    c = clock_of(a.path, a.model, a.ctx, a.attention)
    print(f"step: {c.step_us:.1f} µs from the first start to the last end")
    print(f"{'op':<16}{'n':>6}{'wait µs':>10}{'work µs':>10}{'sum work/SM':>12}")
    for r in sc.op_rows(c):
        print(f"{r['op']:<16}{r['n']:>6}{r['wait_us']:>10.2f}{r['work_us']:>10.2f}"
              f"{r['work_per_sm_us']:>12.1f}")
    ends = sc.stage_ends(c)
    ops = [n for n in map(sc.op_name, sc.STEP_ORDER) if any(n in r for r in ends)]
    print("layer " + " ".join(f"{o[:9]:>10}" for o in ops))
    for r in ends:
        print(f"{'-' if r['layer'] is None else r['layer']:>5} "
              + " ".join(f"{r[o]:>10.1f}" if o in r else f"{'':>10}" for o in ops))
    if a.png:
        import matplotlib
        matplotlib.use("Agg")
        sc.draw(c, until=a.until, ring_bytes=ring_bytes(), ring_stages=STAGES).savefig(a.png)


if __name__ == "__main__":
    main()
