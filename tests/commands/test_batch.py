"""porter run --prompts: one load and compile for many videos, run as a user runs it."""

import json
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from porter.commands.batch import read_items

from support import ROOT, TINY_RECIPE
from support.processes import FULL_DISK

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
                     '{"prompt": "y", "name": "../up"}\n{"prompt": "z", "name": "fox"}\n'
                     '{"prompt": "w", "seed": 1, "seed": 2}\n')
    items = read_items(lines)
    assert items[0].name == "fox" and items[0].settings == {"prompt": "x", "seed": 2}
    assert "expected an object" in items[1].problem and "not JSON" in items[2].problem
    assert "not a folder name" in items[3].problem
    assert "used by an earlier item" in items[4].problem
    # JSON keeps the last of a key given twice: refused, as recipes refuse it
    assert items[5].problem.startswith("names 'seed' twice")


def test_an_item_folder_belongs_to_its_batch_until_the_batch_ends(tmp_path):
    """While a batch runs, its finished items' folders are its own: a run into one is
    refused (it would replace a video batch.json describes), and so is a second batch
    into the folder, told the batch is running. A record changed behind the batch's
    back anyway is said so in its summary."""
    from porter.commands import batch as batch_mod

    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_RECIPE)
    out = tmp_path / "batch"
    (out / "0001").mkdir(parents=True)
    record = out / "0001" / "run.json"
    record.write_text('{"made": "by the batch"}')
    (out / "batch.json").write_text("{}")
    holding = subprocess.Popen(  # the running batch: it holds its folder until told
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from porter.commands.batch import HOLDER; from porter.rundir import outputs; "
         "held = outputs.owned(Path(sys.argv[1]), HOLDER); held.__enter__(); "
         "print('held', flush=True); sys.stdin.read()", str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holding.stdout.readline().strip() == "held"
        into_item = porter_cli("run", recipe, f"output.dir={out / '0001'}", "--no-progress")
        assert into_item.returncode == 2, into_item.stderr
        assert f"{out / '0001'} is inside {out}, in use by porter run --prompts (a " \
            f"batch), pid {holding.pid} on" in into_item.stderr
        assert record.read_text() == '{"made": "by the batch"}'
        # deeper too: a folder anywhere inside a held one (a server's jobs/<id>)
        deeper = porter_cli("run", recipe, f"output.dir={out / 'jobs' / '000001'}",
                            "--no-progress")
        assert deeper.returncode == 2 and f"is inside {out}, in use by" in deeper.stderr
        prompts = tmp_path / "p.txt"
        prompts.write_text("a cat\n")
        second = porter_cli("run", recipe, "--prompts", prompts, f"output.dir={out}",
                            "--no-progress")
        assert second.returncode == 2, second.stderr
        assert f"{out} holds a batch that is still running: porter run --prompts (a " \
            f"batch), pid {holding.pid}" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        holding.kill()
        holding.wait()
    item = batch_mod.Item(1, 1, "0001", {"prompt": "a cat"}, status="done",
                          record_digest=batch_mod._record_digest(out / "0001"))
    batch_mod._still_ours([item], out)
    assert item.status == "done"
    record.write_text('{"made": "by someone else"}')
    batch_mod._still_ours([item], out)
    assert item.status == "replaced" and "changed after the batch made it" in item.error


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
    # the first item compiles the text encoder, transformer and VAE (its streamed decode's
    # three programs; and the eager ops); the later ones have its shapes: no component is
    # traced again. A prompt of another token length builds a few small eager programs;
    # the same prompt none.
    traced = [c["traces_saved"] + c["traces_loaded"] for c in compiled]
    assert compiled[0]["programs"] > 20 and traced[0] == 5
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

    # the third item lost its video (its record kept: a record alone is no finished run);
    # the prompts file is fixed; --resume skips the done item and runs only what is missing
    (out / "0003" / "video.mp4").unlink()
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
    prompts.write_text('{"prompt": "x", "image": "missing.png"}\n'
                       '{"prompt": "y", "stepz": 2}\n')
    done = porter_cli("run", recipe, "--prompts", prompts, f"output.dir={tmp_path / 'o'}")
    assert done.returncode == 2 and "no item can run" in done.stderr
    # every line's problem, with its hint, not the first alone
    assert "line 1: generate.image" in done.stderr
    assert "line 2: generate.stepz: unknown key 'stepz' (did you mean 'steps'?)" in \
        done.stderr
    assert "loading" not in done.stderr and "Traceback" not in done.stderr


def test_when_a_batch_can_be_split_between_replica_sets():
    from porter.commands.batch import replica_mesh

    # 2 processes x 4 devices: dp=2 x tp=4 splits into one replica set each
    assert replica_mesh({"dp": 2, "tp": 4}, 2, 4, 8) == {"dp": 1, "tp": 4}
    assert replica_mesh({"dp": "auto", "tp": 2}, 2, 4, 8) == {"dp": 2, "tp": 2}
    assert replica_mesh({"dp": 1, "tp": 8}, 2, 4, 8) is None  # a replica spans processes
    assert replica_mesh({"dp": 3, "tp": 1}, 2, 4, 8) is None  # dp does not divide
    assert replica_mesh({"tp": 8}, 2, 4, 8) is None  # no dp axis
    assert replica_mesh({"dp": 2, "tp": 4}, 1, 8, 8) is None  # one process


def test_item_names_porter_writes_itself_are_refused(tmp_path):
    """An item's folder named like a file Porter keeps in output.dir would take its
    place (an item named batch.json made the summary unwritable and lost the batch)."""
    lines = tmp_path / "p.jsonl"
    own = ["batch.json", "batch-1.json", "Run.json", "video.mp4", "frames", "jobs",
           "encode.safetensors", "denoise.json", "progress-000002.json",
           "latents.safetensors", "mag_ratios.json"]
    lines.write_text("".join(json.dumps({"prompt": "x", "name": name}) + "\n"
                             for name in own + ["batch-of-foxes", "runs.json"]))
    items = read_items(lines)
    for item in items[:len(own)]:
        assert "is a file Porter writes in output.dir itself" in item.problem, item.name
    assert [item.name for item in items[len(own):] if not item.problem] == \
        ["batch-of-foxes", "runs.json"]


def test_a_reserved_item_name_is_refused_and_an_earlier_batch_is_kept(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_RECIPE)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "fox", "name": "batch.json"}\n'
                       '{"prompt": "bird", "name": "bird"}\n')
    out = tmp_path / "batch"
    done = porter_cli("run", recipe, "--prompts", prompts, f"output.dir={out}",
                      "--no-progress", "generate.steps=1")
    assert done.returncode == 2 and "1 failed, 1 done" in done.stdout, done.stderr
    assert f"{prompts}:1: item 0001 cannot run: name 'batch.json' is a file Porter " \
        "writes" in done.stderr
    summary = json.loads((out / "batch.json").read_text())
    assert [i["status"] for i in summary["items"]] == ["failed", "done"]
    kept = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}

    # another batch into the same folder (fewer items) would replace 'bird' and leave
    # items it does not list: refused before anything is read or written
    prompts.write_text("a cat\n")
    again = porter_cli("run", recipe, "--prompts", prompts, f"output.dir={out}",
                       "--no-progress", "generate.steps=1")
    assert again.returncode == 2, again.stderr
    assert f"{out} holds an earlier batch (batch.json)" in again.stderr
    assert f"--resume {out}" in again.stderr and "choose another output.dir" in again.stderr
    assert "Traceback" not in again.stderr
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == kept


