"""tideserve render k8s | cluster | crd."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from manifest_checks import REPO
from tideserve.cli.main import app
from tideserve.k8s.cluster import ClusterConfig, render_cluster
from tideserve.k8s.crd import render_crd
from tideserve.k8s.render import RenderOptions, render_endpoint
from tideserve.spec import load_endpoint, load_model_text

runner = CliRunner()
TWO_POOLS = REPO / "examples" / "whisper-a10g-l40s.yaml"


def test_render_k8s_prints_the_manifests(tmp_path):
    r = runner.invoke(app, ["render", "k8s", str(TWO_POOLS), "--namespace", "ml", "--image", "reg/ts:1"])
    assert r.exit_code == 0, r.output
    assert list(yaml.safe_load_all(r.stdout)) == render_endpoint(load_endpoint(TWO_POOLS), RenderOptions(namespace="ml", image="reg/ts:1"))
    out = tmp_path / "m.yaml"
    r = runner.invoke(app, ["render", "k8s", str(TWO_POOLS), "--output", str(out)])
    assert r.exit_code == 0 and out.read_text().startswith("---\napiVersion: v1\n")


def test_render_k8s_errors_name_the_fix(tmp_path):
    ep = tmp_path / "fsx.yaml"
    ep.write_text(TWO_POOLS.read_text().replace("s3://tideserve-models/whisper/large-v3", "file:///fsx/models/x"))
    r = runner.invoke(app, ["render", "k8s", str(ep)])
    assert r.exit_code == 2
    assert "fsx_file_system_id (--fsx-file-system-id)" in r.output


def test_render_cluster_and_crd():
    r = runner.invoke(app, ["render", "cluster", str(REPO / "examples" / "cluster.yaml")])
    assert r.exit_code == 0, r.output
    cfg = load_model_text(ClusterConfig, (REPO / "examples" / "cluster.yaml").read_text())
    assert list(yaml.safe_load_all(r.stdout)) == render_cluster(cfg)
    r = runner.invoke(app, ["render", "crd"])
    assert r.exit_code == 0 and list(yaml.safe_load_all(r.stdout)) == [render_crd()]
    r = runner.invoke(app, ["render", "cluster", str(REPO / "nope.yaml")])
    assert r.exit_code == 2 and "cannot read" in r.output


def test_render_to_a_path_that_cannot_be_written_is_a_clear_error(tmp_path):
    # Before: a FileNotFoundError traceback from every render command's --output / --out.
    bad = tmp_path / "missing-dir" / "out.yaml"
    for args in (["render", "k8s", str(TWO_POOLS), "-o", str(bad)], ["render", "crd", "-o", str(bad)],
                 ["render", "cluster", str(REPO / "examples" / "cluster.yaml"), "-o", str(bad)],
                 ["render", "alerts", "--out", str(bad)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (args, r.output)
        assert f"error: cannot write {bad}: No such file or directory; choose a path in an existing, writable " \
               "directory" in " ".join(r.output.split())


def test_a_spec_error_keeps_its_brackets(tmp_path):
    # Before: rich read "[a-z0-9]" in the pattern as markup and dropped it, printing the wrong
    # pattern '^([-a-z0-9]{0,61})?$' to a user who named the endpoint "Wh_isper!".
    ep = tmp_path / "odd.yaml"
    ep.write_text(TWO_POOLS.read_text().replace("metadata: {name: whisper-gpu}", "metadata: {name: 'Wh_isper!'}"))
    assert "Wh_isper!" in ep.read_text()
    r = runner.invoke(app, ["render", "k8s", str(ep)])
    assert r.exit_code == 2
    assert "metadata.name (line 12): String should match pattern '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'" in r.output
