import json
import os

import pytest

from tideserve.engines import DeviceInfo, EngineManifest, build_engine, check_engine, find_engine, model_key
from tideserve.errors import EngineMismatchError
from tideserve.spec import Target

T = Target.parse("cpu-x86_64-int8")


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"a": 1}')
    (d / "model.bin").write_bytes(os.urandom(4096))
    return d


def test_build_writes_a_manifest_and_is_found(tmp_path, model):
    cache = tmp_path / "cache"
    assert find_engine(cache, model, T.name) is None
    engine = build_engine(cache, model, "file:///m", T, "faster-whisper", "ctranslate2 4.8.5")
    m = EngineManifest.read(engine)
    assert (m.target, m.compute_type, m.backend, m.source) == ("cpu-x86_64-int8", "int8", "faster-whisper", "file:///m")
    assert set(m.files) == {"config.json", "model.bin"} and m.files["model.bin"]["size"] == 4096
    assert len(m.model_sha256) == 64 and m.model_key == model_key(model)
    assert (engine / "model.bin").read_bytes() == (model / "model.bin").read_bytes()
    assert find_engine(cache, model, T.name) == engine
    assert build_engine(cache, model, "file:///m", T, "faster-whisper", "x") == engine  # idempotent


def test_a_changed_model_needs_a_new_engine(tmp_path, model):
    cache = tmp_path / "cache"
    build_engine(cache, model, "file:///m", T, "faster-whisper", "x")
    before = (model / "model.bin").stat().st_mtime_ns
    (model / "model.bin").write_bytes(os.urandom(4096))  # same size: only the mtime tells
    os.utime(model / "model.bin", ns=(before + 1_000_000_000, before + 1_000_000_000))
    assert find_engine(cache, model, T.name) is None


def test_failed_verification_publishes_nothing(tmp_path, model):
    cache = tmp_path / "cache"

    def broken(engine_dir):
        raise RuntimeError("does not load")

    with pytest.raises(RuntimeError, match="does not load"):
        build_engine(cache, model, "file:///m", T, "faster-whisper", "x", verify=broken)
    assert find_engine(cache, model, T.name) is None
    assert not any(p.name.startswith(".build-") for p in (cache / "engines" / model_key(model)).iterdir())


def test_check_engine_refuses_mismatches_naming_both(tmp_path, model):
    cache = tmp_path / "cache"
    engine = build_engine(cache, model, "file:///m", T, "faster-whisper", "x")
    here = DeviceInfo("x86_64", cpu_flags=frozenset({"avx2"}))
    assert check_engine(engine, T.name, here).target == T.name
    with pytest.raises(EngineMismatchError, match="built for cpu-x86_64-int8, but the pool's target is cpu-x86_64-fp32"):
        check_engine(engine, "cpu-x86_64-fp32", here)
    with pytest.raises(EngineMismatchError, match="built for CPU ISA x86_64, but this machine is aarch64"):
        check_engine(engine, T.name, DeviceInfo("aarch64"))
    data = json.loads((engine / "engine.json").read_text())
    data["required_cpu_flags"] = ["avx512f", "avx2"]
    (engine / "engine.json").write_text(json.dumps(data))
    with pytest.raises(EngineMismatchError, match="needs CPU flags avx512f, which this machine lacks"):
        check_engine(engine, T.name, here)
    (engine / "engine.json").write_text("{not json")
    with pytest.raises(EngineMismatchError, match="not a readable engine manifest"):
        check_engine(engine, T.name, here)
