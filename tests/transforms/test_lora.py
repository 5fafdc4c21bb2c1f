"""LoRA adapters: fused on the host exactly as diffusers' load_lora_weights + fuse_lora
does, for tiny models built in code and for checkpoints read tensor by tensor; every
way an adapter can fail to fit the model is a recipe problem before any compute."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from porter import loading, registry as registry_mod, recipe
from porter.commands.run import run
from porter.commands.validate import validate
from porter.errors import RecipeError

from support.lora import make_lora

BASE = """\
model: {{family: wan, source: {source}{variant}}}
generate: {{prompt: "a cat", height: 32, width: 32, frames: 9, steps: {steps},
           max_sequence_length: 16}}
lora: {lora}
"""


def diffusers_latents(pipe, gen):
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            module.eval()
    return pipe(gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
                width=gen.width, num_frames=gen.frames, num_inference_steps=gen.steps,
                guidance_scale=gen.guidance_scale, max_sequence_length=gen.max_sequence_length,
                generator=torch.Generator().manual_seed(gen.seed), output_type="latent").frames


def load(write, tmp_path, lora, source="tiny", variant="t2v", steps=2):
    # a variant picks a tiny layout; a checkpoint's comes from its configuration
    variant = f", variant: {variant}" if source == "tiny" else ""
    path = write("r.yaml", BASE.format(source=source, variant=variant, steps=steps,
                                       lora=json.dumps(lora)))
    return recipe.load(path, [f"output.dir={tmp_path / 'out'}"])


@pytest.mark.slow
def test_one_adapter_matches_diffusers_fuse_lora(write, tmp_path):
    from porter_wan.tiny import build

    file = make_lora(tmp_path, bias=True)
    loaded = load(write, tmp_path, [{"file": file.name, "scale": 0.7}])
    assert validate(loaded, registry_mod.loaded()) == []
    result = run(loaded, registry_mod.loaded(), progress=False)

    pipe = build("t2v")
    pipe.load_lora_weights(str(file))
    pipe.fuse_lora(lora_scale=0.7)
    expected = diffusers_latents(pipe, loaded.generate)
    assert (result.latents - expected).abs().max() <= 1e-4
    # without the adapter the latents are far from these: the LoRA did something
    assert (diffusers_latents(build("t2v"), loaded.generate) - expected).abs().max() > 1e-2

    [entry] = json.loads((tmp_path / "out" / "run.json").read_text())["checkpoint"]["lora"]
    import hashlib
    assert entry["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
    assert entry["scale"] == 0.7 and entry["components"] == ["transformer"]
    assert entry["modules"] == 2 * 10  # 2 blocks x (2 attentions x 4 + FFN 2)


@pytest.mark.slow
def test_two_adapters_on_a_checkpoint_read_tensor_by_tensor(write, tmp_path):
    """A saved checkpoint: the transformer's tensors are read one by one and each gets
    its update as it is read; two adapters add up as set_adapters + fuse_lora does."""
    from porter_wan.tiny import build

    build("t2v").save_pretrained(tmp_path / "ckpt")
    first = make_lora(tmp_path, seed=1, name="a.safetensors")
    second = make_lora(tmp_path, seed=2, rank=2, alpha=2, name="b.safetensors")
    loaded = load(write, tmp_path, [{"file": "a.safetensors", "scale": 0.5},
                                    {"file": str(tmp_path), "weight_name": "b.safetensors",
                                     "scale": 1.5}], source=str(tmp_path / "ckpt"))
    ported = loading.load_for_port(registry_mod.loaded().family("wan"), loaded)
    assert "transformer" in ported.weights  # streamed, not loaded in place
    result = run(loaded, registry_mod.loaded(), progress=False)

    pipe = build("t2v")
    pipe.load_lora_weights(str(first), adapter_name="a")
    pipe.load_lora_weights(str(second), adapter_name="b")
    pipe.set_adapters(["a", "b"], [0.5, 1.5])
    pipe.fuse_lora(adapter_names=["a", "b"])
    assert (result.latents - diffusers_latents(pipe, loaded.generate)).abs().max() <= 1e-4


@pytest.mark.slow
def test_an_adapter_on_one_expert(write, tmp_path):
    """Wan 2.2 two experts, the LoRA on the low-noise expert only, as
    load_lora_weights(..., load_into_transformer_2=True) does it."""
    from porter_wan.tiny import build

    file = make_lora(tmp_path, variant="t2v-two-experts")
    loaded = load(write, tmp_path, [{"file": file.name, "components": ["transformer_2"]}],
                  variant="t2v-two-experts", steps=6)
    result = run(loaded, registry_mod.loaded(), progress=False)

    pipe = build("t2v-two-experts")
    pipe.load_lora_weights(str(file), load_into_transformer_2=True)
    pipe.fuse_lora(components=["transformer_2"])
    expected = diffusers_latents(pipe, loaded.generate)
    assert (result.latents - expected).abs().max() <= 1e-4
    plain = diffusers_latents(build("t2v-two-experts"), loaded.generate)
    assert (plain - expected).abs().max() > 1e-2


def test_community_format_is_converted_as_diffusers_converts_it(write, tmp_path):
    """Keys as the original Wan trainers write them (diffusion_model.*, lora_down/up,
    alpha): the fused weights equal diffusers' own load + fuse."""
    from porter_wan.tiny import build

    file = make_lora(tmp_path, rank=4, alpha=4)
    names = {"attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k",
             "attn1.to_v": "self_attn.v", "attn1.to_out.0": "self_attn.o",
             "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k",
             "attn2.to_v": "cross_attn.v", "attn2.to_out.0": "cross_attn.o",
             "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2"}
    community = {}
    for key, tensor in load_file(file).items():
        module, part = key.removeprefix("transformer.").split(".lora_")
        block, layer = module.split(".", 2)[1], module.split(".", 2)[2]
        base = f"diffusion_model.blocks.{block}.{names[layer]}"
        community[f"{base}.lora_{'down' if part.startswith('A') else 'up'}.weight"] = tensor
        community[f"{base}.alpha"] = torch.tensor(3.0)  # alpha 3, rank 4
    save_file(community, tmp_path / "community.safetensors")
    loaded = load(write, tmp_path, [{"file": "community.safetensors"}])
    ours = loading.load_untouched(registry_mod.loaded().family("wan"), loaded).transformer

    pipe = build("t2v")
    pipe.load_lora_weights(str(tmp_path / "community.safetensors"))
    pipe.fuse_lora()
    pipe.unload_lora_weights()  # fused weights stay; the PEFT wrappers go
    theirs = pipe.transformer.state_dict()
    plain = build("t2v").transformer.state_dict()
    changed = 0
    for name, tensor in ours.state_dict().items():
        assert torch.allclose(tensor, theirs[name], atol=1e-6), name
        changed += not torch.equal(tensor, plain[name])
    assert changed == 2 * 10  # every adapted weight of both blocks


