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


def wan_latents(loaded, **schedule):
    """Final latents of plain diffusers for a tiny Wan recipe: its layout, input images,
    scheduler (the recipe's class and settings, made with from_config), LoRA adapters
    (load_lora_weights into the experts each names, then fuse_lora) and seed. A
    ``schedule`` (``timesteps=`` or ``sigmas=``) goes to the scheduler's set_timesteps:
    the pipeline's call takes none."""
    import diffusers
    from PIL import Image

    from porter.transforms import lora
    from porter_wan.tiny import build

    gen = loaded.generate
    pipe = build(loaded.model.variant, image=gen.image is not None)
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            module.eval()
    section = loaded.scheduler
    cls = getattr(diffusers, section.name) if section.name else type(pipe.scheduler)
    pipe.scheduler = cls.from_config(pipe.scheduler.config, **section.config)
    if schedule:
        own = pipe.scheduler.set_timesteps
        pipe.scheduler.set_timesteps = lambda steps, device=None: own(device=device,
                                                                      **schedule)
    fused = set()
    for index, adapter in enumerate(loaded.lora):
        assert adapter.scale == 1.0  # one fuse_lora for every adapter
        for component in adapter.components:
            pipe.load_lora_weights(str(lora.locate(loaded, index)), adapter_name=f"a{index}"
                                   f"-{component}",
                                   load_into_transformer_2=component == "transformer_2")
            fused.add(component)
    if fused:
        pipe.fuse_lora(components=sorted(fused))
    extra = {}
    for key in ("image", "last_image"):
        value = getattr(gen, key)
        if value is not None:
            extra[key] = Image.open(loaded.file_path(f"generate.{key}", value)).convert("RGB")
    if gen.guidance_scale_2 is not None:
        extra["guidance_scale_2"] = gen.guidance_scale_2
    return pipe(prompt=gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                width=gen.width, num_frames=gen.frames, num_inference_steps=gen.steps,
                guidance_scale=gen.guidance_scale, max_sequence_length=gen.max_sequence_length,
                generator=torch.Generator().manual_seed(gen.seed), output_type="latent",
                **extra).frames


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
