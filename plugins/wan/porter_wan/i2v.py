"""Wan 2.1 image-to-video: the image's CLIP embedding and the first-frame condition.

Mirrors ``diffusers.WanImageToVideoPipeline`` (encode_image, prepare_latents)
step by step, with the image encoder and the VAE running through torchax.
"""

from __future__ import annotations

import torch

from porter.errors import UsageError
from porter.interop import to_host


def load_image(path: str):
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(path).convert("RGB")
    except (OSError, UnidentifiedImageError) as exc:
        raise UsageError(f"generate.image: cannot read {path!r}: {exc}",
                         hint="give a PNG or JPEG file") from None


def image_embeds(pipe, image):
    """CLIP penultimate hidden states of the image (on the JAX device)."""
    pixels = pipe.image_processor(images=image, return_tensors="pt")["pixel_values"]
    out = pipe.image_encoder(pixel_values=pixels.to("jax"), output_hidden_states=True)
    return out.hidden_states[-2]


def first_frame_condition(pipe, image, recipe):
    """Mask (4 channels) + VAE latents of [image, zeros...]: the model's extra input."""
    gen = recipe.generate
    vae = pipe.vae
    pixels = pipe.video_processor.preprocess(image, height=gen.height, width=gen.width)
    pixels = pixels.to(torch.float32).unsqueeze(2)
    video = torch.cat([pixels, pixels.new_zeros(1, 3, gen.frames - 1, gen.height, gen.width)],
                      dim=2)
    latent = to_host(vae.encode(video.to(vae.dtype).to("jax")).latent_dist.mode()).float()
    z_dim = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z_dim, 1, 1, 1)
    latent = (latent - mean) * inv_std

    stride = pipe.vae_scale_factor_temporal
    frames, height, width = gen.frames, latent.shape[3], latent.shape[4]
    mask = torch.ones(1, 1, frames, height, width)
    mask[:, :, 1:] = 0  # only the first frame is given
    first = torch.repeat_interleave(mask[:, :, 0:1], dim=2, repeats=stride)
    mask = torch.concat([first, mask[:, :, 1:]], dim=2)
    mask = mask.view(1, -1, stride, height, width).transpose(1, 2)
    return torch.concat([mask, latent], dim=1)
