"""``porter calibrate``: a recipe run with MagCache calibrating, its ratios written
(``porter.stepcache.calibration`` reads and resamples them)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from porter import api
from porter import recipe as recipe_mod
from porter.errors import RecipeError
from porter.generate.call import Call
from porter.rundir.outputs import output_dir
from porter.runtime import distributed, notices
from porter.stepcache import calibration

if TYPE_CHECKING:
    from porter.recipe import Recipe


def calibrate(recipe: Recipe, output: Path | None = None, progress: bool = True):
    """Run ``recipe``'s encode and denoise stages with MagCache calibrating (nothing
    skipped) and write the ratios to ``output`` (default: output.dir/mag_ratios.json).
    Returns (the file, the run's cache summary)."""
    data = recipe.resolved()
    data["cache"] = {"method": "magcache", "calibrate": True}
    calibrating = recipe_mod.validate_data(data, dict(recipe._locations), recipe.path)
    path = Path(output) if output is not None else output_dir(recipe) / "mag_ratios.json"
    with api.load(calibrating, progress=progress) as port:
        outcome = port.run(Call(calibrating, ("encode", "denoise"), progress=progress,
                                say=notices.status if progress else notices.quiet))
    summary = outcome.timings["cache"]
    idle = [name for name, contexts in summary["ratios"].items() if not contexts]
    if idle:
        raise RecipeError([recipe.problem(
            "generate.steps", f"{', '.join(idle)} ran no step of {recipe.generate.steps}: "
            "nothing to calibrate it with", hint="calibrate with more steps (the ratios "
            "are resampled to any step count)")])
    if distributed.writes():
        calibration.write(path, summary["ratios"], recipe, recipe.generate.steps)
    return path, summary