PROMPTS_GUARD = """\
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from porter.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("target", ["/dev/zero", "FIFO", "BIG", "DIR"])
def test_endless_or_huge_prompt_files_are_refused_in_a_guarded_process(tmp_path, target):
    """A prompts file is read under a recipe's bounds: /dev/zero read until a
    MemoryError, a FIFO blocked. A child with a memory cap and a timeout, so a
    regression fails instead of eating the machine."""
    import os

    from porter.commands.batch import MAX_PROMPTS_BYTES

    reason = {"/dev/zero": "is not a regular file (a device, pipe or socket)",
              "FIFO": "is not a regular file", "DIR": "is a directory",
              "BIG": f"is {MAX_PROMPTS_BYTES + 1} bytes; a prompts file is at most "
                     f"{MAX_PROMPTS_BYTES}"}[target]
    if target == "FIFO":
        os.mkfifo(tmp_path / "fifo")
        target = tmp_path / "fifo"
    elif target == "BIG":
        target = tmp_path / "big.txt"
        target.write_text("a cat\n")
        os.truncate(target, MAX_PROMPTS_BYTES + 1)  # sparse: its size is what is refused
    elif target == "DIR":
        target = tmp_path
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_RECIPE)
    done = subprocess.run([sys.executable, "-c", PROMPTS_GUARD, "run", str(recipe),
                           "--prompts", str(target), f"output.dir={tmp_path / 'out'}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"--prompts {target}: {reason}" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_an_item_on_a_full_disk_fails_naming_the_file_and_the_batch_goes_on(tmp_path):
    """A full disk is the machine's refusal, not "an internal error (a Porter bug)"."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_RECIPE)
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red fox\na blue bird\n")
    out = tmp_path / "batch"
    done = subprocess.run([sys.executable, "-c", FULL_DISK, "0001/.run.json", "run",
                           str(recipe), "--prompts", str(prompts), f"output.dir={out}",
                           "--no-progress", "generate.steps=1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 2 and "1 failed, 1 done" in done.stdout, done.stderr
    written = out / "0001" / "run.json"
    assert f"item 0001 failed: No space left on device writing {written}" in done.stderr
    assert "Porter bug" not in done.stderr and "internal error" not in done.stderr
    failed = json.loads((out / "batch.json").read_text())["items"][0]
    assert "the disk is full" in failed["error"]


def test_resume_makes_again_the_items_made_with_a_replaced_adapter(tmp_path):
    """`--resume` skips finished items only when they were made from the same files:
    an adapter replaced since (same name, other weights) makes every item again, and
    each run.json names the new file's SHA-256."""
    import hashlib

    from support.lora import make_lora

    adapter = make_lora(tmp_path, seed=1)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY_RECIPE + f"lora: [{{file: {adapter.name}}}]\n")
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red fox\na blue bird\n")
    out = tmp_path / "batch"
    first = porter_cli("run", recipe, "--prompts", prompts, f"output.dir={out}",
                       "--no-progress", "generate.steps=1")
    assert first.returncode == 0, first.stderr
    make_lora(tmp_path, seed=2)  # other weights, same file
    again = porter_cli("run", recipe, "--prompts", prompts, "--resume", out,
                       "--no-progress", "generate.steps=1")
    assert again.returncode == 0, again.stderr
    summary = json.loads((out / "batch.json").read_text())
    assert [i["status"] for i in summary["items"]] == ["done", "done"]
    digest = hashlib.sha256(adapter.read_bytes()).hexdigest()
    for name in ("0001", "0002"):
        [used] = json.loads((out / name / "run.json").read_text())["checkpoint"]["lora"]
        assert used["sha256"] == digest
