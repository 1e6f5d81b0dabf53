"""``tideserve operator``: run the Kubernetes operator in this process (kopf, standalone)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from rich.markup import escape

from tideserve.cli import k8s_options
from tideserve.cli.common import err, exit_missing_extra


def operator_command(
    namespace: list[str] | None = typer.Option(None, "--namespace", "-n",
                                                  help="watch InferenceEndpoints in this namespace (repeatable)"),
    all_namespaces: bool = typer.Option(False, "--all-namespaces", "-A", help="watch every namespace"),
    image: str = k8s_options.IMAGE,
    gpu_image: str | None = k8s_options.GPU_IMAGE,
    lb_scheme: str = k8s_options.LB_SCHEME,
    s3_region: str | None = k8s_options.S3_REGION,
    fsx_file_system_id: str | None = k8s_options.FSX_FILE_SYSTEM_ID,
    fsx_dns_name: str | None = k8s_options.FSX_DNS_NAME,
    fsx_mount_name: str | None = k8s_options.FSX_MOUNT_NAME,
    scaler_address: str | None = k8s_options.SCALER_ADDRESS,
    kubeconfig: Path | None = typer.Option(None, help="kubeconfig file (default: in-cluster service account, "
                                                         "else $KUBECONFIG or ~/.kube/config)"),
    context: str | None = typer.Option(None, help="kubeconfig context"),
    liveness: str = typer.Option("http://0.0.0.0:8081/healthz",
                                 help="liveness probe endpoint URL ('' to serve none)"),
    log_format: str = typer.Option("json", help="json (one object a line) or text"),
) -> None:
    """Render and server-side-apply every InferenceEndpoint; report Ready/Degraded conditions."""
    exit_missing_extra("tideserve operator", "k8s")
    from tideserve.k8s.apply import ApplyError, Cluster
    from tideserve.k8s.operator import install_log_filter, run_operator
    from tideserve.logs import setup_logging

    options = k8s_options.render_options("default", image, gpu_image, lb_scheme, s3_region, fsx_file_system_id, fsx_dns_name,
                                         fsx_mount_name, scaler_address)
    if bool(namespace) == all_namespaces:
        err.print("[red]error:[/red] pass --namespace NS (one or more) or --all-namespaces, not both or neither",
                  highlight=False)
        raise typer.Exit(2)
    if log_format not in ("json", "text"):
        err.print("[red]error:[/red] --log-format must be json or text", highlight=False)
        raise typer.Exit(2)
    if kubeconfig is not None and not kubeconfig.is_file():
        err.print(f"[red]error:[/red] --kubeconfig {kubeconfig}: no such file", highlight=False)
        raise typer.Exit(2)
    try:
        cluster = Cluster.connect(kubeconfig, context)
    except ApplyError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    setup_logging("operator", log_format)
    install_log_filter()
    try:
        asyncio.run(run_operator(cluster, namespaces=None if all_namespaces else list(namespace or []),
                                 options=options, liveness_endpoint=liveness or None))
    except KeyboardInterrupt:  # pragma: no cover - interactive stop
        pass
    finally:
        cluster.close()
