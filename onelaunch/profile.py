"""``python -m onelaunch.profile``: where each rung's step time goes, per op
(:func:`onelaunch.cli.measure.profile_main`; the profile lives in
:mod:`onelaunch.measure.profile`)."""
import sys

from .cli.measure import profile_main

if __name__ == "__main__":
    sys.exit(profile_main())
