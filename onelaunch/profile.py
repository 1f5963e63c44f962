"""``python -m onelaunch.profile``: where each rung's step time goes, per op
(:func:`onelaunch.measure.commands.profile_main`; the profile lives in
:mod:`onelaunch.measure.profile`)."""
import sys

from .measure.commands import profile_main

if __name__ == "__main__":
    sys.exit(profile_main())
