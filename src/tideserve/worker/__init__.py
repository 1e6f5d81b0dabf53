"""The model server: one process serving one replica (``python -m tideserve.worker``)."""
