"""Multi-process runs on JAX's multi-controller runtime: 2 processes x 4 CPU devices
over loopback (gloo) give the latents and video of 1 process x 8 devices, and
only process 0 writes."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from porter import registry as registry_mod, recipe
from porter.commands.run import run

from support import RECIPES
from support.processes import slow_porter

# Not heavy: two tiny-model processes (under 2 GiB together) run beside the other
# worker's light tests, never beside a real-size run (conftest.py)
pytestmark = pytest.mark.slow

RECIPE = RECIPES / "wan-tiny-tp.yaml"  # dp=2 x tp=4: weights, latents and attention sharded


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_two(*args, recipe=RECIPE) -> list:
    """`porter run RECIPE *args` as processes 0 and 1 of 2, 4 CPU devices each."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return [subprocess.Popen(
        [sys.executable, "-m", "porter.cli", "run", str(recipe), *map(str, args),
         "--cpu-devices", "4", "--coordinator", f"127.0.0.1:{port}",
         "--num-processes", "2", "--process-id", str(i)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for i in range(2)]


def both_done(children: list) -> None:
    """Wait for both processes; each must have succeeded."""
    for child in children:
        _, stderr = child.communicate(timeout=600)
        assert child.returncode == 0, stderr[-3000:]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    out = tmp_path_factory.mktemp("two-processes")
    children = start_two(f"output.dir={out}", "output.frames=npy")
    results = []
    for child in children:
        try:
            stdout, stderr = child.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for c in children:
                c.kill()
            raise
        results.append((child.returncode, stdout, stderr))
    for code, stdout, stderr in results:
        assert code == 0, stderr[-3000:]
    return out, results


def test_two_processes_equal_one_process_with_eight_devices(two_processes, tmp_path):
    out, _ = two_processes
    single = run(recipe.load(RECIPE, [f"output.dir={tmp_path}", "output.frames=npy"]),
                 registry_mod.loaded(), progress=False)
    assert single.data["mesh"] == {"dp": 2, "tp": 4}
    latents = load_file(str(out / "denoise.safetensors"))["latents"]
    # Same program and partitioning; gloo's all-reduce sums the tensor-parallel
    # partial results in another order than the in-process one, so the latents
    # agree to float32 rounding, not bit for bit (measured: 2.5e-6 max abs error,
    # identical frames).
    error = (latents - single.latents).abs().max().item()
    print(f"2x4 vs 1x8: latents max abs error {error:.2e}")
    assert error <= 1e-5 * single.latents.abs().max().item(), error
    import av
    import numpy as np
    with av.open(str(out / "video.mp4")) as a, av.open(str(single.video)) as b:
        assert len(list(a.decode(video=0))) == len(list(b.decode(video=0)))
    # decoded from nearly equal latents: at most one step of 8-bit rounding. The frames
    # as written losslessly: H.264 turns a pixel one level off into blocks coded
    # otherwise (the mp4s' frames were 9 levels apart where these are 1)
    frames = np.load(out / "frames.npy").astype(int)
    expected = np.load(Path(single.video).parent / "frames.npy").astype(int)
    worst = int(np.abs(frames - expected).max())
    print(f"2x4 vs 1x8: frames max difference {worst} of 255")
    assert frames.shape == expected.shape and worst <= 1, worst


def test_only_process_zero_writes_and_each_process_says_who_it_is(two_processes):
    out, ((_, stdout0, stderr0), (_, stdout1, stderr1)) = two_processes
    assert sorted(p.name for p in out.iterdir()) == [
        ".porter.lock", "denoise.json", "denoise.safetensors", "encode.json", "encode.safetensors",
        "frames.npy", "run.json", "stream.mp4", "video.mp4"]
    assert "[process 0/2]" in stderr0 and "[process 1/2]" in stderr1
    assert "8 cpu device(s)" in stderr0.lower() and "2 processes" in stderr0
    assert "wrote" in stdout0 and "process 0 wrote the outputs" in stdout1
    import json
    record = json.loads((out / "run.json").read_text())
    assert record["device"]["count"] == 8 and record["device"]["processes"] == 2
    assert {s["stage"]: (s["devices"], s["processes"]) for s in record["history"]} == {
        "encode": (8, 2), "denoise": (8, 2), "decode": (8, 2)}


