"""What tests and third parties reuse, as ``zarr.testing`` is reused: MindSpore's own conversion as
an oracle (``oracle``), a writer of real MindSpore sample checkpoints (``sample_checkpoint``,
``sample``), the standard sample layouts and MindSpore's answer for each target (``layouts``),
bit-exact comparisons (``compare``), an S3 test server (``s3_server``), the CLI killed at a chosen
point (``kill_at``), and the conformance classes every store kind, byte source and byte sink
passes (``store_kind_tests.StoreKindTests``, ``source_tests.ByteSourceTests``,
``sink_tests.ByteSinkTests``). Never imported by the runtime package; MindSpore only when a
sample is saved or an oracle is run."""
