"""Porter plugin for Wan video models (Wan 2.1 text-to-video)."""

from porter.hookspecs import hookimpl

from porter_wan.family import WanFamily


@hookimpl
def porter_register_families(register):
    register(WanFamily())
