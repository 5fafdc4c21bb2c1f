"""AnyFlow FAR at fixed shapes (porter/families/far.py): the pipeline's video as the
model's own calls make it, and programs that do not grow with the video."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from models.anyflow_far import build_anyflow_far_pipeline
from support import WAN_TP2

from porter.families import far, width

TESTS = Path(__file__).resolve().parents[1]
# (chunks, frames): one latent frame a chunk; chunks of several frames, the first
# leaving the window before the last; the released checkpoints' own layout
LAYOUTS = (([1, 1, 1, 1, 1], 17), ([1, 2, 2, 1, 2], 29), ([1, 3, 3, 3, 3, 3, 3, 2], 81))
SIZES = (32, 48)  # one compressed token a frame (and 4 full), four (and 36 full)
# diffusers' own calls, in a process of their own: its flex attention is compiled by
# PyTorch, which fails in a process where a port has run (no "jax" device in PyTorch)
OWN = """
import sys
import torch
sys.path.insert(0, sys.argv[2])
from models.anyflow_far import build_anyflow_far_pipeline
pipe = build_anyflow_far_pipeline()
made = {}
for chunks, frames, size, kind in eval(sys.argv[3]):
    out = pipe("a cat", height=size, width=size, num_frames=frames, num_inference_steps=2,
               guidance_scale=6.0, max_sequence_length=16, chunk_partition=chunks,
               generator=torch.Generator().manual_seed(0), output_type=kind).frames
    made[str((chunks, size))] = torch.as_tensor(out[0] if kind == "np" else out)
