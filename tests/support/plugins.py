"""A plugin package outside the repository, installed the way pip installs one."""

import textwrap


def make_dist(root, package: str, code: str):
    """An installed-looking distribution: a package plus dist-info with an entry point."""
    (root / package).mkdir()
    (root / package / "__init__.py").write_text(textwrap.dedent(code))
    info = root / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[porter]\n{package} = {package}\n")


EXTERNAL = """
from porter import hookimpl
from porter_wan.family import WanFamily

class Toy(WanFamily):
    name = "toy"
    summary = "a family from outside the repository"

@hookimpl
def porter_register_families(register):
    register(Toy())
"""
