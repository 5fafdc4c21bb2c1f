"""A transformer's identical blocks as one lax.scan over their stacked weights computes
what its blocks one by one do, for each family that scans (porter.transforms.jit.scan)."""

import pytest
import torch

from porter import recipe, runtime
from porter.aot.programs import Input
from porter.recipe.schema import CompileRule
from porter.shims.interop import to_device, to_host
from porter.transforms import jit
from porter.transforms import placement
from porter.transforms.jit import scan

from support import RECIPES


def _wan():
    from diffusers import WanTransformer3DModel

    from porter_wan.tiny import TRANSFORMER

    return WanTransformer3DModel(**{**TRANSFORMER, "num_layers": 3}), {
        "hidden_states": Input((1, 16, 3, 8, 8), torch.float32),
        "timestep": Input((1,), torch.float32),
        "encoder_hidden_states": Input((1, 16, 32), torch.float32)}


def _cogvideox():
    from diffusers import CogVideoXTransformer3DModel

    model = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        time_embed_dim=2, text_embed_dim=32, num_layers=3, sample_width=2,
        sample_height=2, sample_frames=9, patch_size=2, temporal_compression_ratio=4,
        max_text_seq_length=16)
    return model, {"hidden_states": Input((1, 3, 4, 4, 4), torch.float32),
                   "encoder_hidden_states": Input((1, 16, 32), torch.float32),
                   "timestep": Input((1,), torch.int32)}


def _hunyuan():
    from diffusers import HunyuanVideoTransformer3DModel

    model = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10,
        num_layers=2, num_single_layers=3, num_refiner_layers=1, patch_size=1,
        patch_size_t=1, guidance_embeds=True, text_embed_dim=16, pooled_projection_dim=8,
        rope_axes_dim=(2, 4, 4))
    return model, {"hidden_states": Input((1, 4, 3, 4, 4), torch.float32),
                   "timestep": Input((1,), torch.float32),
                   "encoder_hidden_states": Input((1, 12, 16), torch.float32),
                   "encoder_attention_mask": Input((1, 12), torch.float32),
                   "pooled_projections": Input((1, 8), torch.float32),
                   "guidance": Input((1,), torch.float32)}


@pytest.mark.parametrize("build", [_wan, _cogvideox, _hunyuan], ids=lambda b: b.__name__[1:])
def test_scanned_blocks_compute_what_blocks_one_by_one_do(build):
    rt = runtime.start(recipe.load(RECIPES / "wan-tiny.yaml", ["mesh={dp: 1}"]))
    generator = torch.Generator().manual_seed(0)
    outputs = []
    for scanned in (True, False):
        torch.manual_seed(0)
        model, inputs = build()
        model.eval()
        values = {k: (torch.randn(v.shape, generator=generator) if v.dtype.is_floating_point
                      else torch.full(v.shape, 500, dtype=v.dtype)) for k, v in inputs.items()}
        if "encoder_attention_mask" in values:
            values["encoder_attention_mask"] = (torch.arange(12) < 9).float()[None]
        generator = torch.Generator().manual_seed(0)  # the same inputs for both
        lists = scan.identical_lists(model)
        assert lists  # every family here has a list of identical blocks
        placement.apply(model, rt, [])
        compiled = jit.apply(model, CompileRule(scan=scanned))
        with rt.env:
            out = compiled(return_dict=False, **{k: to_device(v, rt) for k, v in
                                                 values.items()})[0]
        stacked = [k for k in compiled.params if f".{scan.STACKED}." in k]
        assert bool(stacked) == scanned
        outputs.append(to_host(out))
    scale = outputs[1].abs().max()
    assert (outputs[0] - outputs[1]).abs().max() / scale <= 1e-5


def test_a_loop_that_changes_the_hidden_states_between_blocks_is_refused():
    """Only a loop that hands each block's outputs to the next one scans: one that adds
    to them in between (a residual from outside the blocks) is refused, with a hint."""
    from porter.errors import UsageError

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, hidden_states):
            return self.linear(hidden_states)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])

        def forward(self, hidden_states):
            for block in self.blocks:
                hidden_states = block(hidden_states) + 1.0  # not what a scan computes
            return hidden_states

    rt = runtime.start(recipe.load(RECIPES / "wan-tiny.yaml", ["mesh={dp: 1}"]))
    model = Model()
    placement.apply(model, rt, [])
    compiled = jit.apply(model, CompileRule(scan=True), name="transformer")
    with rt.env, pytest.raises(UsageError) as info:
        compiled(to_device(torch.randn(2, 4), rt))
    assert "changes the hidden states between blocks" in info.value.message
    assert "compile.transformer.scan: false" in info.value.hint


def test_a_half_precision_stack_is_never_converted_whole():
    """On the CPU backend XLA computes every bfloat16 operation in float32, the scan's
    slicing of a stack too; a stack held as bfloat16 would be converted whole, ahead of
    the loop: a float32 copy of every block's weights (a Wan 1.3B run peaked at 10.3
    GiB instead of 4.9). Held as integers, the program needs a block's worth."""
    import jax

    from porter.shims.compat import import_torchax

    interop = import_torchax().interop

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(512, 512)

        def forward(self, hidden_states):
            return torch.tanh(self.linear(hidden_states))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block() for _ in range(8)])

        def forward(self, hidden_states):
            for block in self.blocks:
                hidden_states = block(hidden_states)
            return hidden_states

    rt = runtime.start(recipe.load(RECIPES / "wan-tiny.yaml", ["mesh={dp: 1}"]))
    model = Model().to(torch.bfloat16)
    reference = Model().to(torch.bfloat16)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    placement.apply(model, rt, [])
    compiled = jit.apply(model, CompileRule(scan=True), name="transformer")
    stacked = compiled.params["blocks.*.linear.weight"].jax()
    assert stacked.dtype == jax.numpy.uint16  # bit for bit, the blocks' bfloat16

    def forward(params, buffers, hidden_states):
        return interop.jax_view(compiled.functional_call(
            "forward", interop.torch_view(params), interop.torch_view(buffers),
            interop.torch_view(hidden_states)))

    with rt.env:
        inputs = (interop.jax_view(compiled.params), interop.jax_view(compiled.buffers),
                  to_device(x, rt).jax())
        program = jax.jit(forward).lower(*inputs).compile()
        out = to_host(interop.torch_view(program(*inputs)))
    weights = stacked.nbytes
    assert program.memory_analysis().temp_size_in_bytes < weights / 2  # float32 whole: 2x
    with torch.no_grad():
        expected = reference(x)
    assert (out.float() - expected.float()).abs().max() <= 2e-2
