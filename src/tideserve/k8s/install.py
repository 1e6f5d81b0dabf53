"""The install base: CRD, namespace, the operator's RBAC and Deployment, as a kustomize base.

``kustomize_files(image, namespace)`` returns ``{file name: YAML text}`` for deploy/kustomize/
(a test checks the committed files equal this output). The operator's ClusterRole holds the
least rights it needs: read and patch InferenceEndpoints and their status; server-side apply
(get, create, patch) and delete of each kind ``render_endpoint`` emits; patch on pods (it
removes ``karpenter.sh/do-not-disrupt`` once a pod is Ready); create the worker-token Secret;
post Events; list CRDs and namespaces (kopf's resource and namespace discovery). The operator
runs ``tideserve operator --all-namespaces --image IMAGE``: an overlay that changes the image
must change that argument too (kustomize's ``images:`` rewrites only the container image).
"""

from __future__ import annotations

from tideserve import __version__
from tideserve.k8s import names
from tideserve.k8s.crd import render_crd
from tideserve.k8s.render import to_yaml

OPERATOR = "tideserve-operator"
_APPLY = ["get", "list", "watch", "create", "patch", "delete"]


def _labels() -> dict[str, str]:
    return {names.LABEL_NAME: "tideserve", names.LABEL_MANAGED_BY: names.FIELD_MANAGER,
            names.LABEL_COMPONENT: "operator"}


def cluster_role() -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": OPERATOR, "labels": _labels()},
        "rules": [
            {"apiGroups": [names.GROUP], "resources": [names.PLURAL], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [names.GROUP], "resources": [f"{names.PLURAL}/status"], "verbs": ["get", "patch"]},
            {"apiGroups": [""], "resources": ["configmaps", "services", "persistentvolumeclaims", "persistentvolumes"],
             "verbs": _APPLY},
            # The worker-token Secret: created once (POST; 409 when it exists) and deleted by the
            # garbage collector with its endpoint (owner reference). No list: listing Secrets
            # would let the operator read every Secret of the cluster.
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": _APPLY},
            {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": _APPLY},
            {"apiGroups": ["keda.sh"], "resources": ["scaledobjects"], "verbs": _APPLY},
            {"apiGroups": ["monitoring.coreos.com"], "resources": ["podmonitors", "servicemonitors"], "verbs": _APPLY},
            {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
             "verbs": ["get", "list", "watch"]},
        ],
    }


def install_objects(image: str, namespace: str = "tideserve-system") -> list[dict]:
    """Namespace, ServiceAccount, ClusterRole + binding and the operator Deployment (not the CRD)."""
    labels = _labels()
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": OPERATOR, "namespace": namespace, "labels": labels}}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": OPERATOR, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR},
        "subjects": [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": namespace}],
    }
    selector = {names.LABEL_NAME: "tideserve", names.LABEL_COMPONENT: "operator"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": OPERATOR, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # one operator at a time
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": OPERATOR,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "operator",
                        "image": image,
                        # Cluster-wide (the ClusterRole); the rendered gateway and workers run the same image.
                        "command": ["tideserve", "operator", "--all-namespaces", "--image", image],
                        "ports": [{"name": "health", "containerPort": 8081, "protocol": "TCP"}],
                        # kopf's liveness endpoint (tideserve operator --liveness, default :8081/healthz)
                        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 30,
                                          "timeoutSeconds": 5, "failureThreshold": 3},
                        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                                {"name": "PYTHONUNBUFFERED", "value": "1"}],
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}],
                },
            },
        },
    }
    ns = {"apiVersion": "v1", "kind": "Namespace",
          "metadata": {"name": namespace, "labels": {**labels, "pod-security.kubernetes.io/enforce": "restricted"}}}
    return [ns, sa, cluster_role(), binding, deployment]


def kustomize_files(image: str = names.DEFAULT_IMAGE, namespace: str = "tideserve-system") -> dict[str, str]:
    """The kustomize base: file name -> text. ``kustomize build deploy/kustomize`` (or
    ``kubectl apply -k``) installs the CRD and the operator; ``kustomize edit set image`` changes
    the image."""
    objs = install_objects(image, namespace)
    repo, _, tag = image.rpartition(":")
    header = "# Generated by tideserve.k8s.install; tests/unit/k8s/test_committed.py checks it.\n"
    kustomization = (
        header
        + "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n"
        + "".join(f"  - {f}\n" for f in ("crd.yaml", "namespace.yaml", "rbac.yaml", "operator.yaml"))
        + f"images:\n  - name: {repo}\n    newTag: \"{tag}\"\n"
    )
    return {
        "kustomization.yaml": kustomization,
        "crd.yaml": header + to_yaml([render_crd()]),
        "namespace.yaml": header + to_yaml([objs[0]]),
        "rbac.yaml": header + to_yaml(objs[1:4]),
        "operator.yaml": header + to_yaml([objs[4]]),
    }


# -- Helm chart --------------------------------------------------------------------------------------
# The chart is generated from the same objects as the kustomize base (install_objects): the
# objects are rendered with placeholder values, then each placeholder becomes a template
# expression. The CRD goes in crds/ (Helm installs it before the templates and never deletes it).
CHART_NAME = "tideserve"
CHART_VERSION = __version__
_IMAGE_MARK = "TIDESERVE-HELM-IMAGE"
_NAMESPACE_MARK = "TIDESERVE-HELM-NAMESPACE"
_IMAGE_EXPR = '"{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"'
_NAMESPACE_EXPR = "{{ .Release.Namespace }}"


def helm_chart_files(image: str = names.DEFAULT_IMAGE) -> dict[str, str]:
    """The Helm chart deploy/helm/tideserve/: relative path -> text. Installs the CRD, the
    operator's ServiceAccount, ClusterRole + binding and Deployment into the release namespace
    (``helm install tideserve deploy/helm/tideserve -n tideserve-system --create-namespace``;
    label that namespace ``pod-security.kubernetes.io/enforce=restricted`` as namespace.yaml of
    the kustomize base does). ``--set image.repository=...,image.tag=...`` changes the image of
    the operator and of what it renders alike."""
    repo, _, tag = image.rpartition(":")
    objs = install_objects(f"{_IMAGE_MARK}", _NAMESPACE_MARK)[1:]  # no Namespace: Helm's release namespace

    def template(objects: list[dict]) -> str:
        text = to_yaml(objects)
        text = text.replace(_IMAGE_MARK, _IMAGE_EXPR).replace(_NAMESPACE_MARK, _NAMESPACE_EXPR)
        return text

    header = "# Generated by tideserve.k8s.install (helm_chart_files); tests/unit/k8s/test_cluster.py checks it.\n"
    chart = (f"{header}apiVersion: v2\nname: {CHART_NAME}\ndescription: The tideserve operator and its "
             f"InferenceEndpoint CRD\ntype: application\nversion: {CHART_VERSION}\nappVersion: \"{tag}\"\n")
    values = (f"{header}image:\n  repository: {repo}\n  # default: the chart's appVersion\n  tag: \"\"\n")
    return {
        "Chart.yaml": chart,
        "values.yaml": values,
        "crds/inferenceendpoints.yaml": header + to_yaml([render_crd()]),
        "templates/rbac.yaml": header + template(objs[0:3]),
        "templates/operator.yaml": header + template(objs[3:4]),
    }
