"""The ``torch`` backend: Whisper on PyTorch for CUDA targets (``cuda-sm90-bf16``…) and, for tests
and parity checks, on the CPU in float32. The modules here are the only importers of torch
(and of the ``tokenizers`` library) in tideserve."""
