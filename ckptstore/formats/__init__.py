"""Bytes <-> records: the protobuf wire, MindSpore ``.ckpt`` files, MindSpore safetensors rank files,
safetensors headers. Parsers and writers of file formats; no layout math, no file opening."""
