"""Kubernetes mode: pure renderers (spec -> manifests), the CRD, and the operator's adapters.

Renderers here are pure functions; only ``apply.py`` imports the Kubernetes client and only
``operator.py`` imports kopf (DESIGN.md, rule 2).
"""
