"""Nothing mislabelled, nothing poisoned: who owns a run directory, what its files are
and whether they changed, damaged caches, NaN, and errors the machine causes.

Cases about processes, files and signals run the real `porter` command in a fresh
process; the rest call the library. RELIABILITY.md lists each guarantee.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from porter import plugins, recipe
from porter.rundir import artifacts, outputs
from porter.runtime import atomic, compile_cache
from porter.errors import UsageError
from porter.commands.run import run

from conftest import FULL_DISK, RECIPES, slow_porter

pytestmark = pytest.mark.slow

RECIPE = """\
model: {{family: wan, source: {source}}}
generate: {{prompt: "a cat", height: 32, width: 32, frames: 9, steps: 2,
           max_sequence_length: 16}}
output: {{dir: {out}}}
"""


def porter_process(*args, env=None, script=None):
    """`porter ARGS` in a new process with nothing imported first."""
    command = [sys.executable, "-c", script, *args] if script else \
        [sys.executable, "-m", "porter.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def tiny_recipe(tmp_path, out, source="tiny", *overrides):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(source=source, out=out))
    return recipe.load(path, list(overrides))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One complete tiny run, to copy and damage."""
    directory = tmp_path_factory.mktemp("finished")
    return run(tiny_recipe(directory, directory / "out"), plugins.registry(), progress=False)


def copy_run(finished, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished.directory, out)
    return out


# --- a run owns its directory ------------------------------------------------------

