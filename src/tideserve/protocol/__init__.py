"""The three client APIs, as pure functions of bytes and fields (no web framework here).

- SageMaker style: ``POST /invocations`` (:mod:`.sagemaker`)
- KServe v2 / Open Inference Protocol, with the binary-tensor extension (:mod:`.kserve`)
- OpenAI style ``POST /v1/audio/transcriptions`` (:mod:`.openai`)

Both the gateway and the worker use :mod:`.errors` so that an error looks the same
wherever it is raised.
"""

from tideserve.protocol.types import Segment, TranscriptionRequest, TranscriptionResult

__all__ = ["Segment", "TranscriptionRequest", "TranscriptionResult"]
