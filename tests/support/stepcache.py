"""A step cache held to diffusers' own hooks: the tiny recipe, the same configuration run
by plain diffusers, and Porter's run of it."""

import torch

import porter

STEPS = 12


SETTINGS = ("generate.steps=12", "generate.negative_prompt=blurry", "generate.seed=3")


def load(recipe_path, *overrides):
    return porter.load(recipe_path, *SETTINGS, *overrides)


def two_experts(tmp_path, generate: str, extra: str = ""):
    """A recipe for the tiny Wan 2.2 two-expert layout; ``generate``: more settings."""
    path = tmp_path / "two.yaml"
    path.write_text("model: {family: wan, source: tiny, variant: t2v-two-experts}\n"
                    "generate: {prompt: 'a cat', height: 32, width: 32, frames: 9, "
                    f"max_sequence_length: 16, {generate}}}\n{extra}")
    return path


def diffusers_run(recipe, config=None, calibrate_into=None, experts: int = 1):
    """Latents and skipped steps per branch of plain diffusers' WanPipeline with
    ``config`` (a diffusers cache config, or one per transformer) enabled."""
    from porter_wan.tiny import build_pipeline

    gen = recipe.generate
    pipe = build_pipeline(experts=experts)
    models = [pipe.transformer] + ([pipe.transformer_2] if experts == 2 else [])
    for module in (*models, pipe.vae, pipe.text_encoder):
        module.eval()
    calls, ran = [], []
    configs = config if isinstance(config, list) else [config] * len(models)
    for model, each in zip(models, configs):
        model.register_forward_pre_hook(lambda *_: calls.append(len(calls)))
        # the last block's feed-forward runs only when the block is computed
        model.blocks[-1].ffn.register_forward_hook(lambda *_: ran.append(calls[-1]))
        if each is not None:
            model.enable_cache(each)
    if calibrate_into is not None:
        tail = pipe.transformer.blocks[-1]._diffusers_hook.get_hook("mag_cache_block_hook")
        original = tail._perform_calibration_step

        def recorded(state, residual):
            original(state, residual)
            name = tail.state_manager._context.name
            calibrate_into.setdefault(name, []).append(state.calibration_ratios[-1])
        tail._perform_calibration_step = recorded
    latents = pipe(gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                   width=gen.width, num_frames=gen.frames, num_inference_steps=gen.steps,
                   guidance_scale=gen.guidance_scale,
                   max_sequence_length=gen.max_sequence_length,
                   generator=torch.Generator().manual_seed(gen.seed),
                   output_type="latent").frames
    skipped: dict = {}
    for call in sorted(set(calls) - set(ran)):  # WanPipeline: cond, uncond per step
        skipped.setdefault(("cond", "uncond")[call % 2], []).append(call // 2 + 1)
    return latents, skipped


def porter_run(recipe_path, *overrides):
    with load(recipe_path, *overrides) as port:
        made = port.generate()
    return made.latents, made.record["timings"]["cache"], port


def same_as_diffusers(recipe_path, overrides, config):
    latents, summary, port = porter_run(recipe_path, *overrides)
    reference, skipped = diffusers_run(port.recipe, config)
    assert summary["skipped_steps"] == skipped
    assert summary["skipped_calls"] > 0, "the configuration should skip something"
    assert (latents - reference).abs().max() < 1e-4
    return summary
