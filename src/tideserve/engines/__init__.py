"""Engines per target: build, manifest, and compatibility with the device a replica runs on."""

from tideserve.engines.compat import DeviceInfo, check_target, probe_device
from tideserve.engines.store import (
    EngineManifest,
    build_engine,
    check_engine,
    engine_dir,
    find_engine,
    model_key,
)

__all__ = [
    "DeviceInfo",
    "EngineManifest",
    "build_engine",
    "check_engine",
    "check_target",
    "engine_dir",
    "find_engine",
    "model_key",
    "probe_device",
]
