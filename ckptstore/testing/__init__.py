"""What tests and third parties reuse: MindSpore's own conversion as an oracle, a writer of real
MindSpore sample checkpoints, an S3 test server, and the conformance classes every store kind,
byte source and byte sink runs. Never imported by the runtime package."""
