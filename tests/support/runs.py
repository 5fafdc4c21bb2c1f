"""Tiny runs to damage and compare: a recipe writing into a folder, run in this process."""

import sys

from porter import recipe

RECIPE = """\
model: {{family: wan, source: {source}}}
generate: {{prompt: "a cat", height: 32, width: 32, frames: 9, steps: 2,
           max_sequence_length: 16}}
output: {{dir: {out}}}
"""


def tiny_recipe(tmp_path, out, source="tiny", *overrides):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(source=source, out=out))
    return recipe.load(path, list(overrides))


def final_latents(path, *overrides):
    """The final latents of ``path``'s run in this process, not decoded: where only the
    transformer's placement or attention differs, the VAE's decode adds time and
    nothing to compare."""
    import porter
    from porter.generate.call import Call

    with porter.load(path, *overrides) as port:
        return port.run(Call(port.settings(), ("encode", "denoise"))).latents


def relative(got, expected) -> float:
    """The largest difference of two tensors, as a fraction of ``expected``'s largest
    value."""
    return ((got - expected).abs().max() / expected.abs().max()).item()


def address_space_limited(gib: int) -> list[str]:
    """A command prefix running a program under `ulimit -v` (the shell sets it: a
    preexec_fn would run Python in a fork of this process's JAX threads)."""
    return ["sh", "-c", f'ulimit -v {gib << 20} && exec "$0" "$@"', sys.executable]
