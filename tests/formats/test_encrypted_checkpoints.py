"""Issue 26.4: checkpoints saved with ``enc_key`` (AES-GCM, AES-CBC, SM4-CBC).

Each mode is recognised by its magic number and named; ``convert`` with the key decrypts block by
block (MindSpore's own block decryption) into a plain store holding what
``mindspore.load_checkpoint(dec_key=, dec_mode=)`` gives; ``index`` refuses in one line (an index
cannot point into encrypted bytes). Files are written by ``mindspore.save_checkpoint(enc_key=,
enc_mode=)`` (one with small encryption blocks, so that records span several).
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mindspore")
pytestmark = pytest.mark.mindspore

import mindspore
import mindspore.train.serialization as serialization

import ckptstore
from ckptstore.errors import EncryptedCheckpointError
from ckptstore.testing.layouts import layout_specs
from ckptstore.testing.sample_checkpoint import (
    make_global_tensors,
    mindspore_rank_slice,
    to_ms_tensor,
    write_strategy,
)
from convert_fixtures import run_cli

MODES = ["AES-GCM", "AES-CBC", "SM4-CBC"]
KEY = b"0123456789abcdef"


def _save_encrypted(root, mode: str, block_kib: int | None = None):
    """dp2_mp2 (4 ranks) saved by MindSpore with enc_key/enc_mode (``block_kib``: the encryption block size)."""
    specs, world, _ = layout_specs("dp2_mp2")
    tensors = make_global_tensors(specs, seed=4)
    write_strategy(root / "strategy.ckpt", specs, stage=0)
    saved = serialization.ENCRYPT_BLOCK_SIZE
    serialization.ENCRYPT_BLOCK_SIZE = block_kib or saved
    try:
        for r in range(world):
            (root / f"rank_{r}").mkdir()
            items = [{"name": s.name, "data": to_ms_tensor(mindspore_rank_slice(s, tensors[s.name], r))} for s in specs]
            mindspore.save_checkpoint(items, str(root / f"rank_{r}" / "net-1_1.ckpt"), enc_key=KEY, enc_mode=mode)
    finally:
        serialization.ENCRYPT_BLOCK_SIZE = saved
    return mode, root, tensors


@pytest.fixture(scope="module", params=MODES)
def encrypted(request, tmp_path_factory):
    """One fixture per mode, in MindSpore's default encryption blocks (64 MiB: one per file here).

    Each call of MindSpore's block decryption costs ~60 ms here whatever the block's size (it
    allocates buffers for its largest block), so the tests keep the number of blocks small."""
    return _save_encrypted(tmp_path_factory.mktemp(request.param), request.param)


@pytest.mark.slow  # ~60 ms per block decrypted (MindSpore's), a dozen blocks
def test_records_cut_by_encryption_blocks_are_read_whole(tmp_path):
    mode, root, tensors = _save_encrypted(tmp_path / "ckpt", "AES-CBC", block_kib=2)
    blocks = (root / "rank_0" / "net-1_1.ckpt").read_bytes().count(bytes.fromhex("d95e3a7f"))
    assert blocks >= 3
    ckptstore.convert(root, tmp_path / "s", strategy=root / "strategy.ckpt", dec_key=KEY)
    with ckptstore.open(tmp_path / "s") as store:
        for name, value in tensors.items():
            assert store.read(name).tobytes() == np.asarray(value).tobytes(), name


def test_each_mode_is_recognised_and_named_with_the_option(encrypted, tmp_path):
    mode, root, _ = encrypted
    said = (f"the file is encrypted \\({mode}, saved with enc_key and enc_mode='{mode}'\\).*"
            f"--dec-key-file KEYFILE --dec-mode {mode}")
    with pytest.raises(EncryptedCheckpointError, match=said):
        ckptstore.convert(root, tmp_path / "s", strategy=root / "strategy.ckpt")


def test_convert_with_the_key_file_makes_the_plain_store_load_checkpoint_agrees_with(encrypted, tmp_path):
    mode, root, tensors = encrypted
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY + b"\n")
    r = run_cli("convert", root, "-s", root / "strategy.ckpt", "--out", tmp_path / "s", "--dec-key-file", key_file,
                "-q")
    assert r.returncode == 0, r.stderr
    with ckptstore.open(tmp_path / "s") as store:
        for name, value in tensors.items():
            assert store.read(name).tobytes() == np.asarray(value).tobytes(), name
    # rank 3's slices as MindSpore decrypts them
    mine = ckptstore.read_rank(tmp_path / "s", None, 3)
    theirs = {n: t.asnumpy() for n, t in mindspore.load_checkpoint(
        str(root / "rank_3" / "net-1_1.ckpt"), dec_key=KEY, dec_mode=mode).items()}
    assert mine.keys() == theirs.keys()
    for name in theirs:
        assert mine[name].tobytes() == theirs[name].tobytes(), name


@pytest.mark.slow
def test_the_key_may_come_from_the_environment(encrypted, tmp_path):
    mode, root, tensors = encrypted
    r = run_cli("convert", root, "-s", root / "strategy.ckpt", "--out", tmp_path / "s", "--dec-mode", mode, "-q",
                env={"CKPTSTORE_DEC_KEY": KEY.decode()})
    assert r.returncode == 0, r.stderr


def test_a_wrong_key_or_mode_is_refused_naming_the_file(encrypted, tmp_path):
    mode, root, _ = encrypted
    with pytest.raises(EncryptedCheckpointError, match="does not decrypt with the key given"):
        ckptstore.convert(root, tmp_path / "s", strategy=root / "strategy.ckpt", dec_key=b"x" * 16)
    other = next(m for m in MODES if m != mode)
    with pytest.raises(EncryptedCheckpointError, match=f"encrypted with {mode}, not {other}; pass --dec-mode {mode}"):
        ckptstore.convert(root, tmp_path / "s", strategy=root / "strategy.ckpt", dec_key=KEY, dec_mode=other)


def test_index_refuses_an_encrypted_source_in_one_line(encrypted, tmp_path):
    mode, root, _ = encrypted
    r = run_cli("index", root, "-s", root / "strategy.ckpt", "--out", tmp_path / "s")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"the file is encrypted ({mode}" in r.stderr and "[EncryptedCheckpointError]" in r.stderr


def test_an_encrypted_file_with_a_crc_trailer_converts(tmp_path):
    # save_checkpoint(crc_check=True, enc_key=...) appends its trailer unencrypted, with crc_num 0;
    # mindspore.load_checkpoint(dec_key=...) cannot read such a file back, ckptstore reads the records
    value = np.arange(40, dtype=np.float32)
    path = tmp_path / "net-1_1.ckpt"
    mindspore.save_checkpoint([{"name": "w", "data": mindspore.Tensor(value)}], str(path), enc_key=KEY,
                              enc_mode="AES-CBC", crc_check=True)
    assert path.read_bytes()[-17:-10] == b"crc_num"
    ckptstore.convert(path, tmp_path / "s", dec_key=KEY)
    with ckptstore.open(tmp_path / "s") as store:
        assert store.read("w").tobytes() == value.tobytes()


@pytest.mark.slow  # a process: MindSpore writes to its file descriptor 2
def test_a_wrong_key_at_the_cli_is_one_line(tmp_path):
    # MindSpore's block decryption logs "[ERROR] ... Decrypt failed" on the process's stderr itself
    (tmp_path / "ckpt").mkdir()
    _, root, _ = _save_encrypted(tmp_path / "ckpt", "AES-GCM")
    (tmp_path / "key").write_bytes(b"x" * 16)
    r = run_cli("convert", root, "-s", root / "strategy.ckpt", "--out", tmp_path / "s", "--dec-key-file",
                tmp_path / "key", "-q", process=True)  # its real stderr
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("ckptstore: error: encrypted block 0 does not decrypt with the key given (AES-GCM)")
