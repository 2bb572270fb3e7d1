"""Every error type ckptstore raises for something a user did or has is a CkptStoreError (the
CLI prints those as one line and exits 2), and arguments of the wrong kind are refused by name.
Runs without MindSpore (``make test-pure``)."""
from __future__ import annotations

import inspect

import pytest

import ckptstore
from ckptstore import errors
from ckptstore.errors import CkptStoreError, InvalidOptionError


def test_every_error_type_users_can_cause_is_a_ckptstore_error():
    for name, cls in inspect.getmembers(errors, inspect.isclass):
        if cls.__module__ == errors.__name__:
            assert issubclass(cls, CkptStoreError), name


def test_something_that_is_not_a_store_is_refused_by_name():
    with pytest.raises(InvalidOptionError, match="a store is a path, an s3:// or obs:// URL, or a ckptstore.Store, "
                                                 "not int"):
        ckptstore.verify(42)  # type: ignore[arg-type]
