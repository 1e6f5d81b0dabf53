"""Static checks of deploy/docker/Dockerfile (no Docker engine here): both targets exist, run
as the uid the manifests expect, and copy only files the build context lets in."""

from __future__ import annotations

import fnmatch
import re

from manifest_checks import REPO
from tideserve.k8s.render import RenderOptions

DOCKERFILE = (REPO / "deploy" / "docker" / "Dockerfile").read_text()


def stages() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in DOCKERFILE.splitlines():
        m = re.match(r"FROM \S+ AS (\S+)", line)
        if m:
            current = m.group(1)
            out[current] = []
        elif current and line and not line.startswith("#"):
            out[current].append(line)
    return out


def test_cpu_and_cuda_targets_run_as_the_manifests_uid():
    s = stages()
    uid = RenderOptions().run_as_user
    assert list(s)[-1] == "cpu"  # the default target
    for target in ("cpu", "cuda"):
        assert f"USER {uid}:{uid}" in s[target]
        assert any("pip install --no-deps /build" in line for line in s[target])
    assert any("torch==" in line for line in s["cuda-deps"])
    assert not any("torch" in line for line in s["base"] + s["cpu"])
    assert f"--uid {uid} --gid {uid}" in DOCKERFILE


def test_copied_files_exist_and_pass_the_dockerignore():
    patterns = [p for p in (REPO / ".dockerignore").read_text().splitlines() if p and not p.startswith("#")]

    def included(path: str) -> bool:
        keep = True
        for p in patterns:
            negate = p.startswith("!")
            pat = p.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
                keep = negate
        return keep

    for line in DOCKERFILE.splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (REPO / src).exists(), src
                assert included(src), src
    assert not included(".venv") and not included("tests/unit")
