"""The safetensors store kind: whole global tensors in ``model-*.safetensors`` files that any
safetensors reader opens, and ``ckptstore.json`` (the format's details are in
:mod:`ckptstore.store.safetensors`; its writer is
:class:`~ckptstore.write.kinds.safetensors.SafetensorsWriter`)."""
from __future__ import annotations

import re
from collections.abc import Sequence

from ckptstore.store.kinds import StoreKind

#: The data files of a safetensors store (and their partial files).
SAFETENSORS_FILE = re.compile(r"^model-\d+-of-\d+\.safetensors(\.partial)?$")


def _model_files(keys: Sequence[str]) -> list[str]:
    return [k for k in keys if SAFETENSORS_FILE.match(k)]


KIND = StoreKind(
    name="safetensors",
    writer="ckptstore.write.kinds.safetensors:SafetensorsWriter",
    help="whole global tensors in model-*.safetensors files, readable with safetensors.safe_open (no compression)",
    label="safetensors",
    written=_model_files,
)