def problems_of(write, tmp_path, lora, **kwargs):
    loaded = load(write, tmp_path, lora, **kwargs)
    return validate(loaded, registry_mod.loaded())


def test_a_missing_file_is_a_problem(write, tmp_path):
    [problem] = problems_of(write, tmp_path, [{"file": "nowhere.safetensors"}])
    assert problem.path == "lora.0.file" and "nowhere.safetensors" in problem.message


def test_a_folder_without_the_weight_name(write, tmp_path):
    make_lora(tmp_path, name="style.safetensors")
    [problem] = problems_of(write, tmp_path, [{"file": "."}])
    assert problem.path == "lora.0.weight_name"
    assert "style.safetensors" in problem.hint


def test_shapes_of_another_model_size(write, tmp_path):
    file = make_lora(tmp_path)
    state = load_file(file)
    key = "transformer.blocks.0.attn1.to_q.lora_A.weight"
    state[key] = torch.zeros(4, 48)  # the layer takes 24 features
    save_file(state, tmp_path / "wide.safetensors")
    problems = problems_of(write, tmp_path, [{"file": "wide.safetensors"}])
    assert [p.path for p in problems] == ["lora.0.file"]
    assert "wide.safetensors" in problems[0].message
    assert "blocks.0.attn1.to_q" in problems[0].message and "24" in problems[0].message
    assert problems[0].hint


