"""Denoising checkpoints: an edited or impossible checkpoint is refused naming the file and
the key, before anything loads."""

import json
import shutil

import pytest

from porter import registry as registry_mod
from porter.commands.run import run
from porter.errors import UsageError

from support.processes import porter_process
from support.runs import RECIPE, tiny_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run stopped after its first denoising step: a progress checkpoint on disk."""
    import signal as signals

    from diffusers import FlowMatchEulerDiscreteScheduler

    from porter.errors import Interrupted
    directory = tmp_path_factory.mktemp("interrupted")
    loaded = tiny_recipe(directory, directory / "out", "tiny", "generate.steps=3",
                         "output.checkpoint_every=0")
    step = FlowMatchEulerDiscreteScheduler.step

    def signalled(self, *args, **kwargs):
        signals.raise_signal(signals.SIGINT)
        return step(self, *args, **kwargs)
    FlowMatchEulerDiscreteScheduler.step = signalled
    try:
        with pytest.raises(Interrupted):
            run(loaded, registry_mod.loaded(), progress=False)
    finally:
        FlowMatchEulerDiscreteScheduler.step = step
    return directory / "out"


def _edited_progress(interrupted, tmp_path, edit):
    out = tmp_path / "out"
    shutil.copytree(interrupted, out)
    record = out / "progress-000001.json"
    meta = json.loads(record.read_text())
    edit(meta)
    record.write_text(json.dumps(meta))
    return out, record


@pytest.mark.parametrize("step", [999, 4, -3, 0, "1"])
def test_a_progress_step_outside_the_schedule_is_refused(interrupted, tmp_path, step):
    out, record = _edited_progress(interrupted, tmp_path, lambda m: m.update(step=step))
    with pytest.raises(UsageError, match=f"{record}: step: .* is not a completed step"):
        run(tiny_recipe(tmp_path, out, "tiny", "generate.steps=3"), registry_mod.loaded(),
            progress=False, resume=True)


@pytest.mark.parametrize("attribute, entry, message", [
    ("num_inference_steps", {"value": "three"}, "a string where .* holds an integer"),
    ("sigmas", {"value": 3}, "an integer where .* holds a tensor"),
    ("sigmas", {"tensor": "missing"}, "names tensor 'missing', which the file does not hold"),
    ("__class__", {"value": 1}, "not a scheduler attribute"),
])
def test_scheduler_state_of_the_wrong_kind_is_refused(interrupted, tmp_path, attribute,
                                                      entry, message):
    def edit(meta):
        meta["scheduler"]["attributes"][attribute] = entry
    out, record = _edited_progress(interrupted, tmp_path, edit)
    with pytest.raises(UsageError, match=f"scheduler.attributes.{attribute}: {message}") \
            as info:
        run(tiny_recipe(tmp_path, out, "tiny", "generate.steps=3"), registry_mod.loaded(),
            progress=False, resume=True)
    assert str(record) in info.value.message


def _set_attribute(name, entry):
    return lambda meta: meta["scheduler"]["attributes"].update({name: entry})


@pytest.mark.parametrize("edit, message", [
    # a fraction for the step counter failed in diffusers' step, blamed as a porting gap
    (_set_attribute("_step_index", {"value": 1.5}),
     r"scheduler.attributes._step_index: 1.5 is not a count of steps"),
    # out of the schedule, JAX clamps the index: no error, wrong sigmas
    (_set_attribute("_step_index", {"value": 99}),
     r"scheduler.attributes._step_index: 99 does not follow from step 1"),
    (_set_attribute("_begin_index", {"value": "x"}),
     r"scheduler.attributes._begin_index: 'x' is not a count of steps"),
    (_set_attribute("num_inference_steps", {"value": 2.5}),
     r"scheduler.attributes.num_inference_steps: 2.5 is a fraction where .* holds a whole"),
    (_set_attribute("sigmas", {"tensor": None}),  # was a KeyError (internal error)
     r"scheduler.attributes.sigmas: None is not a tensor's name"),
    (lambda meta: meta["scheduler"].update(on_jax=[["sigmas"]]),  # was a TypeError
     r"scheduler.on_jax: \['sigmas'\] is not a tensor the file holds"),
])
def test_scheduler_state_that_cannot_be_resumed_is_refused(interrupted, tmp_path, edit,
                                                           message):
    out, record = _edited_progress(interrupted, tmp_path, edit)
    with pytest.raises(UsageError, match=f"{record}: {message}") as info:
        run(tiny_recipe(tmp_path, out, "tiny", "generate.steps=3"), registry_mod.loaded(),
            progress=False, resume=True)
    assert "delete the progress" in info.value.hint


def test_an_edited_progress_record_is_named_not_blamed_on_the_model(interrupted, tmp_path):
    """`porter run --resume` on a record whose step counter was edited: exit 2 naming
    the file and the key, before loading; it was a 'porting gap' in the scheduler."""
    out, record = _edited_progress(interrupted, tmp_path,
                                   _set_attribute("_step_index", {"value": 1.5}))
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(source="tiny", out=out))
    done = porter_process("run", str(path), "generate.steps=3", "--resume", str(out),
                          "--no-progress")
    assert done.returncode == 2, done.stderr
    assert f"{record}: scheduler.attributes._step_index: 1.5" in done.stderr
    assert "delete the progress" in done.stderr
    assert "porting gap" not in done.stderr and "model code" not in done.stderr
    assert "Traceback" not in done.stderr


def test_a_checkpoint_taken_on_another_schedule_is_refused(interrupted, tmp_path):
    """The checkpoint names the scheduler, its configuration and its timesteps; steps
    taken on one schedule do not continue on another (here: a shift changed in the
    scheduler's own configuration, which the recipe does not show)."""
    meta = json.loads((interrupted / "progress-000001.json").read_text())
    assert meta["schedule"]["class"] == "FlowMatchEulerDiscreteScheduler"
    assert len(meta["schedule"]["timesteps"]) == 3

    def shifted(meta):
        meta["schedule"]["config"]["shift"] = 3.0
    out, record = _edited_progress(interrupted, tmp_path, shifted)
    with pytest.raises(UsageError, match=f"{record}: its steps were taken on another "
                       "schedule: config.shift 3.0 -> 7.0"):
        run(tiny_recipe(tmp_path, out, "tiny", "generate.steps=3"), registry_mod.loaded(),
            progress=False, resume=True)


def test_a_resume_with_another_scheduler_setting_is_refused(interrupted, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(interrupted, out)
    with pytest.raises(UsageError, match="made with other settings: scheduler"):
        run(tiny_recipe(tmp_path, out, "tiny", "generate.steps=3",
                        "scheduler.config={shift: 3.0}"), registry_mod.loaded(),
            progress=False, resume=True)


def test_a_resume_with_another_quantization_is_refused(interrupted, tmp_path):
    """Steps taken with full-precision weights do not continue on 8-bit ones."""
    out = tmp_path / "out"
    shutil.copytree(interrupted, out)
    with pytest.raises(UsageError, match="made with other settings: quantize"):
        run(tiny_recipe(tmp_path, out, "tiny", "generate.steps=3", "quantize.format=int8"),
            registry_mod.loaded(), progress=False, resume=True)
