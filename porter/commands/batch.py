"""``porter run R --prompts FILE``: many videos from one load and compile.

FILE is a text file (one prompt a line; blank lines and lines starting with
``#`` are skipped) or JSON Lines (``.jsonl``; one object a line with any
``generate`` settings, and an optional ``name`` for the item's folder). Each
item runs on the same ``Port`` and writes to its own folder of ``output.dir``,
exactly as ``porter run`` writes a run directory; ``batch.json`` beside them
says how each item went. A failed item is reported and the batch goes on;
``--resume`` skips finished items and continues an interrupted one from its
last stage or denoising checkpoint. Without it, a folder already holding a batch
is refused (its items would be replaced without a word), and so is an item named
like a file Porter writes there itself. The prompts file is read under a recipe's
bounds (``yamlio.read_text``).
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from porter import api
from porter import recipe as recipe_mod
from porter.errors import Interrupted, RecipeError, UsageError, failure
from porter.generate import runners
from porter.generate.call import Call
from porter.port import checks
from porter.recipe import jsonio, yamlio
from porter.rundir import artifacts, outputs, progress, record, results
from porter.rundir.lifecycle import resume_problem
from porter.runtime import atomic, distributed, mesh_text, notices

if TYPE_CHECKING:
    from porter.families.base import ModelFamily
    from porter.recipe import Recipe
    from porter.registry import Registry

SUMMARY = "batch.json"
#: a prompts file's bytes: tens of thousands of prompts, not an endless stream
MAX_PROMPTS_BYTES = 64 * 2**20
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_SUMMARIES = re.compile(r"^batch(-\d+)?\.json$")  # batch.json; batch-K.json per process
HINT = "one prompt a line, or JSON Lines (.jsonl)"
#: what a batch's locks say holds its folder, and an item's
HOLDER = "porter run --prompts (a batch)"
ITEM_HOLDER = "porter run --prompts (an item of a batch)"


@dataclass
class Item:
    index: int  # 1-based, in file order
    line: int
    name: str  # the item's folder in output.dir
    settings: dict
    recipe: object = None  # the batch's recipe with these settings, once checked
    problem: str | None = None  # why it cannot run (found before loading)
    #: pending, done, failed, skipped (done before --resume), replaced (its folder
    #: changed after it was done)
    status: str = "pending"
    error: str | None = None
    seconds: float | None = None
    compile_s: float | None = None
    record_digest: str | None = None  # its run.json as the batch wrote it

    def summary(self) -> dict:
        return {"name": self.name, "line": self.line,
                "prompt": self.settings.get("prompt"), "status": self.status,
                "error": self.error or self.problem, "seconds": self.seconds,
                "compile_s": self.compile_s}


def read_items(path: Path) -> list[Item]:
    """The items of a prompts file, in order; lines that cannot be items carry a
    ``problem`` (the batch reports them and runs the rest)."""
    path = Path(path)
    text = _prompts_text(path)
    lines = [(number, raw.strip()) for number, raw in enumerate(text.splitlines(), 1)]
    lines = [(n, s) for n, s in lines if s and not s.startswith("#")]
    if not lines:
        raise UsageError(f"--prompts {path}: no prompts in it", hint=HINT)
    as_json = path.suffix.lower() in (".jsonl", ".ndjson") or \
        (path.suffix.lower() != ".txt" and lines[0][1].startswith("{"))
    items, names = [], set()
    for index, (number, content) in enumerate(lines, 1):
        item = Item(index, number, f"{index:04d}", {})
        if as_json:
            _json_item(item, content)
        else:
            item.settings = {"prompt": content}
        if item.name in names:
            item.problem = item.problem or f"name {item.name!r} is used by an earlier item"
        names.add(item.name)
        items.append(item)
    return items


def _prompts_text(path: Path) -> str:
    """The file's text, under a recipe's bounds (a regular file of at most
    ``yamlio.MAX_BYTES``, UTF-8): /dev/zero or a FIFO is refused before it is read."""

    try:
        return yamlio.read_text(path, what="prompts file", limit=MAX_PROMPTS_BYTES)
    except RecipeError as exc:
        reason = exc.problems[0].message
        raise UsageError(f"--prompts {path}: {reason}", hint=HINT) from None


def porter_name(name: str) -> bool:
    """Is ``name`` one Porter writes in an output directory itself (a run's files,
    stage and progress files, batch summaries, `porter serve`'s jobs folder,
    `porter calibrate`'s ratios)? An item's folder of that name would take its place:
    an item named batch.json made the summary unwritable. Compared ignoring case, as
    some filesystems do."""

    name = name.lower()
    own = {outputs.RECORD, outputs.VIDEO, outputs.FRAMES_DIR, outputs.FRAMES_NPY,
           outputs.LATENTS, outputs.LOCK, "jobs", "mag_ratios.json"}
    own |= {f"{stage}.{suffix}" for stage in artifacts.STAGES
            for suffix in ("json", "safetensors")}
    return name in own or bool(_SUMMARIES.match(name)) or \
        name.startswith(f"{progress.PROGRESS}-")


def _json_item(item: Item, content: str) -> None:
    try:
        data = jsonio.loads(content)
    except jsonio.DuplicateKey as exc:
        item.problem = (f"names {exc.key!r} twice (give each setting once: JSON would "
                        "keep the last silently)")
        return
    except ValueError as exc:
        item.problem = f"not JSON: {exc}"
        return
    if not isinstance(data, dict):
        item.problem = f"expected an object of generate settings, got {type(data).__name__}"
        return
    name = data.pop("name", None)
    if name is not None:
        if not isinstance(name, str) or not _NAME.match(name):
            item.problem = (f"name {name!r} is not a folder name (letters, digits, '.', "
                            "'_', '-'; at most 100)")
        elif porter_name(name):
            item.problem = (f"name {name!r} is a file Porter writes in output.dir itself "
                            "(batch.json, run.json, stage and progress files, ...): "
                            "choose another name")
        else:
            item.name = name
    item.settings = data


#: the bad items a batch of nothing but bad items names, each on its line
SHOWN = 10


def check_items(items: list[Item], recipe: Recipe, registry: Registry, path: Path) -> None:
    """Each item's recipe, checked without weights; a bad item gets its problem."""
    for item in items:
        if item.problem:
            continue
        try:
            item.recipe = checks.with_settings(recipe, registry, item.settings,
                                               str(path), item.line)
        except RecipeError as exc:
            item.problem = "; ".join(f"{p.path}: {p.message}"
                                     + (f" ({p.hint})" if p.hint else "")
                                     for p in exc.problems)


def run_batch(recipe: Recipe, registry: Registry, prompts: Path, progress: bool = True,
              resume: bool = False) -> dict:
    """Run every item of ``prompts`` on one port; returns the batch summary."""

    family = checks.checked_family(recipe, registry)
    say = notices.status if progress else notices.quiet
    directory = outputs.output_dir(recipe)
    resume_problem(directory, resume)
    if not resume:
        _earlier_batch_problem(directory)
    items = read_items(prompts)
    distributed.initialize()
    summary_name, share = SUMMARY, None
    if distributed.process_count() > 1:
        recipe, share, summary_name = _split(recipe, say)
    # every item is checked on every process, so all of them agree on what can run
    check_items(items, recipe, registry, prompts)
    bad = [item for item in items if item.problem]
    if len(bad) == len(items):
        shown = bad[:SHOWN]  # each line's problem, as a recipe's are all said at once
        raise UsageError(f"--prompts {prompts}: no item can run:" + "".join(
            f"\n  line {item.line}: {item.problem}" for item in shown)
            + (f"\n  (and {len(bad) - len(shown)} more)" if len(bad) > len(shown) else ""))
    if share is not None:
        items = [item for item in items if share(item)]
        bad = [item for item in bad if share(item)]
    for item in bad:
        item.status = "failed"
        _report(f"{prompts}:{item.line}: item {item.name} cannot run: {item.problem}")
    batch = Batch(recipe, prompts, directory, items, resume, say=say, summary=summary_name,
                  progress=progress and distributed.writes())
    with contextlib.ExitStack() as owner:
        if distributed.writes() and not distributed.alone():  # alone: items are owned
            owner.enter_context(outputs.owned(directory, HOLDER))
        return _owned_batch(batch, family, registry)


def _earlier_batch_problem(directory: Path) -> None:
    """A new batch into a directory holding another batch would replace its items
    without a word and leave the ones it does not list: refuse it."""
    found = sorted(path.name for path in directory.glob("batch*.json")
                   if _SUMMARIES.match(path.name)) if directory.is_dir() else []
    running = outputs.holder(directory)
    if running is not None:
        what = "holds a batch that is still running" if running.startswith(HOLDER) \
            else "is in use by"
        raise outputs.Busy(f"{directory} {what}: {running}",
                           hint="wait for it to finish, or choose another output.dir")
    if found:
        raise UsageError(f"{directory} holds an earlier batch ({found[0]}); a new batch "
                         "there would replace its items",
                         hint=f"continue it with --resume {directory} (finished items are "
                              f"kept), or start over: delete {directory}, or choose "
                              "another output.dir")


def replica_mesh(mesh: dict, processes: int, local: int, total: int) -> dict | None:
    """The mesh each process uses on its own devices when a batch can be split between
    data-parallel replicas: ``dp`` divides among the processes and one process's share
    of replicas fits its own devices. None: the batch runs on the whole mesh."""
    others = {axis: size for axis, size in mesh.items() if axis != "dp"}
    if processes < 2 or "dp" not in mesh or "auto" in others.values():
        return None
    rest = math.prod(others.values())
    dp = total // rest if mesh["dp"] == "auto" else mesh["dp"]
    if dp % processes or rest * (dp // processes) > local:
        return None
    return {**mesh, "dp": dp // processes}


def _split(recipe: Recipe, say):
    """With several processes, each takes every P-th item and runs it on its own
    devices, when the mesh allows (``replica_mesh``); else every process runs every
    item on the whole mesh, one after another. Returns (recipe, which items are this
    process's (None: all), summary file name)."""
    import jax

    count, index = jax.process_count(), jax.process_index()
    mesh = replica_mesh(dict(recipe.mesh), count, jax.local_device_count(),
                        jax.device_count())
    if mesh is None:
        say("the mesh spans the processes: every item runs on the whole mesh")
        return recipe, None, SUMMARY
    distributed.work_alone()
    say(f"split between {count} replica sets: this process runs items {index + 1}, "
        f"{index + 1 + count}, ... on its own devices, mesh {mesh_text(mesh)}")
    recipe = recipe_mod.with_values(recipe, "mesh", mesh, "--prompts (split between "
                                    "processes)")
    return recipe, lambda item: (item.index - 1) % count == index, f"batch-{index}.json"


@dataclass
class Batch:
    """One batch: its recipe, its items and where they go, how it reports."""

    recipe: object
    prompts: Path  # the --prompts file
    directory: Path  # the batch's folder: an item's in it, batch.json beside them
    items: list  # [Item]
    resume: bool = False  # items done before are kept
    progress: bool = False  # a progress bar on stderr
    say: Callable = notices.quiet  # status lines
    summary: str = SUMMARY  # this process's summary file


def _owned_batch(batch: Batch, family: ModelFamily, registry: Registry) -> dict:
    started = time.perf_counter()
    if not batch.items:  # more processes than items: this one has none
        return {"summary": batch.summary, "counts": {}, "items": [],
                "timings": {"total_s": 0.0}}
    port = api.Port.open(batch.recipe, registry, family, batch.say)
    if batch.resume:  # an item is done if made from the files this port loaded
        _skip_finished(batch, port)
    summary = _Summary(batch.directory / batch.summary, batch.prompts, port, started)
    summary.write(batch.items)  # from now on the directory says it holds a batch
    with _Bar(batch) as bar:
        for item in [item for item in batch.items if item.status == "pending"]:
            try:
                _run_item(port, item, batch, bar.following(item.name))
            except Interrupted:
                item.status, item.error = "interrupted", "stopped by a signal"
                summary.write(batch.items)
                raise
            except Exception as exc:  # one item failed: say why, go on
                problem = failure(exc)
                item.status, item.error = "failed", problem.render()
                _report(f"item {item.name} failed: {problem.message}")
            bar.update()
            summary.write(batch.items)
    return summary.write(batch.items)


def _skip_finished(batch: Batch, port) -> None:
    for item in batch.items:
        if not item.problem and results.finished(batch.directory / item.name, item.recipe,
                                                 lambda: port.inputs) is not None:
            item.status = "skipped"
    done = sum(item.status == "skipped" for item in batch.items)
    batch.say(f"resuming in {batch.directory}: {done} of {len(batch.items)} items "
              "already done")


class _Bar:
    """The batch's progress bar: videos done, the item under way and its step."""

    def __init__(self, batch: Batch):
        todo = sum(item.status == "pending" for item in batch.items)
        self.bar = notices.progress_bar(len(batch.items), len(batch.items) - todo, "batch",
                                        "video", batch.progress)

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def following(self, name: str):
        """``on_step`` for the item ``name``: its step in the bar."""
        self.bar.set_postfix_str(name)

        def on_step(done, total):
            self.bar.set_postfix_str(f"{name}: step {done}/{total}")
        return on_step

    def update(self) -> None:
        self.bar.update()


def _report(message: str) -> None:
    """A failed item is said even with --no-progress (status lines are not)."""
    if distributed.writes():
        print(f"porter: {message}", file=sys.stderr, flush=True)


def _run_item(port, item: Item, batch: Batch, on_step) -> None:
    begin = time.perf_counter()
    call = Call(item.recipe, directory=batch.directory / item.name, on_step=on_step,
                say=batch.say)
    made = runners.run_into(port, call, batch.resume, item.name, ITEM_HOLDER)
    item.status = "done"
    item.seconds = round(time.perf_counter() - begin, 4)
    item.compile_s = made.outcome.timings["compile"]["seconds"]
    item.record_digest = made.record_sha256


def _record_digest(directory: Path) -> str | None:
    try:
        return atomic.sha256(directory / outputs.RECORD)
    except OSError:
        return None


def _still_ours(items: list[Item], directory: Path) -> None:
    """A done item whose record is no longer the one the batch wrote (a run into its
    folder from outside Porter's locks, or by hand) is said so in the summary, not
    described as the batch made it."""
    for item in items:
        if item.status == "done" and item.record_digest is not None and \
                _record_digest(directory / item.name) != item.record_digest:
            item.status = "replaced"
            item.error = (f"{directory / item.name / outputs.RECORD} changed after the "
                          "batch made it: the folder holds another run's files now")


class _Summary:
    """``batch.json``: per item its status and timings, rewritten after each item (an
    interrupted batch leaves a true one)."""

    def __init__(self, path: Path, prompts: Path, port, started: float):
        self.path, self.prompts, self.port, self.started = path, prompts, port, started

    def write(self, items: list[Item]) -> dict:
        _still_ours(items, self.path.parent)
        counts = {}
        for item in items:
            counts[item.status] = counts.get(item.status, 0) + 1
        data = {"summary": self.path.name, "prompts": str(self.prompts),
                "recipe": str(self.port.recipe.path),
                "counts": counts,
                "timings": {**{k: v for k, v in self.port.load_timings.items()},
                            "total_s": round(time.perf_counter() - self.started, 4)},
                "items": [item.summary() for item in items]}
        if distributed.writes():
            # a process running its own items holds no lock that made the folder
            self.path.parent.mkdir(parents=True, exist_ok=True)
            record.write_json(self.path, data)
        return data
