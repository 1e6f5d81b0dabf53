"""Engines per target and their compatibility with the device a replica runs on."""

from tideserve.engines.compat import DeviceInfo, check_target, probe_device

__all__ = ["DeviceInfo", "check_target", "probe_device"]
