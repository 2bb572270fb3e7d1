"""Every error type ckptstore raises for something a user did or has is a CkptStoreError (the
CLI prints those as one line and exits 2). Runs without MindSpore (``make test-pure``)."""
from __future__ import annotations

import inspect

from ckptstore import errors
from ckptstore.errors import CkptStoreError


def test_every_error_type_users_can_cause_is_a_ckptstore_error():
    for name, cls in inspect.getmembers(errors, inspect.isclass):
        if cls.__module__ == errors.__name__:
            assert issubclass(cls, CkptStoreError), name
