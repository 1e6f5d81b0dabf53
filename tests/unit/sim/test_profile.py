from __future__ import annotations

import json

import pytest

from tideserve.sim import SimInputError, load_profile
from tideserve.sim.profile import PoolProfile, ProfilePoint


def prof() -> PoolProfile:
    pts = {(1, 5.0): 1.0, (2, 5.0): 1.5, (4, 5.0): 2.5, (1, 15.0): 2.0, (2, 15.0): 3.0, (4, 15.0): 5.0}
    return PoolProfile(pool="cpu", target="cpu-x86_64-int8", accelerator="cpu",
                       points=[ProfilePoint(batch_size=b, audio_s=a, latency_s=v) for (b, a), v in pts.items()])


def test_interpolation_and_extrapolation():
    p = prof()
    assert p.service_time_s(2, 5.0) == 1.5
    assert p.service_time_s(3, 5.0) == 2.0  # halfway between 1.5 (b 2) and 2.5 (b 4)
    assert p.service_time_s(8, 5.0) == 4.5  # past b 4 along the line of b 2 -> 4 (0.5 s per window)
    assert p.service_time_s(1, 10.0) == 1.5  # halfway between 5 s (1.0) and 15 s (2.0)
    assert p.service_time_s(1, 1.0) == 1.0 and p.service_time_s(1, 30.0) == 2.0  # clamped lengths
    with pytest.raises(ValueError, match="batch_size 0"):
        p.service_time_s(0, 5.0)


def test_load_profile_errors(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text("{")
    with pytest.raises(SimInputError, match="is not JSON"):
        load_profile(bad)
    bad.write_text(json.dumps({"metadata": {"machine": "x", "date": "d", "model": "m"}, "pools": []}))
    with pytest.raises(SimInputError, match="pools: List should have at least 1 item"):
        load_profile(bad)
    good = {"metadata": {"machine": "x", "date": "d", "model": "m", "measured": False},
            "pools": [prof().model_dump()]}
    bad.write_text(json.dumps(good))
    with pytest.raises(SimInputError, match="measured: false"):
        load_profile(bad)
    good["metadata"]["measured"] = True
    bad.write_text(json.dumps(good))
    assert load_profile(bad).pools[0].service_time_s(2, 15.0) == 3.0


def test_committed_profiles_load():
    from pathlib import Path

    d = Path(__file__).resolve().parents[3] / "bench" / "profiles"
    cpu, gpu = load_profile(d / "cpu-2core-tiny-en.json"), load_profile(d / "gpu-h200-tiny-en.json")
    assert cpu.metadata.measured and cpu.metadata.gpu is None
    assert {x.target for x in cpu.pools} >= {"cpu-x86_64-int8"}
    assert gpu.metadata.measured and gpu.metadata.gpu == "NVIDIA H200" and gpu.metadata.backend == "torch"
    assert [(x.pool, x.target) for x in gpu.pools] == [("h100", "cuda-sm90-bf16")]
    assert len(gpu.pools[0].points) == 21  # batch 1..64 (7 sizes) x 5, 15, 30 s


def test_profiles_of_another_backend_are_refused():
    from pathlib import Path

    from tideserve.sim.profile import pools_for_backend

    d = Path(__file__).resolve().parents[3] / "bench" / "profiles"
    cpu, gpu = load_profile(d / "cpu-2core-tiny-en.json"), load_profile(d / "gpu-h200-tiny-en.json")
    assert [p.pool for p in pools_for_backend([cpu, gpu], ["c.json", "g.json"], "torch")] == ["h100"]
    assert {p.pool for p in pools_for_backend([cpu, gpu], ["c.json", "g.json"], "faster-whisper")} == {"cpu-int8", "cpu-fp32"}
    with pytest.raises(SimInputError, match=r"backend torch: c.json \(faster-whisper\); measure one"):
        pools_for_backend([cpu], ["c.json"], "torch")
