"""Every store kind writes, file for file and byte for byte, what 4ed4004 wrote (issue 34: the
writer pipeline was rebuilt under this test). tests/data/golden_stores.json holds the digests
recorded from 4ed4004 by tests/golden_stores.py, whose docstring says what is normalised."""
from __future__ import annotations

import json

import pytest

from ckptstore.testing.layouts import copy_layout
from golden_stores import LAYOUTS, digests
from repo_paths import DATA

GOLDEN = json.loads((DATA / "golden_stores.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def written(saved_layout, tmp_path_factory) -> dict[str, dict[str, str]]:
    # copies where golden_stores.main saves them: an index records its source folder relatively
    base = tmp_path_factory.mktemp("golden")
    return digests({k: copy_layout(saved_layout(k), base / "layouts" / k) for k in LAYOUTS}, base / "stores")


@pytest.mark.slow
@pytest.mark.parametrize("store", sorted(GOLDEN))
def test_the_store_is_byte_identical_to_the_one_4ed4004_wrote(written, store):
    assert written[store] == GOLDEN[store]


@pytest.mark.slow
def test_no_store_is_written_that_4ed4004_did_not_write(written):
    assert sorted(written) == sorted(GOLDEN)
