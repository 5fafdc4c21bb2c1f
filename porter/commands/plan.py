"""`porter plan`: where every weight goes and what each device holds, from shapes alone
(``porter.port.estimates``), as text or JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING

from porter.errors import RecipeError
from porter.port import checks, estimates
from porter.runtime import mesh_text
from porter.transforms.sharding import human_bytes, human_flops

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.registry import Registry


def plan(recipe: Recipe, registry: Registry, devices: int | None = None,
         target=None) -> dict:
    """The recipe's plan for ``devices`` devices (or a TPU slice ``target``), after the
    checks of the recipe and its model's configuration that ``validate`` runs first."""
    problems = checks.input_problems(recipe, registry)
    if problems:
        raise RecipeError(problems)
    return estimates.build(recipe, registry, devices, target)


def to_json(plan: dict) -> dict:
    return {**plan, "problems": [p.render() for p in plan["problems"]]}


def render(plan: dict) -> str:
    mesh = mesh_text(plan["mesh"])
    lines = [f"plan for {plan['recipe']}: mesh {mesh} ({plan['devices']} devices)",
             "\npasses, in the order a run applies them (once; then around each call):"]
    width = max(len(row["pass"]) for row in plan["passes"])
    for row in plan["passes"]:
        lines.append(f"  {row['pass']:<{width}}  {row['detail'] if row['applies'] else '-'}")
        if row["applies"] and row["each_call"]:
            lines.append(f"  {'':<{width}}    around each call: {row['each_call']}")
    for comp in plan["components"]:
        lines.append(f"\n{comp['component']}: {comp['tensors']} tensors, "
                     f"{human_bytes(comp['bytes'])}; per device {human_bytes(comp['bytes_per_device'])} "
                     f"(sharded {human_bytes(comp['sharded_bytes_per_device'])}, replicated "
                     f"{human_bytes(comp['replicated_bytes_per_device'])})")
        for row in comp["rules"]:
            label = row["rule"] if row["rule"] is not None else "(unmatched: replicated)"
            spec = f" {row['spec']}" if row["rule"] is not None else ""
            lines.append(f"  {row['tensors']:5d} tensors {human_bytes(row['bytes']):>11} "
                         f"-> {human_bytes(row['bytes_per_device']):>11}/device  {label}{spec}")
    lines.append(f"\nweights per device: {human_bytes(plan['weights_bytes_per_device'])}")
    if plan.get("target"):
        t = plan["target"]
        share = plan["weights_bytes_per_device"] / t["usable_hbm_bytes"]
        lines.append(f"on {t['name']}: {share:.0%} of a chip's {human_bytes(t['usable_hbm_bytes'])}"
                     " usable HBM before any activation; `porter compile --target "
                     f"{t['name']}` compiles every program for the rest")
    est = plan.get("estimates")
    if est:
        lines.append(f"one denoising step: {est['tokens']} video tokens, "
                     f"{human_flops(est['flops_per_step'])} "
                     f"({human_flops(est['flops_per_step_per_device'])} per device)")
        for name, act in est["activations"].items():
            lines.append(f"  {name} activation per block and device: "
                         f"{human_bytes(act['bytes_per_device'])} (of "
                         f"{' x '.join(map(str, act['shape']))} in all)")
        for name, att in est["attention"].items():
            lines.append(f"  {name}-attention scores per layer and device (float32): "
                         f"reference {human_bytes(att['reference_bytes_per_device'])}, "
                         f"blockwise {human_bytes(att['blockwise_bytes_per_device'])}")
        if est.get("exchange"):
            sent = est["exchange"]
            per_step = sent["bytes_per_step_and_device"]
            lines.append(f"  self-attention, tokens split ({sent['kind']}): each device sends "
                         f"{human_bytes(sent['bytes_per_layer_and_device'])} a layer"
                         + (f", {human_bytes(per_step)} a step" if per_step else ""))
    if plan["problems"]:
        lines.append(f"\n{len(plan['problems'])} problems:")
        lines += ["  " + p.render() for p in plan["problems"]]
    return "\n".join(lines)
