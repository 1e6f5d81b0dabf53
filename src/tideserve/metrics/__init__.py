"""Metric names shared by the gateway and the worker (Triton's names for model metrics)."""