def test_a_key_matching_no_module_names_the_closest(write, tmp_path):
    file = make_lora(tmp_path)
    state = {k.replace("blocks.1.attn1.to_q", "blocks.1.attn1.to_qq"): v
             for k, v in load_file(file).items()}
    save_file(state, tmp_path / "typo.safetensors")
    [problem] = problems_of(write, tmp_path, [{"file": "typo.safetensors"}])
    assert "blocks.1.attn1.to_qq" in problem.message and "matches no module" in problem.message
    assert "blocks.1.attn1.to_q" in problem.hint


def test_text_encoder_keys_and_unknown_components_are_refused(write, tmp_path):
    file = make_lora(tmp_path)
    state = load_file(file)
    state["text_encoder.encoder.block.0.layer.0.SelfAttention.q.lora_A.weight"] = torch.zeros(1)
    save_file(state, tmp_path / "te.safetensors")
    [problem] = problems_of(write, tmp_path, [{"file": "te.safetensors"}])
    assert "text_encoder" in problem.message and "not a transformer LoRA" in problem.message
    [problem] = problems_of(write, tmp_path, [{"file": file.name,
                                               "components": ["transformer_2"]}])
    assert problem.path == "lora.0.components" and "transformer_2" in problem.message


def test_a_run_stops_before_compute(write, tmp_path):
    loaded = load(write, tmp_path, [{"file": "nowhere.safetensors"}])
    with pytest.raises(RecipeError) as caught:
        run(loaded, registry_mod.loaded(), progress=False)
    assert caught.value.problems[0].path == "lora.0.file"
    assert not (tmp_path / "out" / "run.json").exists()


def test_inspect_shows_what_each_adapter_touches(write, tmp_path):
    from porter.commands import inspect as inspection

    file = make_lora(tmp_path, bias=True)
    loaded = load(write, tmp_path, [{"file": file.name}])
    result = inspection.build(loaded, registry_mod.loaded())
    touched = {row["pattern"] for row in result["transformer"] if row["lora"] == [0]}
    assert touched == {inspection.NUMBER.sub("*", f"blocks.0.{layer}.{kind}") for layer in
                       ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                        "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0",
                        "ffn.net.0.proj", "ffn.net.2") for kind in ("weight", "bias")}
    assert "lora 0" in inspection.render(result)
    assert not any(row["lora"] for row in result["vae"])