def test_each_process_reads_only_the_rows_its_devices_hold(tmp_path):
    """tp=8 over 2 processes x 4 devices, from a saved checkpoint: a weight split by
    rows over tp has half its rows on each process's devices, and each process
    reads only those from the files; the latents are those of one process."""
    import json

    from porter_wan.tiny import build_pipeline

    build_pipeline().save_pretrained(tmp_path / "ckpt")
    overrides = [f"model.source={tmp_path / 'ckpt'}", "mesh={dp: 1, tp: 8}",
                 "generate.cfg_parallel=false", "generate.steps=2"]
    out = tmp_path / "two"
    both_done(start_two(*overrides, f"output.dir={out}", "--no-progress"))
    transformer = json.loads((out / "run.json").read_text())["weights"]["components"][
        "transformer"]
    assert transformer["from"] == "checkpoint"
    assert transformer["bytes_per_device"] == transformer["planned_bytes_per_device"]
    # tensors split by rows over tp (q/k/v, the first FFN layer): process 0 reads the
    # half its 4 devices hold; every other stored tensor whole
    from porter.port import estimates

    from models.real_size import weight_bytes

    built = estimates.build(recipe.load(RECIPE, overrides), registry_mod.loaded(), devices=8)
    rules = next(c for c in built["components"] if c["component"] == "transformer")["rules"]
    by_rows = sum(r["bytes"] for r in rules if r["rule"] and r["spec"][0] == "tp")
    stored = weight_bytes(tmp_path / "ckpt" / "transformer")
    assert transformer["read_bytes"] == stored - by_rows // 2
    single = run(recipe.load(RECIPE, [*overrides, f"output.dir={tmp_path / 'one'}"]),
                 registry_mod.loaded(), progress=False)
    assert single.data["weights"]["components"]["transformer"]["read_bytes"] == stored
    latents = load_file(str(out / "denoise.safetensors"))["latents"]
    assert (latents - single.latents).abs().max() <= 1e-5 * single.latents.abs().max()


def test_tokens_split_over_both_processes_equal_one_process(tmp_path):
    """sp=8 over 2 processes x 4 devices: every block's tokens are split across both
    processes, so the exchanges around attention cross them (gloo); the latents are
    those of one process with 8 devices."""
    sp = RECIPES / "wan-tiny-sp.yaml"
    overrides = ["mesh={dp: 1, sp: 8}", "generate.steps=2"]
    out = tmp_path / "two"
    both_done(start_two(*overrides, f"output.dir={out}", "--no-progress", recipe=sp))
    single = run(recipe.load(sp, [*overrides, f"output.dir={tmp_path / 'one'}"]),
                 registry_mod.loaded(), progress=False)
    assert single.data["mesh"] == {"dp": 1, "sp": 8}
    latents = load_file(str(out / "denoise.safetensors"))["latents"]
    assert (latents - single.latents).abs().max() <= 1e-5 * single.latents.abs().max()


def test_incomplete_multi_process_settings_are_refused(capsys, monkeypatch):
    from porter.cli import main
    monkeypatch.setenv("JAX_NUM_PROCESSES", "")  # restored after the test
    code = main(["run", str(RECIPE), "--num-processes", "2"])
    assert code == 2
    err = capsys.readouterr().err
    assert "JAX_COORDINATOR_ADDRESS" in err and "--coordinator" in err


SLOW_PORTER = slow_porter("FlowMatchEulerDiscreteScheduler")


def test_a_signal_to_one_process_stops_all_at_the_same_step(tmp_path):
    """SIGTERM to process 1 alone: both stop after the same step (no process left
    waiting in a collective), process 0 saves it, and both exit 143."""
    import signal
    import time

    out, port = tmp_path / "out", free_port()
    children = [subprocess.Popen(
        [sys.executable, "-c", SLOW_PORTER, "run", str(RECIPE), f"output.dir={out}",
         "generate.steps=8", "output.checkpoint_every=2", "--cpu-devices", "4",
         "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id",
         str(i), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        deadline = time.monotonic() + 300
        while not (out / "progress-000002.json").exists():
            assert all(c.poll() is None for c in children), children[0].communicate()
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
        children[1].send_signal(signal.SIGTERM)
        results = [c.communicate(timeout=120) for c in children]
    finally:
        for child in children:
            child.kill()
    assert [c.returncode for c in children] == [143, 143], results[0][1][-2000:]
    saved = sorted(p.name for p in out.glob("progress-*.json"))
    assert len(saved) == 1 and saved != ["progress-000008.json"], saved
    assert not (out / "denoise.json").exists()


def test_a_batch_is_split_between_replica_sets(tmp_path):
    """Two processes x 4 devices and a dp=2 x tp=4 mesh: each process holds a whole
    replica set, so each runs its share of the items alone on its own 4 devices
    (items 1 and 3 on process 0, item 2 on process 1) and writes them itself."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red fox\na blue bird\na green frog\n")
    out = tmp_path / "out"
    both_done(start_two("--prompts", prompts, f"output.dir={out}", "--no-progress"))
    import json
    shares = [json.loads((out / f"batch-{i}.json").read_text()) for i in range(2)]
    assert [[item["name"] for item in share["items"]] for share in shares] == \
        [["0001", "0003"], ["0002"]]
    assert all(item["status"] == "done" for share in shares for item in share["items"])
    second = json.loads((out / "0002" / "run.json").read_text())
    assert second["mesh"] == {"dp": 1, "tp": 4} and second["device"]["count"] == 4
    # the item is what one process makes with that prompt on a dp=1 x tp=4 mesh
    single = run(recipe.load(RECIPE, [f"output.dir={tmp_path / 'single'}", "mesh.dp=1",
                                      "generate.prompt=a blue bird"]),
                 registry_mod.loaded(), progress=False)
    latents = load_file(str(out / "0002" / "denoise.safetensors"))["latents"]
    error = (latents - single.latents).abs().max().item()
    assert error <= 1e-5 * single.latents.abs().max().item(), error
