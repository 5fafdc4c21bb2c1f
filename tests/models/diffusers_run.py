"""Plain diffusers from a saved directory, in float32, with a recipe's generation
settings: ``diffusers_run.py FAMILY SOURCE OUT RECIPE [KEY=VALUE ...]``. Writes the
final latents (Wan: safetensors) or the frames (CogVideoX: .npy) to OUT. Wan: the
recipe's LoRA adapters (absolute paths) are loaded and fused by diffusers itself."""

import sys

import numpy as np
import torch


def main(family: str, source: str, out: str, recipe_file: str, *overrides: str) -> None:
    from porter import recipe

    loaded = recipe.load(recipe_file, list(overrides))
    gen = loaded.generate
    common = dict(prompt=gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                  width=gen.width, num_frames=gen.frames, num_inference_steps=gen.steps,
                  guidance_scale=gen.guidance_scale,
                  generator=torch.Generator().manual_seed(gen.seed))
    if family == "wan":
        from diffusers import WanPipeline
        from safetensors.torch import save_file

        pipe = WanPipeline.from_pretrained(source, torch_dtype=torch.float32)
        if loaded.lora:  # diffusers' own LoRA path: load, weigh, fuse
            names = [f"adapter{i}" for i in range(len(loaded.lora))]
            for name, adapter in zip(names, loaded.lora):
                pipe.load_lora_weights(adapter.file, adapter_name=name)
            pipe.set_adapters(names, [adapter.scale for adapter in loaded.lora])
            pipe.fuse_lora(adapter_names=names)
        latents = pipe(**common, max_sequence_length=gen.max_sequence_length,
                       output_type="latent").frames
        save_file({"latents": latents.float().contiguous()}, out)
    else:
        from diffusers import CogVideoXPipeline

        pipe = CogVideoXPipeline.from_pretrained(source, torch_dtype=torch.float32)
        frames = pipe(**common, max_sequence_length=gen.max_sequence_length,
                      output_type="np", **gen.extra).frames[0]
        np.save(out, (np.asarray(frames) * 255).round().clip(0, 255).astype("uint8"))


if __name__ == "__main__":
    main(*sys.argv[1:])
