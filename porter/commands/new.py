"""`porter new`: a commented starter recipe with every section present."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from porter import recipe
from porter.errors import UsageError

if TYPE_CHECKING:
    from porter.families.base import ModelFamily

HEADER = """\
# porter run {path}
# Starter recipe for the {family} family, written by `porter new`. Adapt it with
# `porter inspect` (tensor names and shapes), `porter plan` (bytes per device),
# `porter validate` and `porter verify`; every section is described in
# docs/recipes.md.
"""

SECTIONS = """\
runtime: {{platform: auto, cpu_devices: null, compile_cache: true}}
mesh: {{dp: auto}}                # named axes; e.g. {{dp: 2, tp: 4}}

generate:
{generate}
patches: [{patches}]   # names from `porter patches`
setup: {{}}                       # e.g. {{vae: [enable_tiling]}} (diffusers' own set-up methods)
scheduler: {{}}                 # e.g. {{name: UniPCMultistepScheduler, config: {{flow_shift: 5}}}}
lora: []                        # e.g. [{{file: loras/style.safetensors, scale: 0.8}}]
rotary: {{precompute: {rotary}}}   # {rotary_note}

dtypes:
  components: {{}}                # e.g. {{vae: float32}}
  overrides: {{}}                 # e.g. transformer: [{{match: 'time_embedder\\..*', dtype: float32}}]

quantize: {{format: null}}        # 8-bit: fp8, int8, fp8-weights, int8-weights or auto

sharding:
  weights: {{}}                   # e.g. transformer: [{{match: 'blocks\\.\\d+\\.attn1\\.to_q\\.weight', spec: [tp, null]}}]
  inputs: {{}}                    # e.g. hidden_states: [dp, null, null, null, null]

attention: {{backend: null}}      # null keeps torchax's lowering; or auto, blockwise, splash, ...
compile: {{}}                     # e.g. transformer: {{methods: [forward], static_argnames: [return_dict]}}
cache: {{}}                       # step caching, e.g. {{method: first_block, threshold: 0.05}}
verify: {{}}                      # e.g. {{tolerance: 1.0e-5}}
output: {{fps: 16}}
serve: {{preview_every: 2}}       # porter serve: a job's live preview every N steps
"""

EXTENDING = """\
extends: {base}

# Everything above comes from the base; uncomment and change what differs:
# model: {{source: org/checkpoint-id, dtype: bfloat16}}
# mesh: {{dp: 2, tp: 4}}
# generate: {{prompt: "...", height: 480, width: 832, frames: 81, steps: 50}}
# patches: [...]                # replaces the base's list
# setup: / scheduler: / lora: / dtypes: / quantize: / sharding: / rotary: / attention: /
# compile: / cache: / verify: / output: / serve:
"""


def target(name: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        return path if path.suffix else path.with_suffix(".yaml")
    return Path("recipes") / f"{name}.yaml"


def text(path: Path, family: ModelFamily, base: str | None) -> str:
    head = HEADER.format(path=path, family=family.name)
    if base is not None:
        relative = os.path.relpath(Path(base).resolve(), path.parent.resolve())
        return head + EXTENDING.format(base=relative)
    model = family.starter_model
    generate = "".join(f"  {key}: {value!r}\n".replace("'", '"')
                       for key, value in family.starter_generate.items())
    lines = [f"model:\n  family: {family.name}\n"]
    lines += [f"  {key}: {value}\n" for key, value in model.items()]
    patches = ", ".join(family.starter_patches)
    rotary = "true" if family.rotary_patch else "false"
    note = "the rotary tables computed once per shape" if family.rotary_patch else \
        "true where the family has a rotary cache (this one has none)"
    return head + "".join(lines) + "\n" + SECTIONS.format(
        generate=generate, patches=patches, rotary=rotary, rotary_note=note)


def base_family(base: str) -> str:
    """The family the recipe ``base`` names (what it extends included; a missing file
    refused as any recipe's is, with the nearest name)."""
    return recipe.load(base).model.family


def write(name: str, family: ModelFamily, base: str | None = None,
          force: bool = False) -> Path:
    path = target(name)
    if base is not None and not Path(base).is_file():
        raise UsageError(f"--from {base}: no such recipe file")
    if path.exists() and not force:
        raise UsageError(f"{path} exists", hint="pick another name, or --force")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text(path, family, base))
    return path
