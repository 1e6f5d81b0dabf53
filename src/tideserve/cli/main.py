"""``tideserve`` commands: up, gateway, validate, invoke, status, top, build, render."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from tideserve.cli.common import err, load_or_exit as _load, out
from tideserve.cli.operator import operator_command
from tideserve.cli.sim import register as _register_sim
from tideserve.cli import k8s_options
from tideserve.errors import SpecError
from tideserve.spec import load_local_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="tideserve: one declarative inference endpoint.")
render_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Render generated artefacts.")
app.add_typer(render_app, name="render")


@app.command()
def validate(file: Path = typer.Argument(..., help="InferenceEndpoint YAML file")) -> None:
    """Check an endpoint file; print each problem with its field path, line and a hint."""
    ep = _load(file)
    pools = ", ".join(f"{p.name} ({p.accelerator}, {p.target}, {p.replicas.min}-{p.replicas.max} replicas)" for p in ep.spec.pools)
    out.print(f"{file}: valid InferenceEndpoint '{ep.metadata.name}' serving '{ep.spec.model.name}'; pools: {pools}", highlight=False)


@app.command()
def up(
    file: Path = typer.Argument(..., help="InferenceEndpoint YAML file"),
    config: Path | None = typer.Option(None, help="local config YAML (API keys, TLS, replica slots...)"),
    port: int | None = typer.Option(None, help="override spec.gateway.port (0 = any free port)"),
    host: str | None = typer.Option(None, help="override spec.gateway.host"),
    port_file: Path | None = typer.Option(None, help="write the bound gateway port to this file"),
    log_format: str = typer.Option("json", help="json (one object a line) or text"),
    build_engines: bool = typer.Option(True, "--build/--no-build",
                                       help="build missing engines for targets this machine runs (else such pools are refused)"),
) -> None:
    """Serve an endpoint in the foreground: gateway plus local replicas. Ctrl-C stops all."""
    from tideserve.cli.serve import run_endpoint
    from tideserve.logs import setup_logging

    if log_format not in ("json", "text"):
        err.print("--log-format must be json or text")
        raise typer.Exit(2)
    ep = _load(file)
    try:
        cfg = load_local_config(config)
    except SpecError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    if port is not None or host is not None:
        gw = ep.spec.gateway.model_copy(update={k: v for k, v in (("port", port), ("host", host)) if v is not None})
        ep = ep.model_copy(update={"spec": ep.spec.model_copy(update={"gateway": gw})})
    setup_logging("gateway", log_format)
    raise typer.Exit(asyncio.run(run_endpoint(file, ep, cfg, config, log_format, port_file, build_engines)))


def _usable_base_url(url: str) -> bool:
    """An http(s) URL with a host without spaces and a port in 0..65535 (urllib's parse)."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError when out of range or not a number
    except ValueError:
        return False
    host = parts.hostname or ""
    return parts.scheme in ("http", "https") and bool(host) and not any(c.isspace() for c in host)


@app.command()
def gateway(
    file: Path = typer.Argument(..., help="InferenceEndpoint YAML file"),
    namespace: str | None = typer.Option(None, help="Kubernetes namespace of the pools' headless Services"),
    host: str = typer.Option("0.0.0.0", help="address to bind (HTTP and the KEDA scaler)"),
    port: int = typer.Option(8080, min=0, max=65535, help="HTTP port (0 = any free port)"),
    scaler_port: int = typer.Option(9090, min=0, max=65535, help="KEDA external-scaler gRPC port (0 = any free port)"),
    discovery: str = typer.Option("dns", help="dns (each pool's headless Service) or static (--replica)"),
    replica: list[str] = typer.Option([], help="with --discovery static: POOL=URL, repeatable"),
    api_keys_file: Path | None = typer.Option(None, envvar="TIDESERVE_API_KEYS_FILE",
                                                 help="file of accepted API keys, one a line (default: no auth)"),
    port_file: Path | None = typer.Option(None, help='write {"port": ..., "scaler_port": ...} here once listening'),
    log_format: str = typer.Option("json", help="json (one object a line) or text"),
) -> None:
    """Run the gateway alone (Kubernetes mode): replicas from DNS, scaling published to KEDA.

    The worker token comes from $TIDESERVE_WORKER_TOKEN when set.
    """
    from tideserve.cli.gateway import run_gateway
    from tideserve.logs import setup_logging
    from tideserve.spec import LocalConfig

    if log_format not in ("json", "text"):
        err.print("--log-format must be json or text")
        raise typer.Exit(2)
    if discovery not in ("dns", "static"):
        err.print(f"[red]error:[/red] --discovery must be dns or static, not '{discovery}'", highlight=False)
        raise typer.Exit(2)
    if replica and discovery != "static":
        err.print("[red]error:[/red] --replica needs --discovery static", highlight=False)
        raise typer.Exit(2)
    ep = _load(file)
    static: dict[str, list[str]] = {}
    for item in replica:
        pool, sep, url = item.partition("=")
        if not sep or not pool or not _usable_base_url(url):
            err.print(f"[red]error:[/red] --replica '{escape(item)}': write POOL=URL with a valid http(s) URL, "
                      "e.g. cpu=http://127.0.0.1:8000", highlight=False)
            raise typer.Exit(2)
        static.setdefault(pool, []).append(url.rstrip("/"))
    keys: list[str] = []
    if api_keys_file is not None:
        try:
            keys = LocalConfig(api_keys_file=api_keys_file).all_api_keys()
        except (OSError, ValueError) as exc:
            err.print(f"[red]error:[/red] --api-keys-file {api_keys_file}: {escape(str(exc))}", highlight=False)
            raise typer.Exit(2) from None
    setup_logging("gateway", log_format)
    raise typer.Exit(asyncio.run(run_gateway(ep, namespace, host, port, scaler_port, discovery, static, keys, port_file)))


def _base_url(file: Path | None, url: str | None, config: Path | None) -> str:
    """The gateway URL: ``--url``, else the endpoint file's host and port, https when the
    local config (``--config``, $TIDESERVE_CONFIG or the user's) enables TLS."""
    if url:
        return url.rstrip("/")
    if file is None:
        return "http://127.0.0.1:8080"
    gw = _load(file).spec.gateway
    try:
        cfg = load_local_config(config)
    except SpecError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    scheme = "https" if cfg.tls_cert_file else "http"
    host = "127.0.0.1" if gw.host in ("0.0.0.0", "::") else gw.host
    return f"{scheme}://{host}:{gw.port}"


def _cacert(cacert: Path | None, config: Path | None, url: str) -> Path | None:
    """--cacert, else the certificate the local config serves with (often self-signed)."""
    if cacert is not None or not url.startswith("https://"):
        return cacert
    try:
        cfg = load_local_config(config)
    except SpecError:
        return None
    return cfg.tls_cert_file


def _check_endpoint(file: Path | None, url: str | None, served: str) -> None:
    """Warn when the gateway reached serves another endpoint than FILE names (e.g. FILE's port
    was overridden with `up --port`)."""
    if file is None or url is not None:
        return
    expected = _load(file).metadata.name
    if served != expected:
        err.print(f"[yellow]warning:[/yellow] the gateway at {_base_url(file, None, None)} serves endpoint "
                  f"'{served}', not '{expected}' from {file}; pass --url to reach the right one", highlight=False)


def _request(url: str, data: bytes | None, api_key: str | None, cacert: Path | None, timeout: float,
             raw: bool = False):
    try:
        req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    except ValueError as exc:
        err.print(f"[red]error:[/red] {url} is not a usable URL ({escape(str(exc))}); e.g. http://127.0.0.1:8080", highlight=False)
        raise typer.Exit(2) from None
    req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        ctx = ssl.create_default_context(cafile=str(cacert)) if cacert else None
    except (OSError, ssl.SSLError) as exc:
        err.print(f"[red]error:[/red] cannot use --cacert {cacert}: {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            body = resp.read()
            return body.decode() if raw else json.loads(body)
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        try:
            msg = json.loads(body).get("message", body)
        except json.JSONDecodeError:
            msg = body
        hint = " (set --api-key or $TIDESERVE_API_KEY)" if exc.code == 401 else ""
        err.print(f"[red]error {exc.code}:[/red] {escape(str(msg))}{hint}", highlight=False)
        raise typer.Exit(1) from None
    except urllib.error.URLError as exc:
        hint = "; is `tideserve up` running? (on another port or host: pass --url)"
        if isinstance(exc.reason, ssl.SSLError):
            if "WRONG_VERSION_NUMBER" in str(exc.reason):
                hint = "; the server speaks plain HTTP: use an http:// URL"
            else:
                hint = "; pass --cacert with the CA that signed the server's certificate"
        err.print(f"[red]error:[/red] cannot reach {url}: {exc.reason}{hint}", highlight=False)
        raise typer.Exit(1) from None
    except TimeoutError:
        err.print(f"[red]error:[/red] {url}: no answer within {timeout:g} s (raise --timeout for long audio)", highlight=False)
        raise typer.Exit(1) from None
    except (http.client.HTTPException, ConnectionError) as exc:
        hint = " (the server may speak HTTPS: use --url https://... or --config with its TLS settings)" \
            if url.startswith("http://") else ""
        err.print(f"[red]error:[/red] {url}: the connection failed: {exc!r}{hint}", highlight=False)
        raise typer.Exit(1) from None
    except ValueError as exc:  # a malformed --url
        err.print(f"[red]error:[/red] {url} is not a usable URL ({escape(str(exc))}); e.g. http://127.0.0.1:8080", highlight=False)
        raise typer.Exit(2) from None


@app.command()
def invoke(
    file: Path = typer.Argument(..., help="InferenceEndpoint YAML file (gives the address)"),
    audio: list[Path] = typer.Argument(..., help="audio files to transcribe"),
    prompt: str = typer.Option("", help="Whisper initial prompt"),
    url: str | None = typer.Option(None, help="gateway URL (default: from the endpoint file)"),
    config: Path | None = typer.Option(None, help="local config (tells whether the gateway uses TLS)"),
    api_key: str | None = typer.Option(None, envvar="TIDESERVE_API_KEY", help="API key (or $TIDESERVE_API_KEY)"),
    cacert: Path | None = typer.Option(None, help="CA bundle to trust for TLS"),
    timeout: float = typer.Option(600.0, min=0.001, help="seconds to wait for each answer"),
) -> None:
    """Transcribe audio files through the endpoint; print one line of text per file."""
    base = _base_url(file, url, config)
    for path in audio:
        try:
            data = path.read_bytes()
        except OSError as exc:
            err.print(f"[red]error:[/red] cannot read {path}: {exc.strerror}")
            raise typer.Exit(1) from None
        body = json.dumps({"audio_data": base64.b64encode(data).decode(), "whisper_prompt": prompt}).encode()
        result = _request(base + "/invocations", body, api_key, _cacert(cacert, config, base), timeout)
        text = result.get("transcribe_text", "")
        print(f"{path}: {text}" if len(audio) > 1 else text)
        if result.get("language_mismatch"):  # the endpoint's language-ID model heard another language
            lang, p = result.get("detected_language") or "another language", result.get("detected_language_probability")
            err.print(f"[yellow]warning:[/yellow] {path}: the speech sounds like {lang}"
                      + (f" (probability {p:.2f})" if isinstance(p, (int, float)) else "")
                      + ", which the endpoint's model cannot transcribe; the text above may be invented "
                      "(README, Languages: use a multilingual model)", highlight=False)


@app.command()
def status(
    file: Path | None = typer.Argument(None, help="InferenceEndpoint YAML file (gives the address)"),
    url: str | None = typer.Option(None, help="gateway URL"),
    config: Path | None = typer.Option(None, help="local config (tells whether the gateway uses TLS)"),
    api_key: str | None = typer.Option(None, envvar="TIDESERVE_API_KEY", help="API key (or $TIDESERVE_API_KEY)"),
    cacert: Path | None = typer.Option(None, help="CA bundle to trust for TLS"),
    as_json: bool = typer.Option(False, "--json", help="print the raw admin status"),
) -> None:
    """Pools, replicas and their state, in-flight and pending requests."""
    base = _base_url(file, url, config)
    st = _request(base + "/admin/status", None, api_key, _cacert(cacert, config, base), 10)
    _check_endpoint(file, url, st["endpoint"])
    if as_json:
        print(json.dumps(st, indent=2))
        return
    g = st["gateway"]
    out.print(f"endpoint [bold]{st['endpoint']}[/bold]  model {st['model']}  in-flight {g['in_flight']}  pending {g['pending']}")
    t = Table("pool", "target", "state", "ready/desired", "replica", "replica state", "outstanding", "restarts", "pid", "reason")
    for p in st["pools"]:
        first = True
        for r in p["replicas"] or [None]:
            t.add_row(
                p["name"] if first else "", p["target"] if first else "", p["state"] if first else "",
                f"{p['ready']}/{p['desired']}" if first else "",
                r["id"] if r else "-", r["state"] if r else "-", str(r.get("outstanding", 0)) if r else "-",
                str(r["restarts"]) if r else "-", str(r["pid"] or "-") if r else "-",
                p["reason"] if first else "",
            )
            first = False
    out.print(t)
    last = st.get("last_decision")
    if last:
        desired = ", ".join(f"{k}={v}" for k, v in last["desired"].items())
        inputs = ", ".join(f"{k}={v}" for k, v in last["inputs"].items())
        out.print(f"autoscaler ({last['age_s']:.1f}s ago): desired {desired} because {last['reason']}", highlight=False)
        out.print(f"  inputs: {inputs}", highlight=False)


@app.command()
def build(
    file: Path = typer.Argument(..., help="InferenceEndpoint YAML file (gives the model and its backend)"),
    target: str | None = typer.Option(None, help="engine target, e.g. cpu-x86_64-int8; default: every pool's"),
    config: Path | None = typer.Option(None, help="local config (cache directory, allowed file roots)"),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="load the engine once before publishing it"),
    force: bool = typer.Option(False, "--force", help="rebuild even if an engine exists (e.g. one with a bad manifest)"),
) -> None:
    """Build the engine of the endpoint's model for a target; print the engine directory."""
    from tideserve.cli.engines import build as build_engine
    from tideserve.errors import EngineMismatchError, SourceError
    from tideserve.spec import Target

    ep = _load(file)
    try:
        cfg = load_local_config(config)
        targets = [Target.parse(target)] if target else list({p.parsed_target: None for p in ep.spec.pools})
    except SpecError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    except ValueError as exc:
        err.print(f"[red]error:[/red] --target: {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    for t in targets:
        try:
            path = build_engine(ep, t, cfg, verify, force)
        except (EngineMismatchError, SourceError, OSError, RuntimeError) as exc:
            err.print(f"[red]error:[/red] {t.name}: {escape(str(exc))}", highlight=False)
            raise typer.Exit(1) from None
        note = ""
        try:
            from tideserve.engines import check_target, probe_device

            check_target(t, probe_device())
        except EngineMismatchError:
            note = "  (not loaded to verify: the target does not run on this machine)"
        print(f"{t.name}: {path}{note}")


@app.command()
def top(
    file: Path | None = typer.Argument(None, help="InferenceEndpoint YAML file (gives the address)"),
    url: str | None = typer.Option(None, help="gateway URL"),
    config: Path | None = typer.Option(None, help="local config (tells whether the gateway uses TLS)"),
    api_key: str | None = typer.Option(None, envvar="TIDESERVE_API_KEY", help="API key (or $TIDESERVE_API_KEY)"),
    cacert: Path | None = typer.Option(None, help="CA bundle to trust for TLS"),
    interval: float = typer.Option(2.0, min=0.1, help="seconds between refreshes"),
    iterations: int = typer.Option(0, min=0, help="stop after this many frames (0: until Ctrl-C)"),
) -> None:
    """Live view of pools, replicas, request rate, latency and pending requests."""
    from tideserve.cli.top import run_top

    base = _base_url(file, url, config)
    ca = _cacert(cacert, config, base)

    def fetch() -> tuple[dict, str]:
        status = _request(base + "/admin/status", None, api_key, ca, 10)
        return status, _request(base + "/metrics", None, api_key, ca, 10, raw=True)

    _check_endpoint(file, url, fetch()[0]["endpoint"])

    run_top(fetch, interval, iterations, out)


@render_app.command("dashboard")
def render_dashboard(
    out_file: Path | None = typer.Option(None, "--out", help="write here instead of standard output"),
    datasource_uid: str | None = typer.Option(
        None, help="preselect this Grafana Prometheus data source (uid); default: Grafana's default one"),
) -> None:
    """The Grafana dashboard (JSON), generated from tideserve.metrics.panels, with data source,
    endpoint and pool variables."""
    from tideserve.metrics.dashboard import build_dashboard

    text = json.dumps(build_dashboard(datasource_uid), indent=2, sort_keys=True) + "\n"
    _emit(text, out_file)


@render_app.command("alerts")
def render_alerts(
    out_file: Path | None = typer.Option(None, "--out", help="write here instead of standard output"),
) -> None:
    """Prometheus alerting rules (YAML) for tideserve endpoints."""
    import yaml

    from tideserve.metrics.panels import alert_rules

    _emit(yaml.safe_dump(alert_rules(), sort_keys=False, width=120), out_file)


@render_app.command("k8s")
def render_k8s(
    file: Path = typer.Argument(..., help="InferenceEndpoint YAML file"),
    namespace: str = typer.Option("default", help="namespace of the endpoint's objects"),
    image: str = k8s_options.IMAGE,
    gpu_image: str | None = k8s_options.GPU_IMAGE,
    lb_scheme: str = k8s_options.LB_SCHEME,
    s3_region: str | None = k8s_options.S3_REGION,
    fsx_file_system_id: str | None = k8s_options.FSX_FILE_SYSTEM_ID,
    fsx_dns_name: str | None = k8s_options.FSX_DNS_NAME,
    fsx_mount_name: str | None = k8s_options.FSX_MOUNT_NAME,
    output: Path | None = typer.Option(None, "--output", "-o", help="write here instead of standard output"),
) -> None:
    """The endpoint's Kubernetes manifests (multi-document YAML): workers, gateway, KEDA, volumes."""
    from tideserve.k8s.render import render_endpoint, to_yaml

    opts = k8s_options.render_options(namespace, image, gpu_image, lb_scheme, s3_region, fsx_file_system_id, fsx_dns_name,
                          fsx_mount_name)
    ep = _load(file)
    try:
        objects = render_endpoint(ep, opts)
    except SpecError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    _emit(to_yaml(objects), output)


@render_app.command("cluster")
def render_cluster_cmd(
    file: Path = typer.Argument(..., help="cluster config YAML (see examples/cluster.yaml)"),
    output: Path | None = typer.Option(None, "--output", "-o", help="write here instead of standard output"),
) -> None:
    """Cluster-level objects: Karpenter NodePools and EC2NodeClass, PriorityClasses, dashboard ConfigMap."""
    from tideserve.k8s.cluster import ClusterConfig, render_cluster
    from tideserve.k8s.render import to_yaml
    from tideserve.spec import load_model_text

    try:
        cfg = load_model_text(ClusterConfig, file.read_text(), str(file))
    except OSError as exc:
        err.print(f"[red]error:[/red] cannot read {file}: {exc.strerror}", highlight=False)
        raise typer.Exit(2) from None
    except SpecError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    _emit(to_yaml(render_cluster(cfg)), output)


@render_app.command("crd")
def render_crd_cmd(
    output: Path | None = typer.Option(None, "--output", "-o", help="write here instead of standard output"),
) -> None:
    """The InferenceEndpoint CustomResourceDefinition (YAML), generated from the spec."""
    from tideserve.k8s.crd import render_crd
    from tideserve.k8s.render import to_yaml

    _emit(to_yaml([render_crd()]), output)


def _emit(text: str, out_file: Path | None) -> None:
    if out_file is None:
        sys.stdout.write(text)
    else:
        try:
            out_file.write_text(text)
        except OSError as exc:
            err.print(f"[red]error:[/red] cannot write {out_file}: {exc.strerror or exc}; choose a path in an "
                      "existing, writable directory", highlight=False)
            raise typer.Exit(1) from None
        err.print(f"wrote {out_file}", highlight=False)


app.command("operator")(operator_command)

_register_sim(app)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