def test_a_busy_directory_is_refused_naming_the_holder(tmp_path):
    """A second `porter run` into a directory a run is writing exits 2 at once, naming
    the holder; the first run's video and record stay one pair."""
    out = tmp_path / "out"
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(source="tiny", out=out))
    first = subprocess.Popen([sys.executable, "-c", slow_porter("FlowMatchEulerDiscreteScheduler"),
                              "run", str(path), "--no-progress"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / outputs.LOCK).exists() or not (out / outputs.LOCK).read_text():
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = porter_process("run", str(path), "generate.seed=1", "--no-progress")
    assert second.returncode == 2, second.stderr
    assert f"{out} is in use by another porter run (pid {first.pid}" in second.stderr
    assert "Traceback" not in second.stderr
    _, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr
    record = json.loads((out / "run.json").read_text())
    assert record["seed"] == 0
    assert record["outputs"]["files"]["video.mp4"] == atomic.sha256(out / "video.mp4")


def test_a_killed_holder_leaves_no_stuck_lock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from pathlib import Path\nfrom porter.rundir import outputs\n"
                               "with outputs.owned(Path(sys.argv[1])):\n"
                               "    print('held', flush=True); time.sleep(300)",
                               str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(outputs.Busy, match=f"pid {holder.pid}"):
        with outputs.owned(tmp_path):
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with outputs.owned(tmp_path):  # the kernel dropped the lock with the process
        assert f"pid {os.getpid()}" in (tmp_path / outputs.LOCK).read_text()


def test_writers_never_share_a_temporary_name(tmp_path):
    target = tmp_path / "run.json"
    assert len({atomic.temporary(target) for _ in range(100)}) == 100
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    threads = [threading.Thread(target=atomic.write_bytes, args=(target, p))
               for p in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert target.read_bytes() in payloads  # one writer's file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    target = tmp_path / "video.mp4"
    monkeypatch.setattr("os.replace", full)
    with pytest.raises(OSError):
        atomic.write_bytes(target, b"x" * 1000)
    assert list(tmp_path.iterdir()) == []


def test_a_new_run_never_pairs_with_an_older_record(finished, tmp_path, monkeypatch):
    """A run killed between writing its video and its record leaves its video alone:
    the older run's record was removed before the new run wrote anything."""
    out = copy_run(finished, tmp_path)
    from porter.rundir import record

    def killed(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(record, "write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_recipe(tmp_path, out, "tiny", "generate.seed=1"), plugins.registry(),
            progress=False)
    assert (out / "video.mp4").exists() and not (out / "run.json").exists()
    assert atomic.sha256(out / "video.mp4") != finished.data["outputs"]["files"]["video.mp4"]


def test_the_record_names_each_file_with_its_hash(finished):
    files = finished.data["outputs"]["files"]
    assert set(files) == {"video.mp4", "encode.safetensors", "denoise.safetensors"}
    for name, digest in files.items():
        assert atomic.sha256(finished.directory / name) == digest


# --- stage and checkpoint files are what their records say --------------------------

def _flip_a_data_byte(path):
    """Change one value in place: same header, same size, same shape and dtype."""
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("stage, changed", [("decode", "denoise"), ("denoise", "encode")])
def test_stage_files_changed_in_place_are_refused(finished, tmp_path, stage, changed):
    out = copy_run(finished, tmp_path)
    _flip_a_data_byte(out / f"{changed}.safetensors")
    with pytest.raises(UsageError, match=f"{changed}.safetensors has changed since its "
                                         "record was written") as info:
        run(tiny_recipe(tmp_path, out), plugins.registry(), progress=False, stage=stage)
    assert "delete the stage's files" in info.value.hint


def test_nan_latents_in_a_stage_file_are_refused(finished, tmp_path):
    out = copy_run(finished, tmp_path)
    loaded = tiny_recipe(tmp_path, out)
    latents = finished.latents.clone()
    latents.view(-1)[:3] = float("nan")
    artifacts.save(out, "denoise", {"latents": latents}, loaded)  # a record that agrees
    with pytest.raises(UsageError, match="tensor 'latents' holds 3 NaN or infinite"):
        run(loaded, plugins.registry(), progress=False, stage="decode")


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
            run(loaded, plugins.registry(), progress=False)
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
        run(tiny_recipe(tmp_path, out, "tiny", "generate.steps=3"), plugins.registry(),
            progress=False, resume=True)


@pytest.mark.parametrize("attribute, entry, message", [
    ("num_inference_steps", {"value": "three"}, "a string where .* holds a number"),
    ("sigmas", {"value": 3}, "a number where .* holds a tensor"),
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
        run(tiny_recipe(tmp_path, out, "tiny", "generate.steps=3"), plugins.registry(),
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
        run(tiny_recipe(tmp_path, out, "tiny", "generate.steps=3"), plugins.registry(),
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


# --- non-finite values --------------------------------------------------------------

@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory):
    from porter_wan.tiny import build_pipeline

    pipe = build_pipeline()
    with torch.no_grad():
        pipe.transformer.proj_out.weight[0, :5] = float("nan")
        pipe.transformer.proj_out.weight[1, 0] = float("inf")
    directory = tmp_path_factory.mktemp("nan-wan")
    pipe.save_pretrained(directory)
    return directory


def test_nan_weights_are_refused_at_load_naming_the_tensor(nan_checkpoint, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(source=nan_checkpoint, out=tmp_path / "out"))
    done = porter_process("run", str(path), "--no-progress")
    assert done.returncode == 2, done.stderr
    assert "NaN or infinite values in 1 weight tensor(s): transformer.proj_out.weight (6)" \
        in done.stderr
    assert "model.allow_nonfinite" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "video.mp4").exists()


def test_latents_going_nonfinite_stop_the_run_at_that_step(nan_checkpoint, tmp_path,
                                                           capsys):
    """Allowed NaN weights are a warning; the first step then makes NaN latents, and the
    run stops there (exit 2), keeping the encode stage, writing no video."""
    from porter.runtime import notices
    from porter.errors import NonFinite

    out = tmp_path / "out"
    with pytest.raises(NonFinite, match="denoising step 1 of 2 made NaN or infinite "
                                        "latents: stopped; kept: the encode stage") as info:
        run(tiny_recipe(tmp_path, out, nan_checkpoint, "model.allow_nonfinite=true"),
            plugins.registry(), progress=False)
    assert info.value.exit_code == 2
    assert any("allowed by model.allow_nonfinite" in w for w in notices.given())
    assert artifacts.complete(out, "encode") and not artifacts.complete(out, "denoise")
    assert not (out / "video.mp4").exists()


def test_a_pipeline_run_in_one_piece_stops_at_nonfinite_latents(tmp_path, monkeypatch):
    """A CogVideoX whose transformer makes NaN stops at the step that made it: run in
    Porter's stages (keeping the encode stage), and as ``family: generic``, whose
    pipeline runs its own loop and is checked through the pipeline's step callback."""
    from porter_cogvideox.tiny import build_pipeline

    from porter.errors import NonFinite

    pipe = build_pipeline()
    with torch.no_grad():
        pipe.transformer.proj_out.weight[0, 0] = float("nan")
    pipe.save_pretrained(tmp_path / "nan")
    staged_out, generic_out = tmp_path / "staged", tmp_path / "generic"
    staged = recipe.load(RECIPES / "cogvideox-tiny.yaml", [
        f"model.source={tmp_path / 'nan'}", f"output.dir={staged_out}",
        "model.allow_nonfinite=true"])
    with pytest.raises(NonFinite, match=r"denoising step 1 of \d+ made NaN or infinite "
                                        r"latents: stopped; kept: the encode stage$"):
        run(staged, plugins.registry(), progress=False)
    assert artifacts.complete(staged_out, "encode")
    loaded = recipe.load(RECIPES / "cogvideox-tiny.yaml", [
        "model.family=generic", f"model.source={tmp_path / 'nan'}", "rotary.precompute=false",
        f"output.dir={generic_out}", "model.allow_nonfinite=true"])
    with pytest.raises(NonFinite, match=r"denoising step 1 of \d+ made NaN or infinite "
                                        r"latents: stopped$"):
        run(loaded, plugins.registry(), progress=False)
    for out in (staged_out, generic_out):
        assert not (out / "video.mp4").exists() and not (out / "run.json").exists()


def test_only_parameters_are_counted_not_buffers():
    """A mask buffer may hold -inf on purpose; a parameter may not."""
    from porter import runtime
    from porter.transforms import placement

    module = torch.nn.Linear(4, 4)
    with torch.no_grad():
        module.weight[0, 0] = float("nan")
    module.register_buffer("mask", torch.full((4,), float("-inf")))
    found = {}
    placement.apply(module, runtime.start(recipe.load(RECIPES / "wan-tiny.yaml")), [],
                    None, found)
    assert found == {"weight": 1}


def test_the_finiteness_check_counts_exactly():
    from porter.runtime import finite

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(1000).to(dtype)
        assert finite.count(x) == 0
        x[[3, 500]] = float("nan")
        x[7] = float("-inf")
        assert finite.count(x) == 3
    assert finite.count(torch.arange(10)) == 0 and finite.count(torch.empty(0)) == 0


# --- the trace cache verifies what it loads -----------------------------------------

def _trace_cache(directory):
    from porter.transforms.compile.traces import TraceCache
    return TraceCache(directory, "fingerprint")


def _stored(directory):
    import jax.numpy as jnp

    cache = _trace_cache(directory)
    f = cache.jit("double", lambda x: x * 2)
    g = cache.jit("square", lambda x: x * x)
    f(jnp.arange(4.0)), g(jnp.arange(3.0))
    assert cache.exported == 2
    return sorted(directory.glob("*.exported"))


def test_a_damaged_stored_program_is_discarded_and_traced_again(tmp_path, monkeypatch):
    import jax.numpy as jnp

    from porter.runtime import notices
    monkeypatch.setattr(notices, "_given", [])
    for path in _stored(tmp_path):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01  # one flipped bit in the program
        path.write_bytes(bytes(data))
    cache = _trace_cache(tmp_path)
    assert cache.jit("double", lambda x: x * 2)(jnp.arange(4.0)).tolist() == [0, 2, 4, 6]
    assert (cache.loaded, cache.discarded, cache.exported) == (0, 1, 1)
    assert [w for w in notices.given() if "discarded a stored traced program" in w]
    again = _trace_cache(tmp_path)  # the new entry is good
    again.jit("double", lambda x: x * 2)(jnp.arange(4.0))
    assert (again.loaded, again.discarded) == (1, 0)


def test_swapped_stored_programs_are_never_run(tmp_path):
    import jax.numpy as jnp

    first, second = _stored(tmp_path)
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    cache = _trace_cache(tmp_path)
    assert cache.jit("double", lambda x: x * 2)(jnp.arange(4.0)).tolist() == [0, 2, 4, 6]
    assert cache.jit("square", lambda x: x * x)(jnp.arange(3.0)).tolist() == [0, 1, 4]
    assert (cache.loaded, cache.discarded) == (0, 2)


def test_a_stored_program_whose_first_call_fails_is_a_miss(tmp_path):
    """An intact entry that still fails (here: another program stored under this key,
    with a matching digest) is discarded and traced again."""
    import jax.numpy as jnp

    from porter.transforms.compile import traces as trace_cache
    first, second = _stored(tmp_path)
    key_second = second.stem
    blob_first = trace_cache._unpack(first.stem, first.read_bytes())
    second.write_bytes(trace_cache._pack(key_second, blob_first))  # 4-vector program
    cache = _trace_cache(tmp_path)
    square = cache.jit("square", lambda x: x * x)
    assert square(jnp.arange(3.0)).tolist() == [0, 1, 4]
    assert cache.discarded == 1


def test_an_unwritable_trace_cache_warns_once_and_the_run_goes_on(tmp_path, monkeypatch):
    import jax.numpy as jnp

    from porter.runtime import notices
    monkeypatch.setattr(notices, "_given", [])
    (tmp_path / "file").write_text("not a directory")
    cache = _trace_cache(tmp_path / "file" / "traces")
    assert cache.jit("double", lambda x: x * 2)(jnp.arange(4.0)).tolist() == [0, 2, 4, 6]
    assert cache.jit("square", lambda x: x * x)(jnp.arange(3.0)).tolist() == [0, 1, 4]
    assert len([w for w in notices.given() if "cannot be stored" in w]) == 1


def test_a_cache_path_that_is_a_file_warns_and_the_run_goes_on(tmp_path):
    (tmp_path / "cache").write_text("a file")
    done = porter_process("run", str(RECIPES / "wan-tiny.yaml"), "generate.steps=1",
                          f"output.dir={tmp_path / 'out'}", "--no-progress",
                          env={"PORTER_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    assert "warning: the compile cache at" in done.stderr
    assert "continuing without it" in done.stderr
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["compile_cache"] is None
    assert any("compile cache" in w for w in record["warnings"])


def cached_run_into(cache, out):
    """A one-step tiny Wan run by `porter run` in a fresh process, compiling into (or
    loading from) the compile cache ``cache``; its process."""
    return porter_process("run", str(RECIPES / "wan-tiny.yaml"), "generate.steps=1",
                          f"output.dir={out}", "--no-progress",
                          env={"PORTER_CACHE_DIR": str(cache)})


@pytest.fixture(scope="module")
def filled_cache(tmp_path_factory):
    """A compile cache one run filled (JAX's entries and Porter's stored traces) and
    that run's output directory: each test damages its own copy (a copied cache hits
    as the original does: tests/test_runtime.py)."""
    directory = tmp_path_factory.mktemp("filled")
    done = cached_run_into(directory / "cache", directory / "out")
    assert done.returncode == 0, done.stderr
    return directory / "cache", directory / "out"


def copy_cache(filled_cache, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(filled_cache[0], cache)
    return cache


def test_unreadable_jax_cache_entries_are_replaced(tmp_path, filled_cache):
    """0-byte and cut entries (what JAX's in-place writes leave on a full disk) are
    removed with a warning and stored anew, whole."""
    cache = copy_cache(filled_cache, tmp_path)
    entries = sorted(cache.glob("*-cache"))
    assert entries
    entries[0].write_bytes(b"")
    entries[1].write_bytes(entries[1].read_bytes()[:100])
    damaged = cached_run_into(cache, tmp_path / "out")
    assert damaged.returncode == 0, damaged.stderr
    assert "removed an unreadable compile cache entry" in damaged.stderr
    assert sorted(p.name for p in cache.glob("*-cache")) == [p.name for p in entries]
    from jax._src import compilation_cache
    for entry in entries[:2]:  # stored anew, whole: what JAX reads back
        assert compilation_cache.decompress_executable(entry.read_bytes())
    assert not list(cache.glob(".*.partial"))


def test_swapped_jax_cache_entries_are_replaced_and_the_traces_kept(tmp_path, filled_cache):
    """Two JAX cache entries with their contents exchanged. JAX trusts the file name:
    it loaded the other program, every later run exited 1 (``safe_zip()``) and the
    trace cache threw away its healthy entry for it. Each entry's seal names its key:
    the two are removed, compiled again and stored anew, the stored traces kept."""
    from safetensors.torch import load_file

    cache = copy_cache(filled_cache, tmp_path)
    latents = load_file(str(filled_cache[1] / "denoise.safetensors"))["latents"]
    traces = {p.name: p.read_bytes() for p in (cache / "porter-traces").glob("*.exported")}
    first, second = sorted(cache.glob("*-cache"), key=lambda p: p.stat().st_size)[-2:]
    a, b = first.read_bytes(), second.read_bytes()  # two programs of the model
    first.write_bytes(b)
    second.write_bytes(a)
    done = cached_run_into(cache, tmp_path / "second")
    assert done.returncode == 0, done.stderr
    again = load_file(str(tmp_path / "second" / "denoise.safetensors"))["latents"]
    assert done.stderr.count("removed a compile cache entry that is not its key's") == 2
    assert "discarded a stored traced program" not in done.stderr
    assert torch.equal(latents, again)
    assert {p.name: p.read_bytes()
            for p in (cache / "porter-traces").glob("*.exported")} == traces
    for entry in (first, second):  # stored anew, each under its own key
        assert compile_cache._unseal(entry.name.removesuffix("-cache"), entry.read_bytes())[0]
    compiled = json.loads((tmp_path / "second" / "run.json").read_text())["timings"]["compile"]
    assert (compiled["cache_misses"], compiled["traces_loaded"]) == (2, 3)


SAME_SIGNATURE = """\
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from porter.runtime import compile_cache

compile_cache.enable(Path(sys.argv[1]))


@jax.jit
def double(x):
    return x * 2


@jax.jit
def triple(x):
    return x * 3


print(double(jnp.arange(3.0)).tolist(), triple(jnp.arange(3.0)).tolist())
"""


def test_swapped_jax_cache_entries_of_one_signature_never_run(tmp_path):
    """Two programs taking the same arguments: swapped, JAX alone silently runs the
    other one (``double`` gives 3x). Their seals refuse them."""
    cache = tmp_path / "cache"
    first = porter_process(str(cache), script=SAME_SIGNATURE)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split("\n")[-2] == "[0.0, 2.0, 4.0] [0.0, 3.0, 6.0]"
    (double,), (triple,) = cache.glob("jit_double-*"), cache.glob("jit_triple-*")
    a, b = double.read_bytes(), triple.read_bytes()
    double.write_bytes(b)
    triple.write_bytes(a)
    swapped = porter_process(str(cache), script=SAME_SIGNATURE)
    assert swapped.returncode == 0, swapped.stderr
    assert swapped.stdout == first.stdout
    assert swapped.stderr.count("removed a compile cache entry that is not its key's") == 2


# --- the machine refuses: exit 2 with what, where and a hint ------------------------

def _unshare_available() -> bool:
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return probe.returncode == 0


needs_namespaces = pytest.mark.skipif(not _unshare_available(),
                                      reason="needs unshare -rm (user and mount namespaces)")


def in_small_filesystem(tmp_path, command: str, options: str):
    """Run ``command`` (a shell line) with a fresh tmpfs mounted at tmp_path/mnt."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    script = f"mount -t tmpfs -o {options} tmpfs {mount} && {command}"
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True,
                          text=True, timeout=600, env=os.environ)


PORTER = f"{sys.executable} -m porter.cli"


@pytest.mark.parametrize("name", ["encode.safetensors", "progress-000001.json", "run.json"])
def test_a_full_disk_names_the_file_being_written(tmp_path, name):
    """write() on a full disk raises ENOSPC naming no file: the message said
    'No space left on device: ?'. It names the file a stage, a checkpoint or the
    record was being written to, with what to do."""
    out = tmp_path / "out"
    done = porter_process(name, "run", str(RECIPES / "wan-tiny.yaml"), "generate.steps=2",
                          "output.checkpoint_every=1", f"output.dir={out}", "--no-progress",
                          script=FULL_DISK)
    assert done.returncode == 2, done.stderr
    assert f"error: No space left on device writing {out / name}\n" in done.stderr
    assert "the disk is full" in done.stderr and "output.dir" in done.stderr
    assert "?" not in done.stderr.split("error:")[-1]
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert not list(out.glob(".*.partial"))


@needs_namespaces
def test_a_full_disk_is_an_environment_error(tmp_path):
    out = tmp_path / "mnt" / "out"
    done = in_small_filesystem(tmp_path, f"{PORTER} run {RECIPES / 'wan-tiny.yaml'} "
                               f"generate.steps=1 output.dir={out} --no-progress", "size=8k")
    assert done.returncode == 2, done.stderr
    assert "No space left on device" in done.stderr and "the disk is full" in done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


@needs_namespaces
def test_a_read_only_output_dir_fails_before_loading(tmp_path):
    out = tmp_path / "mnt" / "out"
    done = in_small_filesystem(tmp_path, f"{PORTER} run {RECIPES / 'wan-tiny.yaml'} "
                               f"output.dir={out}", "ro")
    assert done.returncode == 2, done.stderr
    assert "Read-only file system" in done.stderr and "read-only" in done.stderr
    assert "loading" not in done.stderr  # found before any weight


@needs_namespaces
def test_a_full_cache_disk_warns_and_leaves_no_empty_entries(tmp_path):
    cache = tmp_path / "mnt"
    command = (f"PORTER_CACHE_DIR={cache} {PORTER} run {RECIPES / 'wan-tiny.yaml'} "
               f"generate.steps=1 output.dir={tmp_path / 'out'} --no-progress && "
               f"find {cache} -type f -size -1 | wc -l")
    done = in_small_filesystem(tmp_path, command, "size=256k")
    assert done.returncode == 0, done.stderr
    assert "cannot be written" in done.stderr and "continuing without" in done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0"  # no 0-byte entry left


@needs_namespaces
def test_a_read_only_compile_cache_is_left_unused_with_a_warning(tmp_path):
    check = (f"{sys.executable} -c 'from pathlib import Path; from porter.runtime import "
             f"compile_cache; print(compile_cache.usable(Path(\"{tmp_path / 'mnt'}\")))'")
    done = in_small_filesystem(tmp_path, check, "ro")
    assert done.stdout.strip() == "False", done.stderr
    assert "Read-only file system" in done.stderr and "continuing without it" in done.stderr


def test_an_output_dir_that_is_a_file_fails_before_loading(tmp_path):
    (tmp_path / "file").write_text("x")
    done = porter_process("run", str(RECIPES / "wan-tiny.yaml"),
                          f"output.dir={tmp_path / 'file' / 'out'}")
    assert done.returncode == 2, done.stderr
    assert "cannot write the output directory" in done.stderr and "hint:" in done.stderr
    assert "loading" not in done.stderr


def test_resume_of_a_missing_directory_is_an_error(tmp_path):
    done = porter_process("run", str(RECIPES / "wan-tiny.yaml"), "--resume",
                          str(tmp_path / "missing"))
    assert done.returncode == 2 and "nothing to resume" in done.stderr, done.stderr
    assert not (tmp_path / "missing").exists()


def test_resume_with_another_output_dir_is_an_error(tmp_path, capsys):
    from porter import cli

    code = cli.main(["run", str(RECIPES / "wan-tiny.yaml"), "--resume", str(tmp_path / "a"),
                     f"output.dir={tmp_path / 'b'}"])
    assert code == 2 and "name different run directories" in capsys.readouterr().err
    code = cli.main(["run", str(RECIPES / "wan-tiny.yaml"), "--resume", str(tmp_path / "a"),
                     f"output.dir='{tmp_path / 'a'}'"])  # the same one, quoted
    assert code == 2 and "nothing to resume" in capsys.readouterr().err


def test_a_resumed_run_records_each_mesh_it_ran_on(tmp_path):
    out = tmp_path / "out"
    run(tiny_recipe(tmp_path, out, "tiny", "mesh.dp=1"), plugins.registry(),
        progress=False, stage="encode")
    result = run(tiny_recipe(tmp_path, out, "tiny", "mesh.dp=2"), plugins.registry(),
                 progress=False, resume=True)
    meshes = [(s["stage"], s["mesh"]) for s in result.data["history"]]
    assert meshes == [("encode", {"dp": 1}), ("denoise", {"dp": 2}), ("decode", {"dp": 2})]
    assert result.data["history"][1]["steps"] == [0, 2]


def address_space_limited(gib: int) -> list[str]:
    """A command prefix running a program under `ulimit -v` (the shell sets it: a
    preexec_fn would run Python in a fork of this process's JAX threads)."""
    return ["sh", "-c", f'ulimit -v {gib << 20} && exec "$0" "$@"', sys.executable]


def test_a_run_out_of_memory_exits_2_with_the_estimate(tmp_path):
    """A run past its memory (`ulimit -v 3G`) while denoising: exit 2 with the estimate
    (2.64 GiB: within the limit, so validate let it run; the process itself takes the
    rest) and what to change, not an internal error."""
    done = subprocess.run(
        [*address_space_limited(3), "-m", "porter.cli", "run", str(RECIPES / "wan-tiny.yaml"),
         "mesh.dp=1", "mesh.tp=1", "attention.backend=reference", "generate.frames=49",
         "generate.height=512", "generate.width=512", "generate.steps=1",
         f"output.dir={tmp_path / 'out'}", "--no-progress"],
        capture_output=True, text=True, timeout=600,
        # glibc reserves address space per thread arena: as few on any core count
        env={**os.environ, "PORTER_CACHE_DIR": str(tmp_path / "cache"),
             "MALLOC_ARENA_MAX": "2"})
    assert done.returncode == 2, done.stderr
    assert "error: out of memory running the model (" in done.stderr
    assert ("estimated per device: weights 296.68 KiB and self-attention scores 1.32 GiB "
            "per layer, kept twice (scores and softmax): about 2.64 GiB, of the 3.00 GiB a "
            "device has (set by the address-space limit RLIMIT_AS") in done.stderr
    assert "attention.backend: blockwise or auto" in done.stderr
    assert "generate.height, width or frames" in done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "video.mp4").exists()


def test_out_of_memory_is_classified_from_what_jax_and_python_raise(tmp_path):
    """The exception JAX raises (JaxRuntimeError, RESOURCE_EXHAUSTED: 256 TiB cannot be
    mapped, whatever the machine overcommits), a MemoryError, either as the cause of
    another error: OutOfMemory, exit 2, with the plan's estimate. Other errors pass."""
    import jax
    import jax.numpy as jnp

    from porter.port import out_of_memory
    from porter.errors import OutOfMemory, is_out_of_memory
    loaded = tiny_recipe(tmp_path, tmp_path / "out", "tiny", "attention.backend=blockwise")
    with pytest.raises(jax.errors.JaxRuntimeError) as raised:
        jnp.zeros((2**46,), jnp.float32).block_until_ready()
    assert "RESOURCE_EXHAUSTED" in str(raised.value)
    wrapped = RuntimeError("a step failed")
    wrapped.__cause__ = raised.value
    for exc in (raised.value, MemoryError(), wrapped):
        assert is_out_of_memory(exc)
        with pytest.raises(OutOfMemory) as refused:
            with out_of_memory.explained(loaded, plugins.registry()):
                raise exc
        assert refused.value.exit_code == 2 and refused.value.__cause__ is exc
        assert "estimated per device: weights" in refused.value.message
        assert "attention scores" in refused.value.message
        assert "(blocks)" in refused.value.message
        assert "attention.backend" not in refused.value.hint  # already blockwise
    assert "RESOURCE_EXHAUSTED: Out of memory" in str(out_of_memory.refused(
        raised.value, loaded, plugins.registry()))
    for other in (RuntimeError("shapes do not match"), ValueError("out of memory")):
        assert not is_out_of_memory(other)
        with pytest.raises(type(other)):
            with out_of_memory.explained(loaded, plugins.registry()):
                raise other


# --- validate checks what can be known without weights ------------------------------

@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    from porter_wan.tiny import build_pipeline

    directory = tmp_path_factory.mktemp("saved-wan")
    build_pipeline().save_pretrained(directory)
    return directory


@pytest.mark.parametrize("key, value, message", [
    ("num_layers", -3, "num_layers: -3 is a negative count or size"),
    ("num_attention_heads", "two", "num_attention_heads: 'two' is a string where an "
                                   "integer belongs"),
    ("eps", "small", "eps: 'small' is a string where a number belongs"),
])
def test_nonsense_in_a_checkpoint_config_fails_validate(saved_tiny, tmp_path, key, value,
                                                        message):
    source = tmp_path / "ckpt"
    shutil.copytree(saved_tiny, source)
    config = json.loads((source / "transformer" / "config.json").read_text())
    config[key] = value
    (source / "transformer" / "config.json").write_text(json.dumps(config))
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(source=source, out=tmp_path / "out"))
    done = porter_process("validate", str(path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"transformer/config.json: {message}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_valid_checkpoint_config_has_no_value_problems(saved_tiny):
    from porter.loading import config_values
    from porter_cogvideox.tiny import build_pipeline as cogvideox
    from porter_hunyuan.tiny import build_pipeline as hunyuan

    assert config_values.problems(saved_tiny) == []
    for build in (cogvideox, hunyuan):
        directory = saved_tiny.parent / build.__module__.split(".")[0]
        build().save_pretrained(directory)
        assert config_values.problems(directory) == []


@pytest.mark.parametrize("case", ["config.json not JSON", "model.config num_layers -3"])
def test_run_and_plan_refuse_what_validate_refuses_with_its_message(saved_tiny, tmp_path,
                                                                   case):
    """`run` (and `plan`) check the model's configuration as `validate` does, on one
    code path: they reached an internal error (OSError, TypeError) or ran a model of
    no blocks. Exit 2 with validate's message, before anything is loaded or written."""
    out = tmp_path / "out"
    args = [str(RECIPES / "wan-tiny.yaml"), f"output.dir={out}"]
    if case == "config.json not JSON":
        source = tmp_path / "ckpt"
        shutil.copytree(saved_tiny, source)
        (source / "transformer" / "config.json").write_text("{not json")
        args.append(f"model.source={source}")
        expected = "config.json' is not a valid JSON file"
    else:
        args.append("model.config={num_layers: -3}")
        expected = "model.config.num_layers: -3 is a negative count or size"
    checked = porter_process("validate", *args)
    assert checked.returncode == 2 and expected in checked.stderr, checked.stderr
    message = checked.stderr[checked.stderr.index("error:"):]
    for command in ("run", "plan"):
        done = porter_process(command, *args, *(["--no-progress"] if command == "run"
                                                else []))
        assert done.returncode == 2, done.stderr
        assert done.stderr.endswith(message), done.stderr
        assert "internal error" not in done.stderr and "loading" not in done.stderr
    assert not out.exists()


def test_seed_beyond_torch_range_fails_validate(capsys):
    from porter import cli
    code = cli.main(["validate", str(RECIPES / "wan-tiny.yaml"), f"generate.seed={2**64}"])
    assert code == 2 and "generate.seed" in capsys.readouterr().err
    assert cli.main(["validate", str(RECIPES / "wan-tiny.yaml"),
                     f"generate.seed={2**64 - 1}"]) == 0


def test_sizes_beyond_the_rotary_tables_fail_validate(capsys):
    from porter import cli
    code = cli.main(["validate", str(RECIPES / "wan-tiny.yaml"), "generate.width=1024"])
    err = capsys.readouterr().err
    assert code == 2 and "generate.width: 1024 pixels make 64 positions" in err
    assert "rotary tables hold 32" in err


def test_attention_too_large_for_the_device_fails_validate(capsys, monkeypatch):
    """Wan 1.3B at 480x832, 81 frames, on one 64 GiB device: with every score
    materialised (reference: float32, 96 GiB per layer) it cannot fit; blockwise can."""
    from porter import cli
    from porter.runtime import memory
    monkeypatch.setattr(memory, "device_memory",
                        lambda devices: memory.Limit(64 * 2**30, "the machine's memory"))
    code = cli.main(["validate", str(RECIPES / "wan1.3b.yaml"), "mesh.dp=1", "mesh.tp=1",
                     "attention.backend=reference"])
    err = capsys.readouterr().err
    assert code == 2 and "self-attention scores at this size take 95.95 GiB" in err
    assert "more than the 64.00 GiB a device has" in err and "blockwise" in err
    assert cli.main(["validate", str(RECIPES / "wan1.3b.yaml"), "mesh.dp=1", "mesh.tp=1",
                     "attention.backend=blockwise"]) == 0


BIG_ATTENTION = ("validate", str(RECIPES / "wan-tiny.yaml"), "mesh.dp=1", "mesh.tp=1",
                 "attention.backend=reference", "generate.frames=65",
                 "generate.height=512", "generate.width=512")  # scores x 2: 4.52 GiB


def test_attention_beyond_the_address_space_limit_fails_validate(tmp_path):
    """A process under `ulimit -v` (3 GiB) on a machine with more: validate compares
    with the 3 GiB it may use, and says which limit that is."""
    from porter.runtime import memory

    done = subprocess.run([*address_space_limited(3), "-m", "porter.cli", *BIG_ATTENTION],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "about 4.52 GiB, more than the 3.00 GiB a device has" in done.stderr
    assert "set by the address-space limit RLIMIT_AS, `ulimit -v`" in done.stderr
    if memory.host_limit().bytes > 5 << 30:  # without the limit, the same recipe fits
        assert porter_process(*BIG_ATTENTION).returncode == 0


def test_the_memory_limit_is_the_least_of_machine_cgroup_and_address_space(tmp_path,
                                                                          monkeypatch):
    """This process's own cgroup (from /proc/self/cgroup, below its mount's root) and
    its parents, cgroup v2 and v1; "max" and v1's 2**63 are no limit."""
    from porter.runtime import memory
    monkeypatch.setattr(memory, "physical",
                        lambda: memory.Limit(64 << 30, "the machine's memory"))
    monkeypatch.setattr(memory, "address_space", lambda: [])
    v2, v1 = tmp_path / "unified", tmp_path / "memory"
    (v2 / "job" / "step").mkdir(parents=True)
    (v2 / "job" / "memory.max").write_text("8589934592\n")  # 8 GiB: the parent's
    (v2 / "job" / "step" / "memory.max").write_text("max\n")
    (v1 / "step").mkdir(parents=True)
    (v1 / "step" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    cgroup, mountinfo = tmp_path / "cgroup", tmp_path / "mountinfo"
    cgroup.write_text("4:memory:/outer/step\n1:cpu:/elsewhere\n0::/host/job/step\n")
    mountinfo.write_text(
        f"40 31 0:38 /host {v2} rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
        f"35 31 0:32 /outer {v1} rw,relatime - cgroup cgroup rw,memory\n"
        f"32 31 0:29 / {tmp_path / 'cpu'} rw,relatime - cgroup cgroup rw,cpu\n")
    limit = memory.host_limit(cgroup, mountinfo)
    assert limit == memory.Limit(8 << 30, f"the cgroup limit in {v2 / 'job' / 'memory.max'}")
    (v1 / "step" / "memory.limit_in_bytes").write_text("2147483648\n")  # v1: 2 GiB
    assert memory.host_limit(cgroup, mountinfo).bytes == 2 << 30
    monkeypatch.setattr(memory, "address_space", lambda: [memory.Limit(1 << 30, "as")])
    assert memory.host_limit(cgroup, mountinfo) == memory.Limit(1 << 30, "as")
    assert memory.host_limit(tmp_path / "none", mountinfo).bytes == 1 << 30  # no cgroup file


def test_unwritable_output_and_cache_paths_fail_validate(tmp_path, capsys, monkeypatch):
    """An unwritable output.dir is a problem; an unwritable compile cache, optional in a
    run as well, a warning."""
    from porter import cli
    monkeypatch.delenv("PORTER_CACHE_DIR")  # it would win over runtime.compile_cache
    (tmp_path / "file").write_text("x")
    code = cli.main(["validate", str(RECIPES / "wan-tiny.yaml"),
                     f"output.dir={tmp_path / 'file' / 'out'}"])
    assert code == 2 and "output.dir: cannot write" in capsys.readouterr().err
    code = cli.main(["validate", str(RECIPES / "wan-tiny.yaml"),
                     f"runtime.compile_cache={tmp_path / 'file' / 'cache'}"])
    assert code == 0
    assert "warning: the compile cache cannot be written" in capsys.readouterr().err


# --- the record is enough to reproduce and audit ------------------------------------

def test_the_record_names_source_environment_and_checkpoint(saved_tiny, tmp_path):
    result = run(tiny_recipe(tmp_path, tmp_path / "out", saved_tiny), plugins.registry(),
                 progress=False)
    data = result.data
    assert data["environment"]["XLA_FLAGS"] == os.environ.get("XLA_FLAGS")
    assert data["environment"]["xla_options"]
    if (RECIPES.parent / ".git").exists():
        assert len(data["porter_source"]["commit"]) == 40
    files = data["checkpoint"]["files"]
    weights = saved_tiny / "transformer" / "diffusion_pytorch_model.safetensors"
    with open(weights, "rb") as f:
        header = f.read(int.from_bytes(f.read(8), "little"))
    assert files["transformer/diffusion_pytorch_model.safetensors"]["header_sha256"] == \
        hashlib.sha256(header).hexdigest()
    assert "model_index.json" in files