torch.save(made, sys.argv[1])
"""


def _own(tmp_path, calls) -> dict:
    """diffusers' own outputs of ``calls`` ((chunks, frames, size, output type)), by
    str((chunks, size))."""
    out = tmp_path / "own.pt"
    subprocess.run([sys.executable, "-c", OWN, str(out), str(TESTS), repr(calls)],
                   check=True, capture_output=True)
    return torch.load(out)


@pytest.fixture(scope="module")
def pipe():
    return build_anyflow_far_pipeline()


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    return _own(tmp_path_factory.mktemp("far"), [(chunks, frames, size, "latent")
                                                 for chunks, frames in LAYOUTS
                                                 for size in SIZES])


def _latents(pipe, chunks, frames, size):
    return pipe("a cat", height=size, width=size, num_frames=frames, num_inference_steps=2,
                guidance_scale=6.0, max_sequence_length=16, chunk_partition=chunks,
                generator=torch.Generator().manual_seed(0), output_type="latent").frames


@pytest.mark.parametrize("chunks, frames", LAYOUTS)
def test_fixed_size_calls_make_the_models_own_latents(pipe, own, chunks, frames):
    """In plain PyTorch, the fixed-shape calls' latents are the model's own within
    float32 rounding."""
    for size in SIZES:
        expected = own[str((chunks, size))]
        with far.fixed_size(pipe, {"chunk_partition": chunks}):
            fixed = _latents(pipe, chunks, frames, size)
        assert (fixed - expected).abs().max() <= 1e-5 * expected.abs().max(), (chunks, size)
    assert "transformer" in vars(pipe) and not isinstance(pipe.transformer, far.FixedSize)


def test_what_the_fixed_shape_calls_do_not_take_is_refused(pipe, tmp_path):
    """A LoRA scale other than 1 is refused with a message; a scale of 1 runs. A recipe
    whose step cache skips blocks, or that compiles the transformer module by module,
    is refused before loading."""
    from porter import recipe as recipe_mod
    from porter.errors import UsageError
    from porter.families.generic import GenericFamily

    with far.fixed_size(pipe, {"chunk_partition": [1, 1, 1]}):
        _latents(pipe, [1, 1, 1], 9, 32)  # the pipeline passes attention_kwargs=None
        with pytest.raises(UsageError, match="attention_kwargs.scale"):
            pipe("a cat", height=32, width=32, num_frames=9, num_inference_steps=1,
                 chunk_partition=[1, 1, 1], attention_kwargs={"scale": 0.5},
                 output_type="latent")
    path = tmp_path / "r.yaml"
    path.write_text("model: {family: generic, source: nvidia/some-far,\n"
                    "        pipeline: AnyFlowFARPipeline}\n"
                    "generate: {prompt: a cat, height: 32, width: 32, frames: 9}\n"
                    "cache: {method: first_block}\n"
                    "compile: {transformer: {modules: 'blocks\\.\\d+'}}\n")
    found = GenericFamily().check(recipe_mod.load(path))
    assert {problem.path for problem in found} >= {"cache", "compile.transformer.modules"}


def test_the_layout_covers_the_longer_of_the_call_and_the_models_own(pipe):
    config = pipe.transformer.config  # its own layout: 1, 3 x 6, 2 (13 compressed frames)
    assert far.layout(config, [1, 1, 1], 4, 4) == far.Layout(
        full=4, compressed=1, keep=2, longest=3, context=13, grid=(4, 4))
    assert far.layout(config, [1] + [3] * 10, 6, 6).context == 22  # 1 + 3 x 7
    assert far.context_frames([1, 2], 3) == 0


def test_the_conditions_kept_by_frame_are_the_models_by_token(pipe):
    """The time embedding and its projection made once a frame and broadcast over the
    frame's tokens (the compressed frames' and the full ones' apart) equal the model's
    own, made for every token."""
    # (the sizes only say how many tokens a frame has: several of each kind)
    model, layout = pipe.transformer, far.Layout(full=9, compressed=4, keep=2, longest=3,
                                                 context=13, grid=(6, 6))
    torch.manual_seed(0)
    timestep, r_timestep = torch.rand(1, 5) * 1000, torch.rand(1, 5) * 1000
    text = torch.randn(1, 16, model.config.text_dim)
    with torch.no_grad():
        temb, projection, _, groups = far._conditions(model, timestep, r_timestep, text,
                                                      3, layout)
        cfg = {"num_full_frames": 3, "full_token_per_frame": 9,
               "compressed_token_per_frame": 4}
        own_temb, own_projection, _, _ = model.condition_embedder(
            timestep, r_timestep, text, None, far_cfg=cfg)
    assert groups == ((2, 4), (3, 9)) and projection.shape[1] == 5  # by frame
    for mine, own in ((temb, own_temb), (projection.flatten(2), own_projection)):
        tokens = torch.zeros(1, 2 * 4 + 3 * 9, mine.shape[-1])
        spread = far._by_frame(tokens, groups, lambda x, value: x + value, mine)
        assert torch.equal(spread, own)


def test_every_attention_call_masks_keys_alone(pipe, monkeypatch):
    """Each fixed-shape call's self-attention says which keys its queries see by keys
    alone, the same for every query, which splash runs on a TPU (a mask over queries
    and keys falls back to the blockwise kernel); a cache call's block-causal mask is
    kept by taking its chunks' queries apart. (Text keys take no mask.)"""
    masks, attend, inside = [], torch.nn.functional.scaled_dot_product_attention, []

    def recorded(query, key, value, attn_mask=None, **kwargs):
        if inside:  # (not the text encoder's)
            masks.append((inside[-1].__name__, key.shape[-2], attn_mask))
        return attend(query, key, value, attn_mask=attn_mask, **kwargs)

    def within(function):
        def call(*args, **kwargs):
            inside.append(function)
            try:
                return function(*args, **kwargs)
            finally:
                inside.pop()
        return call

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    for name in ("step", "cache"):
        monkeypatch.setattr(far, name, within(getattr(far, name)))
    chunks, frames = LAYOUTS[1]
    with far.fixed_size(pipe, {"chunk_partition": chunks}):
        _latents(pipe, chunks, frames, SIZES[0])
    masked = [(call, keys, mask) for call, keys, mask in masks if mask is not None]
    for _, keys, mask in masked:
        assert mask.shape == (1, keys), mask.shape
    # every self-attention is masked, beside one unmasked cross-attention a block: one
    # a block in a denoising call, one for each chunk it computes in a cache call
    counts = {(call, mask is None): 0 for call in ("step", "cache") for mask in (0, None)}
    for call, _, mask in masks:
        counts[call, mask is None] += 1
    assert counts["step", False] == counts["step", True] > 0
    assert counts["cache", False] > counts["cache", True] > 0


