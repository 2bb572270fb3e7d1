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
        ckptstore.verify(42)


def test_a_path_with_no_store_says_what_makes_one(tmp_path):
    with pytest.raises(errors.StoreNotFoundError) as info:
        ckptstore.open(tmp_path / "nothing")
    assert str(info.value) == (f"no ckptstore store at {tmp_path / 'nothing'}: it does not exist (a store is a folder "
                               "made by 'ckptstore convert' or 'ckptstore index', or the root of save_rank's steps)")


def test_verify_refuses_source_options_without_the_source(tmp_path):
    # they were ignored: a user who forgot --against got "OK" from the checksums alone
    with pytest.raises(InvalidOptionError) as info:
        ckptstore.verify(tmp_path / "s.zarr", strategy=["strategy.ckpt"], step=3)
    assert str(info.value) == ("strategy=, step= without against= (--against SRC): these pick the source files to "
                               "compare the store with; pass the source too, or leave them out to check the checksums "
                               "only")
