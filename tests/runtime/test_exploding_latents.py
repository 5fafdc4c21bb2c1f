"""Latents that stay finite but explode stop the run at the step that made them, as NaN
does: one scalar read a step (the largest |value|, which carries NaN and infinity too),
in every float dtype the latents come in."""

import jax.numpy as jnp
import pytest
import torch
from safetensors.torch import save_file

from porter.errors import NonFinite
from porter.runtime import finite

from support import RECIPES
from support.processes import porter_calls
from support.single_file import fp8


def test_one_read_gives_the_size_nan_and_infinity_in_every_float_dtype():
    """bfloat16 too: numpy does not count it as a float, and bfloat16 latents (model.dtype
    bfloat16) went unchecked, NaN included."""
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        values = jnp.array([0.5, -3072.0, 2.0], dtype)  # exact in each
        assert finite.magnitude(values) == 3072.0 and finite.bounded(3072.0)
        nan = values.at[1].set(jnp.nan)
        assert jnp.isnan(finite.magnitude(nan)) and not finite.bounded(finite.magnitude(nan))
        assert finite.magnitude(values.at[0].set(-jnp.inf)) == float("inf")
    assert not finite.bounded(float("nan")) and not finite.bounded(finite.BOUND * 2)
    assert finite.magnitude(jnp.arange(5)) == 0.0 and finite.magnitude(jnp.zeros(0)) == 0.0


def test_the_generic_familys_step_callback_stops_exploding_latents():
    """``family: generic`` checks through the pipeline's step callback: the same bound,
    the step named (1-based) with the magnitude."""
    from porter.families.generic import _StepWatch

    class Pipeline:
        _callback_tensor_inputs = ["latents"]

        def __call__(self, callback_on_step_end=None, callback_on_step_end_tensor_inputs=None):
            raise AssertionError("not called here")

    pipe = Pipeline()
    watch = _StepWatch(pipe, 4)
    assert watch.kwargs["callback_on_step_end"] is watch
    watch(pipe, 0, None, {"latents": jnp.full((8,), 4.0)})
    with pytest.raises(NonFinite, match=r"^denoising step 2 of 4 made latents of magnitude "
                                        r"3e\+08 \(their largest \|value\|") as info:
        watch(pipe, 1, None, {"latents": jnp.full((8,), -3e8)})
    assert info.value.magnitude == 3e8 and "scale_weight" in info.value.hint
    with pytest.raises(NonFinite, match="step 3 of 4 made NaN or infinite latents"):
        watch(pipe, 2, None, {"latents": jnp.full((8,), jnp.nan)})


@pytest.mark.slow
def test_latents_that_explode_stop_the_run_at_that_step(tmp_path):
    """The tiny Wan from a file whose weights are scaled fp8's values read without their
    scales (here in bfloat16, so no fp8 check can see it): its latents reach 3.3e8 at
    step 1 and 5.6e9 at step 4, finite; exit 0 with a video of noise before. Now exit 2
    at step 1, keeping the encode stage, writing no video or record (fresh process)."""
    from porter_wan.tiny import build_pipeline

    state = {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in
             build_pipeline().transformer.state_dict().items()}
    unscaled = {name: tensor.to(torch.bfloat16) for name, tensor in
                fp8(state, scaled=True).items()
                if not name.endswith("scale_weight") and name != "scaled_fp8"}
    save_file(unscaled, tmp_path / "unscaled.safetensors")
    out = tmp_path / "out"
    [done] = porter_calls(["run", RECIPES / "wan-tiny.yaml", "model.dtype=bfloat16",
                           f"model.transformer={tmp_path / 'unscaled.safetensors'}",
                           f"output.dir={out}", "--no-progress"])
    assert done.returncode == 2, done.stderr
    assert "error: denoising step 1 of 4 made latents of magnitude 3.27e+08 (their largest " \
        "|value|; real latents are of order 1 to 10): stopped; kept: the encode stage" \
        in done.stderr
    assert "scale_weight" in done.stderr and "Traceback" not in done.stderr
    assert (out / "encode.safetensors").exists()
    assert not (out / "video.mp4").exists() and not (out / "run.json").exists()