@pytest.mark.slow
def test_a_run_compiles_the_same_programs_for_any_length(tmp_path):
    """Through Porter, 1, 2, 4 and 8 chunks of one latent frame: 8 chunks compile
    nothing 4 did not (denoising calls before and after the first cache call, and
    three kinds of cache call: the first chunk's, two in the window, one leaving it),
    fewer chunks call the kinds they reach; the 8-chunk video is plain diffusers'
    within a level. (One chunk runs here; in diffusers itself its cache for a video
    shorter than the window has a negative size.)"""
    from porter.aot import programs
    from porter.transforms import jit

    expected = _own(tmp_path, [([1] * 8, 29, 32, "np")])[str(([1] * 8, 32))].numpy()
    build_anyflow_far_pipeline().save_pretrained(tmp_path / "far")
    (tmp_path / "r.yaml").write_text(
        f"model: {{family: generic, source: {tmp_path / 'far'}}}\n"
        "generate: {prompt: a cat, height: 32, width: 32, frames: 5, steps: 2,\n"
        "           guidance_scale: 6.0, max_sequence_length: 16}\n")
    import porter

    found, videos = {}, {}
    with porter.load(tmp_path / "r.yaml") as loaded:
        rules = jit.rules(loaded.recipe, loaded.family, "cpu")
        for chunks in (1, 2, 4, 8):
            frames = 4 * (chunks - 1) + 1
            with programs.recorded(loaded.pipe, rules) as calls:
                videos[chunks] = loaded.generate(
                    frames=frames, extra={"chunk_partition": [1] * chunks}).frames
            found[chunks] = {(c.method, repr(c.args), repr(c.kwargs)) for c in calls
                             if c.component == "transformer"}
    assert {method for method, _, _ in found[8]} == {"far_step", "far_cache"}
    assert len(found[8]) == 5
    assert found[1] <= found[2] <= found[4] == found[8], "a longer video compiled more"
    assert np.abs((expected * 255).round() - videos[8]).max() <= 1


def test_plan_names_the_inputs_the_recipe_and_the_family_place(tmp_path):
    """`porter plan`'s placement line names the transformer's inputs placed on the
    mesh: the recipe's own, then FAR's cache where its heads divide the head axis."""
    from types import SimpleNamespace

    from porter.recipe import load
    from porter.registry import loaded
    from porter.transforms import Checking, placement

    (tmp_path / "r.yaml").write_text(
        "model: {family: generic, source: unused, pipeline: AnyFlowFARPipeline}\n"
        "generate: {prompt: a cat}\nattention: {head_axis: tp}\n")
    registry = loaded()
    sketch = SimpleNamespace(config=SimpleNamespace(num_attention_heads=2))

    def detail(*overrides, tp=2):
        recipe = load(tmp_path / "r.yaml", [f"mesh={{tp: {tp}}}", *overrides])
        return placement._inputs_detail(Checking(
            recipe, registry, registry.family("generic"), {"transformer": sketch}, {"tp": tp}))

    assert detail() == ", transformer inputs placed (its family's: context, window)"
    assert detail('sharding.inputs={"window": [null]}') == (
        ", transformer inputs placed (the recipe's: window; its family's: context)")
    assert detail(tp=4) == ""  # 2 heads do not divide 4 devices: the cache stays whole


