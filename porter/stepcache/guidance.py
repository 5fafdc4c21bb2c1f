"""The guidance cache: leave out the unconditional branch on some steps.

Consecutive steps' guidance directions (conditional minus unconditional
prediction) change slowly in the middle of a schedule (FasterCache, arXiv
2410.19355, builds its CFG cache on this). Inside the window
``[start, end)`` of the schedule the unconditional branch is computed every
``interval``-th step; on the others it is taken as the conditional prediction
plus the difference (unconditional - conditional) of the last step that
computed both. A new expert (Wan 2.2) computes both at its first step. The
schedule is fixed before the loop: no decision depends on values.
"""

from __future__ import annotations


def schedule(chosen, total: int) -> list[bool]:
    """Per step (0-based): True where the unconditional branch is computed."""
    first, end = round(chosen.start * total), round(chosen.end * total)
    return [not (first <= i < end) or (i - first) % chosen.interval == 0
            for i in range(total)]


class GuidanceCache:
    def __init__(self, chosen, total: int, start: int = 0):
        self.plan = schedule(chosen, total)
        self.start = start  # a resumed run's first step (0-based)
        self.step = start  # the step the next prediction is for
        self.difference = None
        self.expert = None
        self.reused: list[int] = []  # 1-based steps that reused the difference
        self.steps: list[tuple] = []  # per step run: (expert, both branches computed)

    def computes_unconditional(self, expert) -> bool:
        """Whether this step computes the unconditional branch (called once a step)."""
        fresh = expert is not self.expert
        self.expert = expert
        both = (fresh or self.difference is None or self.step >= len(self.plan)
                or self.plan[self.step])
        self.steps.append((expert, both))
        return both

    def kept(self, cond, uncond):
        """After a step that computed both: remember their difference."""
        self.difference = uncond - cond
        self.step += 1
        return uncond

    def estimated(self, cond):
        """The unconditional prediction of a step that computed only ``cond``."""
        self.reused.append(self.step + 1)
        self.step += 1
        return cond + self.difference
