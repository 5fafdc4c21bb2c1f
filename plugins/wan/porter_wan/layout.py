"""What distinguishes one Wan model from another, found without weights.

Every Wan model runs through the same two diffusers pipelines; what differs is
a handful of settings spread over ``model_index.json`` (``boundary_ratio``,
``expand_timesteps``), the transformer's configuration (input channels, CLIP
image width, image position embedding) and the VAE's (compression factors).
``Layout`` gathers them so checks, plans and the stages ask one object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from porter.families import Grid


@dataclass(frozen=True)
class Layout:
    #: two experts switch at boundary_ratio * num_train_timesteps (Wan 2.2 A14B)
    boundary_ratio: float | None = None
    #: per-token timesteps, the first frame kept clean (Wan 2.2 TI2V-5B)
    expand_timesteps: bool = False
    in_channels: int = 16
    out_channels: int = 16
    #: width of the CLIP image tokens (Wan 2.1 image-to-video); None: no CLIP
    image_dim: int | None = None
    #: image tokens with a position embedding: first-last-frame (FLF2V)
    pos_embed_seq_len: int | None = None
    spatial: int = 8  # VAE compression of height and width
    temporal: int = 4  # VAE compression of time
    patch: int = 2  # transformer patch, height and width

    @property
    def concatenates_condition(self) -> bool:
        """Image-to-video models that take noise + mask + image latents as channels."""
        return self.in_channels > self.out_channels

    @property
    def takes_image(self) -> bool:
        return self.concatenates_condition or self.expand_timesteps

    @property
    def needs_image(self) -> bool:
        return self.concatenates_condition

    @property
    def takes_last_image(self) -> bool:
        """Given as latents beside the noise; with CLIP only where the image position
        embedding covers two images (FLF2V): Wan 2.1 I2V's CLIP tokens take one."""
        return self.concatenates_condition and (self.image_dim is None
                                                or self.pos_embed_seq_len is not None)

    @property
    def needs_last_image(self) -> bool:
        """FLF2V's image position embedding covers the tokens of exactly two images."""
        return self.pos_embed_seq_len is not None

    @property
    def grid(self) -> Grid:
        """How this model divides a video (frames, latents, patches)."""
        return Grid(self.temporal, self.spatial, self.patch)

    @classmethod
    def from_configs(cls, pipeline: dict, transformer: dict, vae: dict) -> "Layout":
        return cls(
            boundary_ratio=pipeline.get("boundary_ratio"),
            expand_timesteps=bool(pipeline.get("expand_timesteps")),
            in_channels=transformer.get("in_channels", 16),
            out_channels=transformer.get("out_channels") or transformer.get("in_channels", 16),
            image_dim=transformer.get("image_dim"),
            pos_embed_seq_len=transformer.get("pos_embed_seq_len"),
            spatial=vae.get("scale_factor_spatial") or 8,
            temporal=vae.get("scale_factor_temporal") or 4,
            patch=list(transformer.get("patch_size", (1, 2, 2)))[1])

    @classmethod
    def of_pipe(cls, pipe) -> "Layout":
        model = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
        return cls.from_configs(dict(pipe.config), dict(model.config), dict(pipe.vae.config))

    @classmethod
    def of_directory(cls, root: Path) -> "Layout":
        """From a diffusers directory's configuration files (no weights read)."""
        def read(*parts):
            path = root.joinpath(*parts)
            return json.loads(path.read_text()) if path.is_file() else {}
        transformer = read("transformer", "config.json") or read("transformer_2", "config.json")
        return cls.from_configs(read("model_index.json"), transformer,
                                read("vae", "config.json"))

    @classmethod
    def of_official(cls, configs: dict, pipeline: dict) -> "Layout":
        return cls.from_configs(pipeline, configs["transformer"][2], configs["vae"][2])
