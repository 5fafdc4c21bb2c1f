"""The meshes ``porter compile --choose-mesh`` tries, and the choice as a user gets it:
every candidate compiled (or why not), the lowest step bound that fits chosen, and
its overrides a recipe validates with."""

import json

import pytest

from porter.aot import meshes

from support import RECIPES
from support.aot import needs_libtpu
from support.processes import user_porter


def test_candidates_spread_the_chips_over_the_guidance_batch_and_one_split():
    found = [meshes.shown(mesh) for mesh in meshes.candidates(8, guidance_batch=2)]
    assert found == ["dp=2 x tp=4", "dp=2 x sp=4", "dp=2 x ring=4", "dp=2 x ring=2 x sp=2",
                     "tp=8", "sp=8", "ring=8", "ring=2 x sp=4", "ring=4 x sp=2"]
    assert [meshes.shown(m) for m in meshes.candidates(2, guidance_batch=1)] == \
        ["tp=2", "sp=2", "ring=2"]
    assert meshes.shown(meshes.candidates(1, guidance_batch=2)[0]) == "one chip"
    every = meshes.candidates(16, guidance_batch=2)
    assert all(list(mesh) == list(meshes.AXES) for mesh in every)
    assert {mesh["dp"] * mesh["tp"] * mesh["sp"] * mesh["ring"] for mesh in every} == {16}
    assert meshes.override({"dp": 2, "ring": 1, "sp": 8, "tp": 1}) == [
        "mesh={dp: 2, ring: 1, sp: 8, tp: 1}", "attention.head_axis=null"]
    assert meshes.override({"dp": 1, "ring": 1, "sp": 1, "tp": 8})[1] == \
        "attention.head_axis=tp"


@pytest.mark.slow
@needs_libtpu
def test_the_lowest_step_bound_that_fits_is_chosen_and_runs(tmp_path):
    """The tiny Wan on a v5p-32 (16 chips, a 2x4x2 torus): eleven meshes, one that
    would cut the torus's 4 in two, the others compiled; the chosen one has the lowest
    step bound, and its overrides validate."""
    recipe = RECIPES / "wan-tiny-sp.yaml"
    out = user_porter("compile", recipe, "--target", "v5p-32", "--choose-mesh",
                      "--program", "transformer.forward", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    choice = json.loads(out.stdout)
    rows = {row["shown"]: row for row in choice["candidates"]}
    assert len(rows) == 11 and "[11/11] mesh ring=8 x sp=2" in out.stderr
    assert rows["dp=2 x ring=2 x sp=4"]["status"] == "not on the torus"
    assert "does not fit v5p-32's torus (2x4x2)" in rows["dp=2 x ring=2 x sp=4"]["reason"]
    compiled = [row for row in rows.values() if row["status"] == "compiled"]
    assert len(compiled) == 10 and all(row["fits"] for row in compiled)
    best = min(row["step_bound_s"] for row in compiled)
    chosen = choice["chosen"]
    assert chosen["step_bound_s"] <= best * 1.005
    assert rows[meshes.shown(chosen["mesh"])]["step_bound_s"] == chosen["step_bound_s"]
    checked = user_porter("validate", recipe, *chosen["overrides"], "--devices", "16")
    assert checked.returncode == 0, checked.stderr



@pytest.mark.slow
@needs_libtpu
def test_a_mesh_that_keeps_weights_whole_is_compiled_and_said():
    """The tiny Wan's rules split weights over tp; with validate's report of replicated
    weights at 0 MB, every mesh keeps some whole (tp-less ones all of the rules'):
    each is still compiled, said so, and the chosen one's overrides let validate
    pass."""
    import re

    recipe = RECIPES / "wan-tiny-tp.yaml"
    text = user_porter("compile", recipe, "sharding.report_replicated_mb=0", "--target",
                       "v5e-4", "--choose-mesh", "--program", "transformer.forward")
    assert text.returncode == 0, text.stderr[-3000:]
    lines = text.stdout.splitlines()
    assert lines[0].startswith("wan-tiny-tp on v5e-4 (4 x TPU v5 lite")
    assert sum("keeps weights whole the rules split" in line for line in lines) == 7
    chosen = lines[-1]
    assert chosen.startswith("chosen: ") and meshes.KEEP_REPLICATED in chosen
    overrides = re.findall(r"'([^']+)'", chosen.split("run it with", 1)[1])
    checked = user_porter("validate", recipe, "sharding.report_replicated_mb=0",
                          *overrides, "--devices", "4")
    assert checked.returncode == 0, checked.stderr


def test_the_choice_is_the_lowest_step_bound_that_fits_and_needs_one(monkeypatch):
    """``porter.commands.compile.choose_mesh``'s ranking, over made-up compiles: a
    mesh that does not fit or failed never wins; bounds within half a percent go to
    the lower interconnect; without any step bound (the transformer not compiled) it
    refuses instead of saying no mesh fits."""
    from porter import recipe as recipe_mod, registry as registry_mod
    from porter.commands import compile as compile_cmd
    from porter.errors import UsageError

    figures = {"dp=2 x tp=4": (1.00, 0.30, True), "dp=2 x sp=4": (1.004, 0.10, True),
               "dp=2 x ring=4": (0.90, 0.10, False), "tp=8": (None, None, None)}

    def candidate(load, registry, target, mesh, only):
        shown = meshes.shown(mesh)
        bound, ici, fits = figures.get(shown, (2.0, 0.5, True))
        if fits is None:
            return {"mesh": mesh, "shown": shown, "status": "failed", "reason": "x"}
        return {"mesh": mesh, "shown": shown, "overrides": meshes.override(mesh),
                "status": "compiled", "fits": fits, "step_bound_s": bound,
                "interconnect_s": ici, "limited_by": "compute",
                "peak_bytes_per_chip": 1 << 30}
    monkeypatch.setattr(compile_cmd, "_candidate", candidate)
    load = lambda extra: recipe_mod.load(RECIPES / "wan-tiny-sp.yaml", extra)  # noqa: E731
    choice = compile_cmd.choose_mesh(load, registry_mod.loaded(), "v5e-8")
    assert meshes.shown(choice["chosen"]["mesh"]) == "dp=2 x sp=4"
    assert "DOES NOT FIT" in compile_cmd.render_choice(choice)

    figures.clear()
    figures.update({shown: (None, None, True) for shown in
                    [meshes.shown(m) for m in meshes.candidates(8, 2)]})
    with pytest.raises(UsageError) as refused:
        compile_cmd.choose_mesh(load, registry_mod.loaded(), "v5e-8")
    assert "no program compiled here gives one" in refused.value.message
    assert "--program transformer.forward" in refused.value.hint
