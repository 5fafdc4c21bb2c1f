"""Wan image conditioning: what ``WanImageToVideoPipeline`` makes of the given frames.

Three layouts, mirroring ``encode_image`` and ``prepare_latents`` step by step
with the image encoder and the VAE running through torchax:

- Wan 2.1 I2V / FLF2V and Wan 2.2 I2V-A14B: a 4-channel mask and the VAE
  latents of [first frame, zeros..., (last frame)] concatenated to the noise;
  Wan 2.1 adds the CLIP tokens of the frame(s).
- Wan 2.2 TI2V-5B: the first frame's latents replace the first latent frame
  at every step, whose timestep is 0 (``expand_timesteps``).
"""

from __future__ import annotations

from porter.recipe.inputs import load_image
from porter.shims import lazy
from porter.shims.interop import to_host

torch = lazy.module("torch", __name__)


def conditioning(pipe, recipe, layout, grid) -> dict:
    """The image conditioning tensors for the recipe's frame(s), by layout; ``grid``:
    the latents' frames, height and width."""
    gen = recipe.generate
    first = load_image(recipe.file_path("generate.image", gen.image))
    last = (load_image(recipe.file_path("generate.last_image", gen.last_image))
            if gen.last_image is not None else None)
    found = {}
    if layout.image_dim is not None:
        found["image_embeds"] = image_embeds(pipe, first if last is None else [first, last])
    if layout.expand_timesteps:
        latents = _latents(pipe, _pixels(pipe, first, gen).unsqueeze(2))
        found["image_latents"] = latents.to("jax")
        found["frame_mask"] = frame_mask(grid).to("jax")
    else:
        found["condition"] = _concatenated(pipe, first, last, gen).to("jax")
    return found


def image_embeds(pipe, images):
    """CLIP penultimate hidden states of the image(s) (on the JAX device)."""
    pixels = pipe.image_processor(images=images, return_tensors="pt")["pixel_values"]
    out = pipe.image_encoder(pixel_values=pixels.to("jax"), output_hidden_states=True)
    return out.hidden_states[-2]


def _pixels(pipe, image, gen):
    return pipe.video_processor.preprocess(image, height=gen.height,
                                           width=gen.width).to(torch.float32)


def latent_stats(vae, dtype=None):
    """The VAE's per-channel latent mean and 1 / std in ``dtype``, shaped to broadcast
    (the reciprocal taken in ``dtype``, as the pipelines take it; float32 by default)."""
    dtype = dtype or torch.float32
    shape = (1, vae.config.z_dim, 1, 1, 1)
    return (torch.tensor(vae.config.latents_mean).view(shape).to(dtype),
            1.0 / torch.tensor(vae.config.latents_std).view(shape).to(dtype))


def _latents(pipe, video):
    """Normalized VAE latents (distribution mode) of a pixel video, float32 on the host."""
    vae = pipe.vae
    # the encoder's moments (mean, log-variance): the distribution's mode is the mean;
    # ``_encode`` is the compiled method (``encode`` wraps it in a distribution object)
    moments = vae._encode(video.to(vae.dtype).to("jax"))
    latent = to_host(moments[:, : vae.config.z_dim]).float()
    mean, inv_std = latent_stats(vae)
    return (latent - mean) * inv_std


def _concatenated(pipe, first, last, gen):
    """Mask (one channel per frame of a temporal group) + latents of the given frames
    with zeros between them: the channels the I2V transformer takes beside the noise."""
    start = _pixels(pipe, first, gen).unsqueeze(2)
    given = [start]
    middle = gen.frames - (1 if last is None else 2)
    given.append(start.new_zeros(1, 3, middle, gen.height, gen.width))
    if last is not None:
        given.append(_pixels(pipe, last, gen).unsqueeze(2))
    latent = _latents(pipe, torch.cat(given, dim=2))

    stride = pipe.vae_scale_factor_temporal
    frames, height, width = gen.frames, latent.shape[3], latent.shape[4]
    mask = torch.ones(1, 1, frames, height, width)
    mask[:, :, 1:frames - (0 if last is None else 1)] = 0  # only given frames are 1
    first_group = torch.repeat_interleave(mask[:, :, 0:1], dim=2, repeats=stride)
    mask = torch.concat([first_group, mask[:, :, 1:]], dim=2)
    mask = mask.view(1, -1, stride, height, width).transpose(1, 2)
    return torch.concat([mask, latent], dim=1)


def frame_mask(grid: tuple[int, int, int], first_given: bool = True):
    """1 where the model denoises, 0 on the first latent frame when it is given (TI2V).
    ``grid``: (frames, height, width) of the latents."""
    frames, height, width = grid
    mask = torch.ones(1, 1, frames, height, width)
    if first_given:
        mask[:, :, 0] = 0
    return mask
