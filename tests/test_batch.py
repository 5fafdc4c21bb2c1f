"""porter run --prompts: one load and compile for many videos, run as a user runs it."""

import json
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from porter.batch import read_items

from conftest import ROOT, TINY_RECIPE

pytestmark = pytest.mark.slow


def porter_cli(*args):
    """The CLI in a fresh process (nothing imported beforehand)."""
    return subprocess.run([sys.executable, "-m", "porter.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)


def test_reading_prompt_files(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("a red fox\n\n# a comment\n  a blue bird  \n")
    assert [(i.line, i.name, i.settings) for i in read_items(text)] == [
        (1, "0001", {"prompt": "a red fox"}), (4, "0002", {"prompt": "a blue bird"})]
    lines = tmp_path / "p.jsonl"
    lines.write_text('{"prompt": "x", "seed": 2, "name": "fox"}\n[1]\nnot json\n'
                     '{"prompt": "y", "name": "../up"}\n{"prompt": "z", "name": "fox"}\n')
    items = read_items(lines)
    assert items[0].name == "fox" and items[0].settings == {"prompt": "x", "seed": 2}
    assert "expected an object" in items[1].problem and "not JSON" in items[2].problem
    assert "not a folder name" in items[3].problem
    assert "used by an earlier item" in items[4].problem


def test_batch_writes_each_item_like_a_run_and_compiles_once(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_RECIPE)
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red fox\na blue bird\na red fox\n")
    out = tmp_path / "batch"
    done = porter_cli("run", recipe, "--prompts", prompts, f"output.dir={out}",
                      "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "batch of 3: 3 done" in done.stdout
    summary = json.loads((out / "batch.json").read_text())
    assert [i["status"] for i in summary["items"]] == ["done", "done", "done"]
    compiled = [json.loads((out / name / "run.json").read_text())["timings"]["compile"]
                for name in ("0001", "0002", "0003")]
    # the first item compiles the text encoder, transformer and VAE (and the eager ops);
    # the later ones have its shapes: no component is traced again. A prompt of another
    # token length builds a few small eager programs; the same prompt none.
    traced = [c["traces_saved"] + c["traces_loaded"] for c in compiled]
    assert compiled[0]["programs"] > 20 and traced[0] == 3
    assert traced[1] == 0 and compiled[1]["programs"] < 10
    assert compiled[2]["programs"] == 0 and compiled[2]["seconds"] == 0
    for item, prompt in zip(summary["items"], ("a red fox", "a blue bird")):
        record = json.loads((out / item["name"] / "run.json").read_text())
        assert record["recipe"]["generate"]["prompt"] == prompt
        assert (out / item["name"] / "video.mp4").stat().st_size > 0
    # an item is the run `porter run` makes with that prompt
    single = tmp_path / "single"
    alone = porter_cli("run", recipe, "generate.prompt=a blue bird", f"output.dir={single}",
                       "--no-progress")
    assert alone.returncode == 0, alone.stderr
    assert (load_file(single / "denoise.safetensors")["latents"]
            == load_file(out / "0002" / "denoise.safetensors")["latents"]).all()


def test_failed_items_are_reported_and_resume_finishes_the_rest(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_RECIPE)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "fox", "seed": 1, "name": "fox"}\n'
                       '{"prompt": "bird", "frames": 10}\n'
                       '{"prompt": "cat", "steps": 4}\n')
    out = tmp_path / "batch"
    done = porter_cli("run", recipe, "--prompts", prompts, f"output.dir={out}",
                      "--no-progress")
    assert done.returncode == 2 and "1 failed" in done.stdout, done.stderr
    assert f"{prompts}:2: item 0002 cannot run: generate.frames" in done.stderr
    summary = json.loads((out / "batch.json").read_text())
    assert [i["status"] for i in summary["items"]] == ["done", "failed", "done"]
    assert "4n+1" in summary["items"][1]["error"]

    # the third item lost its decode and record, as if the batch were stopped there;
    # the prompts file is fixed; --resume skips the done item and runs only what is missing
    for name in ("run.json", "video.mp4"):
        (out / "0003" / name).unlink()
    prompts.write_text(prompts.read_text().replace('"frames": 10', '"frames": 13'))
    again = porter_cli("run", recipe, "--prompts", prompts, "--resume", out,
                       "--no-progress")
    assert again.returncode == 0, again.stderr
    summary = json.loads((out / "batch.json").read_text())
    assert [i["status"] for i in summary["items"]] == ["skipped", "done", "done"]
    third = json.loads((out / "0003" / "run.json").read_text())
    assert third["timings"]["stages"] == ["decode"]
    assert json.loads((out / "0002" / "run.json").read_text())["outputs"]["frames"] == 13


def test_a_file_with_no_runnable_item_stops_before_loading(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_RECIPE)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x", "image": "missing.png"}\n')
    done = porter_cli("run", recipe, "--prompts", prompts, f"output.dir={tmp_path / 'o'}")
    assert done.returncode == 2 and "no item can run" in done.stderr
    assert "loading" not in done.stderr and "Traceback" not in done.stderr


def test_when_a_batch_can_be_split_between_replica_sets():
    from porter.batch import replica_mesh

    # 2 processes x 4 devices: dp=2 x tp=4 splits into one replica set each
    assert replica_mesh({"dp": 2, "tp": 4}, 2, 4, 8) == {"dp": 1, "tp": 4}
    assert replica_mesh({"dp": "auto", "tp": 2}, 2, 4, 8) == {"dp": 2, "tp": 2}
    assert replica_mesh({"dp": 1, "tp": 8}, 2, 4, 8) is None  # a replica spans processes
    assert replica_mesh({"dp": 3, "tp": 1}, 2, 4, 8) is None  # dp does not divide
    assert replica_mesh({"tp": 8}, 2, 4, 8) is None  # no dp axis
    assert replica_mesh({"dp": 2, "tp": 4}, 1, 8, 8) is None  # one process
