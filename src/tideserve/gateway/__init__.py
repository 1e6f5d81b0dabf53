"""The single entry point: routing, holding while no replica can take work, limits, admin API."""