def porter_process(*args):
    """`porter ARGS` in a new process (the environment conftest set: 8 CPU devices)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "porter.cli", *args], capture_output=True,
                          text=True, timeout=600)


def test_an_adapter_with_no_tensors_is_refused(write, tmp_path):
    save_file({}, tmp_path / "empty.safetensors")
    [problem] = problems_of(write, tmp_path, [{"file": "empty.safetensors"}])
    assert problem.path == "lora.0.file"
    assert "empty.safetensors" in problem.message and "no tensors" in problem.message


def test_nan_in_an_adapter_is_refused_naming_the_adapter(write, tmp_path):
    file = make_lora(tmp_path)
    state = load_file(file)
    key = "transformer.blocks.0.attn1.to_q.lora_B.weight"
    state[key][0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    save_file(state, tmp_path / "nan.safetensors")
    [problem] = problems_of(write, tmp_path, [{"file": "nan.safetensors"}])
    assert problem.path == "lora.0.file" and "nan.safetensors" in problem.message
    assert f"{key} (3 of {state[key].numel()})" in problem.message
    assert "adapter" in problem.hint


@pytest.mark.parametrize("broken", ["empty", "nan"])
def test_porter_run_refuses_a_broken_adapter_naming_it(write, tmp_path, broken):
    """Through a real `porter run`: exit 2, the adapter's file named, no traceback, and
    nothing written (it was a no-op, or NaN blamed on the checkpoint's weights)."""
    state = {}
    if broken == "nan":
        state = load_file(make_lora(tmp_path))
        next(iter(state.values()))[0, 0] = float("nan")
    save_file(state, tmp_path / f"{broken}.safetensors")
    path = write("r.yaml", BASE.format(source="tiny", variant=", variant: t2v", steps=2, lora=json.dumps(
        [{"file": f"{broken}.safetensors"}])))
    done = porter_process("run", str(path), f"output.dir={tmp_path / 'out'}")
    assert done.returncode == 2, done.stderr
    assert f"{broken}.safetensors" in done.stderr and "lora.0.file" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "run.json").exists()


@pytest.mark.slow
def test_stages_made_with_another_adapter_are_refused(write, tmp_path, monkeypatch):
    """An adapter file replaced after a run saved its stages (or its progress, stopped
    mid-denoise): `--resume` and `--stage decode` refuse them, naming the file (real
    processes); the same file put back resumes to the uninterrupted latents, bit for
    bit, and run.json names its SHA-256."""
    import hashlib
    import signal

    from diffusers import FlowMatchEulerDiscreteScheduler

    from porter.errors import Interrupted, UsageError
    from porter.rundir import progress as saved_progress

    file = make_lora(tmp_path, seed=1)
    original = file.read_bytes()
    path = write("r.yaml", BASE.format(source="tiny", variant=", variant: t2v", steps=4, lora=json.dumps(
        [{"file": file.name, "scale": 0.8}])))
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    uninterrupted = run(recipe.load(path, [f"output.dir={whole}"]), registry_mod.loaded(),
                        progress=False)

    step, calls = FlowMatchEulerDiscreteScheduler.step, []

    def signalled(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGINT)  # step 2 finishes, is saved, the run stops
        return step(self, *args, **kwargs)

    loaded = recipe.load(path, [f"output.dir={stopped}"])
    monkeypatch.setattr(FlowMatchEulerDiscreteScheduler, "step", signalled)
    with pytest.raises(Interrupted):
        run(loaded, registry_mod.loaded(), progress=False)
    monkeypatch.setattr(FlowMatchEulerDiscreteScheduler, "step", step)
    kept = sorted(p.name for p in stopped.iterdir())
    assert "progress-000002.json" in kept

    make_lora(tmp_path, seed=2)  # other weights, same file
    assert file.read_bytes() != original
    for args in (["--resume", str(stopped)],
                 ["--stage", "decode", f"output.dir={whole}"]):
        done = porter_process("run", str(path), *args)
        assert done.returncode == 2, done.stderr
        assert "another LoRA adapter" in done.stderr and str(file) in done.stderr
        assert "Traceback" not in done.stderr
    assert "denoise.safetensors" in done.stderr  # the stage decode would have read
    with pytest.raises(UsageError, match=r"progress-000002\.safetensors \(denoising "
                       r"progress after step 2\) was made with another LoRA adapter"):
        saved_progress.load(stopped, loaded)
    assert sorted(p.name for p in stopped.iterdir()) == kept  # refused: nothing removed

    file.write_bytes(original)
    resumed = run(loaded, registry_mod.loaded(), progress=False, resume=True)
    assert resumed.data["timings"]["resumed_from_step"] == 2
    assert torch.equal(resumed.latents, uninterrupted.latents)
    [adapter] = json.loads(resumed.record.read_text())["checkpoint"]["lora"]
    assert adapter["sha256"] == hashlib.sha256(original).hexdigest()
