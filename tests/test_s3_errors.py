"""Object-storage errors that need no checkpoint: a denied request and a missing store, on a real
S3 server (moto) on loopback. Runs without MindSpore (``make test-pure``); the conversions and
loads through a bucket are in test_object_storage.py."""
from __future__ import annotations

import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto.server")

import ckptstore  # noqa: E402
from ckptstore.errors import AccessDeniedError, StoreNotFoundError  # noqa: E402
from ckptstore.testing import s3_server as S  # noqa: E402
from convert_fixtures import run_cli  # noqa: E402


@pytest.fixture(scope="module")
def auth_server():
    server = S.MotoServer(auth=True)
    yield server
    server.stop()


def test_access_denied_is_a_typed_error_naming_the_url_and_no_credentials(auth_server, monkeypatch):
    for k, v in S.env_for(auth_server.url).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(AccessDeniedError) as e:
        ckptstore.open("s3://private-bucket/models/pangu.zarr")
    message = str(e.value)
    assert "s3://private-bucket/models/pangu.zarr" in message and "403" in message
    assert S.SECRET_KEY not in message and S.ACCESS_KEY not in message


def test_the_cli_reports_access_denied_in_one_line_without_credentials(auth_server):
    r = run_cli("info", "s3://private-bucket/models/pangu.zarr", env=S.env_for(auth_server.url))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "access to s3://private-bucket/models/pangu.zarr" in r.stderr
    assert S.SECRET_KEY not in r.stderr + r.stdout and S.ACCESS_KEY not in r.stderr + r.stdout


def test_a_missing_store_is_named(bucket):
    with pytest.raises(StoreNotFoundError, match=f"no ckptstore store at {bucket.url('nothing')}"):
        ckptstore.open(bucket.url("nothing"))

