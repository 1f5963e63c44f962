"""``python -m onelaunch.bench``: every kernel and rung, checked, then timed
(:func:`onelaunch.cli.measure.bench_main`; the measurements live in
:mod:`onelaunch.measure`)."""
import sys

from .cli.measure import bench_main

if __name__ == "__main__":
    sys.exit(bench_main())
