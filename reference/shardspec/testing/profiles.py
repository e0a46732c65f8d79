"""Hypothesis profiles for shardspec's property tests and the conformance suite.

``SHARDSPEC_HYPOTHESIS_PROFILE`` picks one:

- ``ci`` (default): derandomized and bounded, so every run checks the same examples quickly;
  the conformance suite runs 25 generated checkpoints with seed 0 unless told otherwise.
- ``thorough``: 1000 examples per property, random; the conformance suite runs 500 generated
  checkpoints with a random seed (printed, so a failure can be replayed with ``--seed``).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["PROFILE_ENV", "PROFILES", "conformance_defaults", "load_profile",
           "register_profiles"]

#: The environment variable that picks the profile.
PROFILE_ENV = "SHARDSPEC_HYPOTHESIS_PROFILE"
#: Profile name -> (generated checkpoints per conformance run, fixed seed or None for random).
PROFILES: dict[str, tuple[int, int | None]] = {"ci": (25, 0), "thorough": (500, None)}


def register_profiles() -> None:
    """Register the ``ci`` and ``thorough`` profiles with Hypothesis."""
    settings.register_profile("ci", derandomize=True, max_examples=40, deadline=None,
                              database=None, suppress_health_check=[HealthCheck.too_slow])
    # Explicit derandomize=False: a profile inherits from the default one, and Hypothesis's
    # default is itself derandomized when the CI environment variable is set.
    settings.register_profile("thorough", derandomize=False, max_examples=1000, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])


def profile_name(name: str | None = None) -> str:
    """The profile to use: ``name``, else the environment variable, else ``ci``."""
    chosen = name or os.environ.get(PROFILE_ENV) or "ci"
    if chosen not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={chosen!r}: expected one of {sorted(PROFILES)}")
    return chosen


def load_profile(name: str | None = None) -> str:
    """Register the profiles and load one (see :func:`profile_name`); return its name."""
    register_profiles()
    chosen = profile_name(name)
    settings.load_profile(chosen)
    return chosen


def conformance_defaults(name: str | None = None) -> tuple[int, int | None]:
    """(generated checkpoints, seed or None) for a conformance run under the profile."""
    return PROFILES[profile_name(name)]
