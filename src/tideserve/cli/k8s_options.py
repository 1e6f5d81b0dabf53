"""The rendering flags `tideserve render k8s` and `tideserve operator` share, defined once."""

from __future__ import annotations


import typer

from tideserve.k8s.render import RenderOptions
from tideserve.cli.common import err


IMAGE = typer.Option(RenderOptions.image, help="tideserve image the gateway and workers run (deploy/docker/Dockerfile)")
GPU_IMAGE = typer.Option(None, help="image for GPU pools (the Dockerfile's cuda target); default: --image with "
                                    "-cuda appended to its tag")
LB_SCHEME = typer.Option("internal", help="NLB scheme of the gateway: internal or internet-facing")
S3_REGION = typer.Option(None, help="region of s3:// model sources' buckets")
FSX_FILE_SYSTEM_ID = typer.Option(None, help="FSx for Lustre file system id (file:///fsx/... sources)")
FSX_DNS_NAME = typer.Option(None, help="FSx for Lustre DNS name")
FSX_MOUNT_NAME = typer.Option(None, help="FSx for Lustre mount name")
SCALER_ADDRESS = typer.Option(None, help="host:port KEDA dials for the external scaler (default: the endpoint's "
                                         "in-cluster scaler Service); for a gateway outside the cluster")


def render_options(namespace: str, image: str, gpu_image: str | None, lb_scheme: str, s3_region: str | None,
                   fsx_file_system_id: str | None, fsx_dns_name: str | None,
                   fsx_mount_name: str | None, scaler_address: str | None = None) -> RenderOptions:
    """RenderOptions from those flags; exits 2 on a bad load-balancer scheme."""
    if lb_scheme not in ("internal", "internet-facing"):
        err.print("[red]error:[/red] --lb-scheme must be internal or internet-facing", highlight=False)
        raise typer.Exit(2)
    return RenderOptions(namespace=namespace, image=image, gpu_image=gpu_image, load_balancer_scheme=lb_scheme,
                         s3_region=s3_region, fsx_file_system_id=fsx_file_system_id, fsx_dns_name=fsx_dns_name,
                         fsx_mount_name=fsx_mount_name, scaler_address=scaler_address or None)
