"""``tideserve operator``: run the Kubernetes operator in this process (kopf, standalone)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True, soft_wrap=True)


def operator_command(
    namespace: Optional[List[str]] = typer.Option(None, "--namespace", "-n",
                                                  help="watch InferenceEndpoints in this namespace (repeatable)"),
    all_namespaces: bool = typer.Option(False, "--all-namespaces", "-A", help="watch every namespace"),
    image: str = typer.Option("ghcr.io/tideserve/tideserve:0.1.0",
                              help="tideserve image the rendered gateway and workers run"),
    gpu_image: Optional[str] = typer.Option(None, help="image for GPU pools; default: --image with -cuda appended to its tag"),
    lb_scheme: str = typer.Option("internal", help="NLB scheme of each gateway: internal or internet-facing"),
    s3_region: Optional[str] = typer.Option(None, help="region of s3:// model sources' buckets"),
    fsx_file_system_id: Optional[str] = typer.Option(None, help="FSx for Lustre file system id (file:///fsx/... sources)"),
    fsx_dns_name: Optional[str] = typer.Option(None, help="FSx for Lustre DNS name"),
    fsx_mount_name: Optional[str] = typer.Option(None, help="FSx for Lustre mount name"),
    kubeconfig: Optional[Path] = typer.Option(None, help="kubeconfig file (default: in-cluster service account, "
                                                         "else $KUBECONFIG or ~/.kube/config)"),
    context: Optional[str] = typer.Option(None, help="kubeconfig context"),
    liveness: str = typer.Option("http://0.0.0.0:8081/healthz",
                                 help="liveness probe endpoint URL ('' to serve none)"),
    log_format: str = typer.Option("json", help="json (one object a line) or text"),
) -> None:
    """Render and server-side-apply every InferenceEndpoint; report Ready/Degraded conditions."""
    from tideserve.cli.main import render_options
    from tideserve.k8s.apply import ApplyError, Cluster
    from tideserve.k8s.operator import install_log_filter, run_operator
    from tideserve.logs import setup_logging

    options = render_options("default", image, gpu_image, lb_scheme, s3_region, fsx_file_system_id, fsx_dns_name,
                             fsx_mount_name)
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
        raise typer.Exit(2)
    setup_logging("operator", log_format)
    install_log_filter()
    try:
        asyncio.run(run_operator(cluster, namespaces=None if all_namespaces else list(namespace or []),
                                 options=options, liveness_endpoint=liveness or None))
    except KeyboardInterrupt:  # pragma: no cover - interactive stop
        pass
    finally:
        cluster.close()
