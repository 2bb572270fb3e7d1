"""``bench_index --profile``'s phase timers (``benchmarks.index_profile``) name ckptstore's
internal functions: every one of them must still exist, or the profile of a slow index fails."""
from __future__ import annotations

import importlib

from benchmarks.index_profile import PHASES


def test_every_phase_names_a_function_that_exists() -> None:
    missing = []
    for module, attr, phase in PHASES:
        owner = importlib.import_module(module)
        for part in attr.split("."):
            owner = getattr(owner, part, None)
            if owner is None:
                missing.append(f"{module}.{attr} ({phase.strip()})")
                break
        else:
            if not callable(owner):
                missing.append(f"{module}.{attr} is not callable")
    assert not missing, missing