@pytest.mark.slow
def test_the_residual_split_over_the_head_axis_makes_the_same_video(tmp_path, monkeypatch,
                                                                   capsys):
    """Under a head axis of two devices FAR's transformer splits each block's residual
    along its width (``width.width_split``, its family's default) and its cache's heads
    (``far.cache_split``, placed on every call of its programs): the video is the one
    device's, within a level; a recipe's own rules (none here) replace the default."""
    import porter
    from porter.recipe import load
    from porter.registry import loaded
    from porter.transforms import sharding

    pipe = build_anyflow_far_pipeline()
    pipe.save_pretrained(tmp_path / "far")
    (tmp_path / "r.yaml").write_text(
        f"model: {{family: generic, source: {tmp_path / 'far'}, pipeline: AnyFlowFARPipeline}}\n"
        "generate: {prompt: a cat, height: 16, width: 16, frames: 9, steps: 2,\n"
        "           guidance_scale: 6.0, max_sequence_length: 16,\n"
        "           extra: {chunk_partition: [1, 1, 1]}}\n")
    split = WAN_TP2
    family = loaded().family("generic")
    rules = family.default_activations(load(tmp_path / "r.yaml", split), "transformer",
                                       {"tp": 2})
    assert [(rule.module, rule.spec) for rule in rules] == [(width.WIDTH_BLOCKS,
                                                            [None, None, "tp"])]
    # each block's three updates of its residual are what the rule constrains
    hooks = sharding.constrain_activations(pipe.transformer, None, rules)
    assert len(hooks) == 3 * pipe.transformer.config.num_layers
    assert family.default_activations(load(tmp_path / "r.yaml"), "transformer", {}) == []
    heads = [None, None, None, "tp", None, None]
    def specs(overrides, axes=None):
        return sharding.input_specs(load(tmp_path / "r.yaml", overrides), "transformer",
                                    axes or {"tp": 2}, family, pipe.transformer)

    assert specs(split) == {"context": heads, "window": heads}
    assert specs([*split, 'sharding.inputs={"window": [null]}'])["window"] == [None]
    # the tiny model's 2 heads do not divide 4 devices: attention splits its queries
    # there, and the cache stays whole
    assert specs([*split, "mesh={tp: 4}"], {"tp": 4}) == {}
    placed, place = [], sharding.ShardedInputs._placed  # what the programs are given

    def recorded(self, kwargs):
        kwargs = place(self, kwargs)
        placed.extend(str(kwargs[k]._elem.sharding.spec) for k in ("context", "window")
                      if kwargs.get(k) is not None)
        return kwargs

    monkeypatch.setattr(sharding.ShardedInputs, "_placed", recorded)
    videos, splits, inputs = [], [], []
    for overrides in ([], split, [*split, "sharding.activations.transformer=[]"]):
        with porter.load(tmp_path / "r.yaml", *overrides) as pipe:
            made = pipe.generate()
        videos.append(made.frames.astype(int))
        record = made.record["weights"]["components"]["transformer"]
        splits.append(record.get("default_split"))
        inputs.append(record.get("default_inputs"))
    assert splits == [None, ["tp"], None]  # the default applied, and only where it may
    # the cache's placement is recorded, and `porter plan` says whose it is
    assert inputs == [None, {"context": heads, "window": heads},
                      {"context": heads, "window": heads}]
    from porter import cli
    assert cli.main(["plan", str(tmp_path / "r.yaml"), "--devices", "2", *split,
                     'sharding.inputs={"window": [null]}']) == 0
    assert ("transformer inputs placed (the recipe's: window; its family's: context)"
            in capsys.readouterr().out)
    assert placed and set(placed) == {str(sharding.partition_spec(heads))}
    assert np.abs(videos[1] - videos[0]).max() <= 1
    assert np.abs(videos[2] - videos[0]).max() <= 1
