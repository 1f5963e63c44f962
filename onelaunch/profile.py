"""``python -m onelaunch.profile``: where each rung's step time goes, per op
(:func:`onelaunch.cli.profile.profile_main`; the profile lives in
:mod:`onelaunch.measure.profile`)."""
import sys

from .cli.profile import profile_main

if __name__ == "__main__":
    sys.exit(profile_main())
