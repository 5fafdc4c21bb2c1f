"""The recipe's scheduler and schedule: another class with its settings, timesteps or
sigmas given one by one. The staged loop sets them on the scheduler itself (Wan's
pipelines take neither), so each setup is held to plain diffusers driven on the same
schedule through its scheduler; a recipe the scheduler cannot follow is a problem
with its file and line before anything loads."""

import json

import pytest

from porter import registry as registry_mod, recipe
from porter.commands.run import run
from porter.commands.validate import validate

from support.references import wan_latents

BASE = """\
model: {{family: wan, source: tiny, variant: {variant}}}
generate: {{prompt: "a cat", height: 32, width: 32, frames: 9, max_sequence_length: 16,
           guidance_scale: {guidance}, {generate}}}
scheduler: {scheduler}
output: {{dir: {out}}}
"""


def load(write, tmp_path, generate, scheduler="{}", variant="t2v", guidance=1.0):
    path = write("r.yaml", BASE.format(variant=variant, generate=generate, guidance=guidance,
                                       scheduler=scheduler, out=tmp_path / "out"))
    return recipe.load(path)


@pytest.mark.slow
def test_two_experts_on_given_timesteps_switch_as_diffusers(write, tmp_path):
    """Wan 2.2's two experts on explicit timesteps: the high-noise expert while t >=
    the boundary, as the scheduler's own math places each step."""
    timesteps = [1000.0, 900.0, 500.0, 250.0]
    loaded = load(write, tmp_path, f"timesteps: {timesteps}", variant="t2v-two-experts")
    result = run(loaded, registry_mod.loaded(), progress=False)
    expected = wan_latents(loaded, timesteps=timesteps)
    assert (result.latents - expected).abs().max() <= 1e-4
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["schedule"]["timesteps"] == timesteps


def problems(write, tmp_path, generate, scheduler="{}", variant="t2v"):
    loaded = load(write, tmp_path, generate, scheduler, variant)
    return [(p.path, p.message, p.hint, p.line) for p in validate(loaded, registry_mod.loaded())]


def test_an_unknown_class_is_named_with_the_closest(write, tmp_path):
    [(path, message, hint, line)] = problems(write, tmp_path, "steps: 2",
                                             "{name: FlowMatchEulerScheduler}")
    assert path == "scheduler.name" and line == 4
    assert "not a scheduler of the installed diffusers" in message
    assert "FlowMatchEulerDiscreteScheduler" in hint


def test_a_setting_the_class_lacks_is_refused_not_dropped(write, tmp_path):
    # from_config would drop it with a warning: the run would take the wrong schedule
    [(path, message, hint, _)] = problems(
        write, tmp_path, "steps: 2", "{name: FlowMatchEulerDiscreteScheduler, "
        "config: {flow_shift: 5.0}}")
    assert path == "scheduler.config.flow_shift"
    assert "has no setting 'flow_shift'" in message and "'shift'" in hint


def test_a_schedule_the_scheduler_cannot_take(write, tmp_path):
    [(path, message, hint, _)] = problems(
        write, tmp_path, "timesteps: [999, 500]", "{name: CogVideoXDDIMScheduler}")
    assert path == "generate.timesteps" and "takes no timesteps" in message
    assert "FlowMatchEulerDiscreteScheduler" in hint


def test_a_step_count_the_schedule_contradicts(write, tmp_path):
    found = problems(write, tmp_path, "steps: 3, sigmas: [1.0, 0.5], "
                     "timesteps: [1000, 500, 250]")
    assert {p[0] for p in found} == {"generate.steps", "generate.sigmas"}
    assert any("3 steps, but generate.sigmas gives 2" in p[1] for p in found)



def test_a_scheduler_whose_library_is_missing_says_which(write, tmp_path):
    import importlib.util

    if importlib.util.find_spec("torchsde") is not None:
        pytest.skip("torchsde is installed here")
    [(path, message, _, _)] = problems(write, tmp_path, "steps: 2",
                                       "{name: DPMSolverSDEScheduler}")
    assert path == "scheduler.name" and "needs a library this machine lacks" in message
    assert "torchsde" in message


def test_a_local_checkpoints_own_scheduler_is_checked_before_loading(write, tmp_path,
                                                                       saved_tiny):
    """No class named: the checkpoint's scheduler_config.json names it."""
    path = write("r.yaml", f"model: {{family: wan, source: '{saved_tiny}'}}\n"
                 "generate: {prompt: a cat, height: 32, width: 32, frames: 9, steps: 2, "
                 "max_sequence_length: 16}\nscheduler: {config: {shfit: 5.0}}\n")
    [problem] = validate(recipe.load(path), registry_mod.loaded())
    assert problem.path == "scheduler.config.shfit" and "'shift'" in problem.hint


def test_the_recorded_schedule_leaves_out_what_differs_between_processes():
    """diffusers' private configuration keys (``_use_default_values``, built from a set)
    change order from one process to the next: a resume elsewhere would be refused."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from porter.transforms import scheduler

    made = FlowMatchEulerDiscreteScheduler.from_config({"shift": 5.0})
    made.set_timesteps(2)
    described = scheduler.describe(made, made.timesteps)
    assert described["config"]["shift"] == 5.0
    assert not [key for key in described["config"] if key.startswith("_")]
    # an edited record is compared, not a traceback
    changed = scheduler.differences({"class": "X", "config": "edited"}, described)
    assert changed[0] == "class X -> FlowMatchEulerDiscreteScheduler"
    assert "config.shift None -> 5.0" in changed and changed[-1].startswith("timesteps None")
