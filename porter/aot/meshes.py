"""The meshes ``porter compile --choose-mesh`` compiles a recipe with, to find the one
with the lowest step bound that fits a target: every way to spread the target's
chips over the guidance batch (``dp``) and one of the splits of a transformer
call Porter has, each compiled by the target's compiler, not estimated.

The splits: tensor parallel (``tp``: heads and feed-forward columns), the tokens
over ``sp`` (Ulysses: heads exchanged for tokens around attention), over ``ring``
(ring attention), and both (2-D: ``ring`` x ``sp``). Mixes of ``tp`` with the token
axes are left out (a recipe may still name one). A recipe's weight rules stay as it
wrote them: a rule over an axis a candidate does not have keeps that weight whole on
each chip, which the compile's memory shows.
"""

from __future__ import annotations

import math

from porter.aot import targets
from porter.errors import UsageError

#: the mesh axes a candidate sets, outermost first (JAX lays inner axes on neighbouring
#: chips: the heads' all-to-alls and tp's all-reduces inside, the ring's hops outside)
AXES = ("dp", "ring", "sp", "tp")


def divisors(count: int) -> list[int]:
    return [d for d in range(1, count + 1) if count % d == 0]


def candidates(chips: int, guidance_batch: int) -> list[dict[str, int]]:
    """Meshes of ``chips`` devices: ``dp`` a divisor of the guidance batch (the passes
    a step batches), the rest of the chips over one split of the call. In a fixed
    order (data parallel first, then tp, sp, ring, 2-D), so that a tie goes to the
    first."""
    found = []
    for dp in divisors(math.gcd(guidance_batch, chips))[::-1]:
        rest = chips // dp
        splits = [{"tp": rest}, {"sp": rest}, {"ring": rest}] if rest > 1 else [{}]
        splits += [{"ring": ring, "sp": rest // ring} for ring in divisors(rest)
                   if 1 < ring < rest]
        for split in splits:
            mesh = {axis: 1 for axis in AXES}
            found.append({**mesh, "dp": dp, **split})
    return found


def shown(mesh: dict[str, int]) -> str:
    """``dp=2 x sp=8``: the axes over more than one chip."""
    return " x ".join(f"{axis}={size}" for axis, size in mesh.items() if size > 1) or \
        "one chip"


def override(mesh: dict[str, int]) -> list[str]:
    """The recipe overrides that compile ``mesh``: the mesh, and attention's heads over
    ``tp`` where tp splits them (beside token axes the heads are attention's own
    business: they go over sp)."""
    axes = ", ".join(f"{axis}: {size}" for axis, size in mesh.items())
    head_axis = "tp" if mesh.get("tp", 1) > 1 else "null"
    return [f"mesh={{{axes}}}", f"attention.head_axis={head_axis}"]


#: what validate says of a weight no rule splits over a candidate's axes: a warning
#: against a recipe's slip, not a reason a mesh cannot run (its memory is compiled)
REPLICATED = "large tensors are replicated on every device"
#: the override that lets a run keep such weights whole on every chip
KEEP_REPLICATED = "sharding.report_replicated_mb=1000000"


def fits_torus(target, mesh: dict[str, int]) -> str | None:
    """Why ``mesh`` cannot be laid on the target's torus (None: it can)."""
    try:
        targets.mesh(target, {axis: size for axis, size in mesh.items() if size > 1}
                     or {"dp": 1})
    except UsageError as exc:
        return exc.message
    return None
