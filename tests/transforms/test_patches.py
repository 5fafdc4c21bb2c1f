"""Patches: reversible, validated against what is installed, reusable outside Porter."""

import pytest
import torch

from porter import registry as registry_mod, recipe
from porter.registry.hookspecs import hookimpl
from porter.port import checks
from porter.transforms.patches import Patch, PatchError

from support import TINY_RECIPE


class Base:
    def greet(self):
        return "base"


class Child(Base):
    @staticmethod
    def tool():
        return "tool"


def shout(original, suffix="!"):
    def greet(self):
        return original(self).upper() + suffix
    return greet


GREET = Patch(name="test.greet", target=f"{__name__}:Child.greet", doc="shout",
              replacement=shout, params={"suffix": "!"})


def test_applied_and_restored():
    with GREET.applied(suffix="?"):
        assert Child().greet() == "BASE?"
    assert Child().greet() == "base"
    assert "greet" not in vars(Child)  # it was inherited: nothing left behind


def test_restored_after_an_exception():
    with pytest.raises(RuntimeError):
        with GREET.applied():
            assert Child().greet() == "BASE!"
            raise RuntimeError("inside")
    assert Child().greet() == "base"


def test_descriptors_survive():
    tool = Patch(name="test.tool", target=f"{__name__}:Child.tool", doc="",
                 replacement=lambda original: staticmethod(lambda: "patched"))
    with tool.applied():
        assert Child.tool() == "patched"
    assert Child.tool() == "tool" and isinstance(vars(Child)["tool"], staticmethod)


def test_missing_target_and_unknown_param():
    gone = Patch(name="test.gone", target="diffusers:NoSuchPipeline.forward", doc="",
                 replacement=shout, fits="diffusers>=99")
    with pytest.raises(PatchError, match="does not exist in the installed library"):
        gone.locate()
    with pytest.raises(PatchError, match="unknown parameter"):
        with GREET.applied(volume=11):
            pass


class ExtraPatches:
    """A plugin object registering one broken and one working patch."""

    @hookimpl
    def porter_register_patches(self, register):
        register(Patch(name="test.gone", target="diffusers:NoSuchPipeline.forward",
                       doc="", replacement=shout, fits="diffusers>=99"))
        register(GREET)


def test_recipe_patch_problems(write):
    registry = registry_mod.load(extra_plugins=[ExtraPatches()])
    path = write("r.yaml", TINY_RECIPE + """\
patches:
  - test.gone
  - core.report_compilng
  - {name: test.greet, params: {volume: 3}}
  - {name: test.greet, params: {suffix: "?"}}
""")
    found = {p.path: p for p in checks.recipe_problems(recipe.load(path), registry)}
    assert set(found) == {"patches.0", "patches.1", "patches.2"}
    assert "does not exist in the installed library" in found["patches.0"].message
    assert "diffusers>=99" in found["patches.0"].hint
    assert found["patches.1"].hint == "did you mean 'core.report_compiling'?"
    assert "volume" in found["patches.2"].message and found["patches.2"].line == 12


def test_builtin_patches_work():
    registry = registry_mod.loaded()
    with registry.patches["core.report_compiling"].applied():
        assert torch.compiler.is_compiling() is True
    assert torch.compiler.is_compiling() is False
    with registry.patches["core.no_torch_assert"].applied():
        torch._assert(False, "ignored while patched")
    with pytest.raises(AssertionError):
        torch._assert(False, "raised again")


def test_wan_patch_reusable_in_a_plain_pipeline():
    """Another project: import the patch, use it on its own model in a with block."""
    from porter_wan.patches import ROPE_CACHE
    from porter_wan.tiny import build_pipeline

    rope = build_pipeline().transformer.rope
    x = torch.zeros(1, 16, 3, 4, 4)
    expected = rope(x)
    with ROPE_CACHE.applied():
        got = rope(x)  # nothing cached: falls back to the original computation
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_install_bounds_agree_with_what_the_patches_fit():
    """pyproject.toml admits only versions every patch fits (an upper bound on each
    patched library), and what is installed (constraints.txt) is inside both."""
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement

    from porter import registry as registry_mod

    from support import ROOT

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {Requirement(d).name: Requirement(d).specifier for d in project["dependencies"]}
    pinned = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text()
                  .splitlines() if "==" in line and not line.startswith("#"))
    patches = registry_mod.loaded().patches.values()
    assert all(p.fits for p in patches)
    for patch in patches:
        wanted = Requirement(patch.fits)
        declared_spec = declared[wanted.name]
        uppers = [s for s in declared_spec if s.operator == "<"]
        assert uppers, f"{wanted.name} is patched ({patch.name}) but has no upper bound"
        for spec in uppers:  # no declared version beyond what the patch fits
            fit_upper = [s for s in wanted.specifier if s.operator == "<"]
            assert fit_upper and fit_upper[0].version == spec.version, (patch.name, spec)
        assert wanted.specifier.contains(version(wanted.name), prereleases=True)
        assert declared_spec.contains(pinned[wanted.name], prereleases=True)
        assert patch.installed_fits()[2] is True
