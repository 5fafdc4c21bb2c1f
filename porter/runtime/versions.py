"""What this process runs on: the libraries' versions and Porter's own revision
(recorded with every run; part of every stored trace's key)."""

from __future__ import annotations

import functools
import json
import platform
from importlib import metadata
from pathlib import Path

#: what a traced program depends on (a stored trace's key names them)
PACKAGES = ("porter", "torch", "torchax", "jax", "jaxlib", "diffusers", "transformers")
#: and what a run's files depend on besides (run.json names them too): arrays, weight
#: files, the mp4 (PyAV)
RECORDED = PACKAGES + ("numpy", "safetensors", "av")


def versions(packages: tuple = PACKAGES) -> dict[str, str | None]:
    found = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


@functools.cache
def cpu_model() -> str | None:
    """The host CPU's model name (Linux's /proc/cpuinfo; else what Python knows, at
    least the architecture):
    host work (loading, the VAE on CPU, a CPU run's every step) depends on it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    # ARM servers' cpuinfo names no model: at least the architecture
    return platform.processor() or platform.machine() or None


def source_revision() -> dict | None:
    """Porter's source revision: the git commit of a checkout (and whether files
    differ from it), or the commit pip recorded for an install from git; None when
    neither is known (an install from a wheel names its version only)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]  # porter/runtime/versions.py -> checkout
    if (root / ".git").exists():
        try:
            run = functools.partial(subprocess.run, cwd=root, capture_output=True,
                                    text=True, timeout=10, check=True)
            commit = run(["git", "rev-parse", "HEAD"]).stdout.strip()
            changed = run(["git", "status", "--porcelain", "--untracked-files=no"]).stdout
            return {"commit": commit, "modified": bool(changed.strip())}
        except (OSError, subprocess.SubprocessError):
            return None
    try:
        direct = json.loads(metadata.distribution("porter").read_text("direct_url.json")
                            or "null")
    except (metadata.PackageNotFoundError, ValueError):
        return None
    commit = ((direct or {}).get("vcs_info") or {}).get("commit_id")
    return {"commit": commit, "modified": None} if commit else None
