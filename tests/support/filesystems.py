"""Small filesystems (a tmpfs in a user and mount namespace): full and read-only disks, as
the machine gives them."""

import os
import subprocess
import sys

import pytest


def _unshare_available() -> bool:
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return probe.returncode == 0


needs_namespaces = pytest.mark.skipif(not _unshare_available(),
                                      reason="needs unshare -rm (user and mount namespaces)")


def in_small_filesystem(tmp_path, command: str, options: str):
    """Run ``command`` (a shell line) with a fresh tmpfs mounted at tmp_path/mnt."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    script = f"mount -t tmpfs -o {options} tmpfs {mount} && {command}"
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True,
                          text=True, timeout=600, env=os.environ)


PORTER = f"{sys.executable} -m porter.cli"
