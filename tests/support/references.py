"""What plain PyTorch and diffusers compute, to hold Porter's results to."""

import torch


def diffusers_latents(recipe):
    """Final latents of the plain diffusers WanPipeline (tiny weights) for a recipe."""
    import torch

    from porter_wan.tiny import build_pipeline

    gen = recipe.generate
    pipe = build_pipeline()
    for module in (pipe.transformer, pipe.vae, pipe.text_encoder):
        module.eval()
    return pipe(gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                width=gen.width, num_frames=gen.frames, num_inference_steps=gen.steps,
                guidance_scale=gen.guidance_scale, max_sequence_length=gen.max_sequence_length,
                generator=torch.Generator().manual_seed(gen.seed), output_type="latent").frames


def lowered_text(module, runtime, **inputs) -> str:
    """StableHLO of a compiled (torchax) module's forward for these keyword inputs."""
    import functools

    import jax

    from porter.shims.compat import import_torchax

    interop = import_torchax().interop
    with runtime.env:
        fn = interop.jax_view(functools.partial(module.functional_call, "forward"))
        return jax.jit(fn, static_argnames=("return_dict",)).lower(
            interop.jax_view(module.params), interop.jax_view(module.buffers),
            return_dict=False, **interop.jax_view(inputs)).as_text()


class Positions(torch.nn.Module):
    """A module adding its input to positions a caller made on the host (a pipeline's
    ``torch.arange(n)``): what crosses into a compiled program with no device."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x, positions):
        return x + self.scale * positions
