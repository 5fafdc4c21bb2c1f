"""A port's step cache across runs: set up at porting, reset and aimed at each run,
summarised in each run's record."""

from __future__ import annotations

from porter.cache import hooks, settings
from porter.cache.guidance import GuidanceCache
from porter.errors import RecipeError


class Caching:
    """The cache of one port: ``tallies`` (component -> hooks.Tally) for block
    methods, a GuidanceCache per run for the guidance method."""

    def __init__(self, chosen, tallies: dict):
        self.chosen = chosen
        self.tallies = tallies
        self.calibrating = chosen.method == "magcache" and chosen.calibrate
        self.calibration: dict = {}
        self.steps: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.guidance: GuidanceCache | None = None

    @classmethod
    def attach(cls, chosen, modules: dict) -> "Caching":
        """Hooks on each cached component (``modules``: name -> module compiled in
        pieces)."""
        return cls(chosen, {name: hooks.install(module, chosen)
                            for name, module in modules.items()})

    def begin(self, pipe, family, recipe, start_step: int = 0) -> None:
        """Before a run: every state cold; MagCache aimed at this run's steps."""
        self.steps = family.transformer_steps(pipe, recipe)
        # a resumed run: the steps each transformer ran before ``start_step``
        self.done, before = {}, start_step
        for name, count in self.steps.items():
            self.done[name] = min(before, count)
            before -= self.done[name]
        for name, tally in self.tallies.items():
            module = _unwrapped(getattr(pipe, name))
            hooks.reset(module)
            if self.calibrating:
                tally.listeners.clear()
                self.calibration[name] = hooks.Calibration(tally)
            elif self.chosen.method == "magcache":
                hooks.retarget(tally, self._ratios(recipe, name), self.steps.get(name, 0),
                               self.done.get(name, 0))
        self.guidance = None
        if self.chosen.method == "guidance":
            self.guidance = GuidanceCache(settings(recipe), recipe.generate.steps, start_step)
        pipe._porter_guidance = self.guidance

    def _ratios(self, recipe, name: str) -> list[float]:
        from porter.cache import calibration, ratios_file

        given = settings(recipe).mag_ratios
        if isinstance(given, list):
            if len(self.tallies) > 1:
                raise RecipeError([recipe.problem(
                    "cache.mag_ratios", f"one list of ratios, {len(self.tallies)} "
                    "transformers", hint="`porter calibrate` writes a file with each "
                    "transformer's ratios")])
            return given
        ratios = calibration.read(ratios_file(recipe))["ratios"]
        if name not in ratios:
            raise RecipeError([recipe.problem(
                "cache.mag_ratios", f"{given}: no ratios for {name}",
                hint=f"it has {', '.join(ratios)}; calibrate this recipe's model again")])
        return calibration.curve(ratios[name])

    def summary(self, pipe) -> dict:
        """What the cache did in the last run, for the run record."""
        method = self.chosen.method
        if method == "guidance":
            return self._guidance_summary(pipe)
        computed = total = calls = 0
        skipped: dict = {}
        offset = 0
        for name, tally in self.tallies.items():
            per_context: dict[str, int] = {}
            first = offset + self.done.get(name, 0)  # the step before this one's first call
            for context, ran in tally.calls:
                per_context[context] = per_context.get(context, 0) + 1
                calls += 1
                computed += ran
                total += tally.blocks_per_call
                if ran < tally.blocks_per_call:  # some block was skipped or predicted
                    skipped.setdefault(context, []).append(first + per_context[context])
            offset += self.steps.get(name, 0)
        found = {"method": method + (" (calibrating)" if self.calibrating else ""),
                 "calls": calls, "blocks_computed": computed,
                 "blocks_total": total,
                 "skipped_calls": sum(len(steps) for steps in skipped.values()),
                 "skipped_steps": skipped}
        if self.calibrating:
            found["ratios"] = self.calibrated()
        return found

    def _guidance_summary(self, pipe) -> dict:
        guidance = self.guidance
        blocks = sum(len(b) for b in _block_lists(pipe))
        calls = 2 * (len(guidance.plan) - guidance.start)  # two branches a step run
        reused = guidance.reused
        return {"method": "guidance", "calls": calls - len(reused),
                "blocks_computed": (calls - len(reused)) * blocks, "blocks_total": calls * blocks,
                "skipped_calls": len(reused), "skipped_steps": reused}

    def calibrated(self) -> dict:
        """Calibration runs: component -> context -> ratios."""
        return {name: dict(c.ratios) for name, c in self.calibration.items()}


def _unwrapped(module):
    return getattr(module, "module", module)  # through ShardedInputs


def _block_lists(pipe):
    from porter.cache import block_lists
    return [blocks for name in ("transformer", "transformer_2")
            if getattr(pipe, name, None) is not None
            for blocks in block_lists(_unwrapped(getattr(pipe, name)))]
