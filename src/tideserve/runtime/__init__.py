"""Where replicas live. ``local``: processes on this machine (the embedded default)."""
