"""``porter compile``: the recipe's port built for a target, every program a run compiles
compiled by the target's compiler, and what that says: memory per chip against the
chip's HBM, cost, collectives, compile time, and a lower bound on a step's time."""

from __future__ import annotations

import collections
import dataclasses
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from porter import families
from porter.aot import dry_run, executable, meshes, roofline, targets
from porter.aot import port as abstract_port
from porter.aot.programs import Input, State, outermost, submodule_calls, unique
from porter.errors import Interrupted, PorterError, RecipeError, UsageError, first_line
from porter.port import checks
from porter.runtime import environment, mesh_text
from porter.transforms import patches
from porter.transforms.sharding import human_bytes, human_flops, human_seconds

if TYPE_CHECKING:
    from porter.recipe import Recipe
    from porter.registry import Registry


def host_compiles() -> None:
    """This process compiles for a TPU it does not have: JAX runs on the CPU (set
    before JAX starts), and libtpu only describes the target, told there is no TPU to
    look for."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    environment.quiet_libtpu()


def build(recipe: Recipe, registry: Registry, target_name: str,
          only: list[str] | None = None,
          say=lambda message: None, hlo_dir: Path | None = None) -> dict:
    """Compile every program of ``recipe``'s run (``only``: those named, e.g.
    ``transformer.forward``) for ``target_name``; the report (see ``render``). Raises
    what ``porter validate`` would for a recipe that cannot run. ``hlo_dir``: where each
    compiled program's optimized HLO is written (``NN-component.method.hlo``, in the
    order compiled)."""
    target = targets.named(target_name)
    _check(recipe, registry, target)
    say(f"building the port for {target.name} ({target.chips} x {target.facts.name}, "
        f"libtpu's {target.topology}), every weight abstract")
    port = abstract_port.build(recipe, registry, target)
    modules = {name: c.module for name, c in port.components.items()}
    declared, not_found, eager = port.family.programs(recipe, modules), None, set()
    if declared is None and not port.family.staged:  # the pipeline's own call says
        say("finding the programs: the pipeline's own call, every component abstract")
        try:
            declared = dry_run.programs(port, eager)
        except (PorterError, Interrupted):
            raise  # the recipe's or the checkpoint's problem, or a kill: said as it is
        except Exception as exc:  # noqa: BLE001 - what model code needs values for
            not_found = executable._traced_failure(exc)
    programs = unique(declared) if declared is not None else []
    if only:  # a declared call's name, or a compiled submodule's (vae.decoder)
        names = [{p.name} | {f"{p.component}.{m}" for m in _paths(port, p)}
                 for p in programs]
        unknown = sorted(set(only).difference(*names))
        if unknown:
            known = ", ".join(dict.fromkeys(p.name for p in programs))  # each name once
            raise UsageError(f"no program {', '.join(unknown)} in this recipe's run",
                             hint="programs: " + (known or (
                                 f"none ({not_found})" if not_found else "none")))
        # before finding submodule calls: that dry run is for the programs asked for
        programs = [p for p, named in zip(programs, names) if named & set(only)]
    programs, unknown_calls = _as_run_compiles(port, programs, say)
    if hlo_dir is not None:
        _clear_kept(hlo_dir)
        say(f"keeping each program's optimized HLO in {hlo_dir}")
    results, done = [], {}
    carried: dict = {}  # (component, method) -> the cache its last program returned
    written: dict = {}  # (component, method) -> the slots its programs wrote, as left
    for index, program in enumerate(programs, 1):
        same = _identity(port, program)
        if same in done:  # two experts of one shape: one program for the compiler
            say(f"[{index}/{len(programs)}] {program.name}: the program of "
                f"{done[same].program.name}")
            results.append(dataclasses.replace(done[same], program=program))
            continue
        say(f"[{index}/{len(programs)}] {program.name}: tracing, then the {target.name} "
            "compiler")
        keep = hlo_dir / f"{index:02d}-{program.name}.hlo" if hlo_dir else None
        chain = (program.component, program.method)
        result = executable.compile_program(port, program, keep, carried.get(chain),
                                            written.get(chain))
        # a chunk loop's cache, as the next chunk takes it (none from a program that
        # failed: the next is given it replicated); the slots written in an object, as
        # every later call with that object takes them (a failed program writes none)
        carried[chain] = result.carried_out
        written.setdefault(chain, {}).update(result.written_out)
        results.append(done.setdefault(same, result))
    compiled = {r.program.component for r in results}
    left_out = {**_left_out(port, compiled, declared is None, bool(only), not_found),
                **unknown_calls}
    return _report(recipe, port, target, results, left_out, eager)


def _clear_kept(hlo_dir: Path) -> None:
    """Make ``--hlo``'s folder (only now: a refused recipe leaves none behind) and
    remove the ``NN-*.hlo`` files an earlier compile kept there, which would otherwise
    be summed with this one's."""
    hlo_dir.mkdir(parents=True, exist_ok=True)
    for old in hlo_dir.glob("[0-9]*-*.hlo"):
        if old.name.split("-", 1)[0].isdigit():  # 01-..., and 100-... past 99 programs
            old.unlink()


def _paths(port, program) -> list[str]:
    """The paths of the submodules a compile rule's ``modules`` compiles one by one."""

    rule = port.components[program.component].rule
    if rule is None or rule.modules is None:
        return []
    return [name for name, _ in outermost(port.components[program.component].module,
                                          rule.modules)]


def _as_run_compiles(port, declared: list, say) -> tuple[list, dict]:
    """The declared programs as the run compiles them: where a compile rule names
    ``modules``, the calls of those submodules the declared call makes, found by
    running the code between them on shapes alone (``submodule_calls``). Also, per
    component, why its calls could not be found that way."""
    found, unknown = [], {}
    for program in declared:
        rule = port.components[program.component].rule
        if rule is None or rule.modules is None:
            found.append(program)
            continue
        say(f"{program.name}: finding its calls of {rule.modules!r} from shapes alone")
        try:
            with patches.applied(port.ported.patches):
                module = port.components[program.component].module
                found += unique(submodule_calls(module, rule.modules, program))
        except Interrupted:
            raise
        except Exception as exc:  # noqa: BLE001 - the glue needs values
            unknown[program.component] = (
                f"compile.{program.component}.modules compiles submodules, and the code "
                f"between them needs values to run ({executable._traced_failure(exc)})")
    return found, unknown


def _identity(port, program) -> tuple:
    """What decides a compiled program: its module's class and abstract weights, its
    method, its inputs (two components of one shape and sharding, one program)."""
    component = port.components[program.component]
    state = tuple((name, value.shape, str(value.dtype), str(value.sharding))
                  for part in component.state for name, value in sorted(part.items()))
    activations = repr(component.activations)
    return (type(component.module), state, activations, component.one_device,
            component.attention_skipped) + program.signature()[1:]


def _check(recipe: Recipe, registry: Registry, target) -> None:
    """What ``porter validate --devices N`` checks, for the target's chips and platform."""
    problems = checks.input_problems(recipe, registry)
    if not problems:
        problems = checks.mesh_problems(recipe, registry, target.chips, target.platform,
                                        target.name)
    if not problems:
        problems = checks.shape_problems(recipe, registry, target.chips)
    if problems:
        raise RecipeError(problems)


def _report(recipe: Recipe, port, target, results, left_out: dict,
            eager: Iterable[str] = ()) -> dict:
    """The report of ``results``; ``left_out`` names what was not compiled, and why;
    ``eager``: the stages of calls the dry run saw a run make eagerly."""
    chip = target.facts
    resident = port.resident_bytes_per_chip
    total = sum(resident.values())
    given = {name: c.sharded_bytes_per_chip for name, c in port.components.items()}
    if given != resident:  # the plan's rules and the shardings the compiler got disagree
        raise RuntimeError(f"weights per chip: planned {resident}, compiled {given}")
    rows = [_program_row(result, total, chip) for result in results]
    bound = roofline.step(results, target)
    anchors = [roofline.implied(bound, a, target) for a in roofline.anchors_for(recipe, target)] \
        if bound else []
    whole = roofline.video(rows, recipe.generate.steps, bound, recipe.generate.frames,
                           port.family.decodes_in_chunks(recipe),
                           _eager_stages(port, eager))
    report = {
        "recipe": recipe.name, "target": _target_row(target), "mesh": port.runtime.axes,
        "attention_backend": recipe.attention.backend,
        "weights_per_chip": {"components": resident, "total": total},
        "programs": rows, "not_compiled": left_out,
        "compile_s": round(sum(r.trace_s + r.compile_s for r in results), 2),
        "roofline": bound, "anchors": anchors, "video": whole}
    report["verdict"] = _verdict(report, chip)
    return report


def replace_programs(report: dict, rows: list[dict]) -> dict:
    """``report`` with ``rows``, programs compiled by themselves (``--program``), in
    place of its programs of their components and stages: a stage compiled again
    after a change made it smaller (a tiled decode's tile programs for the decode in
    one), or the same program (inputs, weights per chip) of another recipe. Their peaks
    count this report's weights of every component, as a whole compile counts them;
    the verdict and the compile time follow. Denoising programs are refused: the
    roofline comes from the compiled transformer, not from its rows."""
    usable = report["target"]["usable_hbm_bytes"]
    total = report["weights_per_chip"]["total"]
    counted = []
    for row in rows:
        if row["stage"] == "denoise":
            raise ValueError(f"{row['program']} is a denoising program: compile the recipe "
                             "whole to change it (the roofline comes from it)")
        if row["status"] == "compiled":
            peak = _with_every_weight(row["program_peak_bytes"], row["weights_bytes_per_chip"],
                                      total)
            row = {**row, "peak_bytes_per_chip": peak, "fits": peak <= usable}
        counted.append(row)
    stages = {(row["component"], row["stage"]) for row in rows}
    old = report["programs"]
    replaced_at = [i for i, row in enumerate(old) if (row["component"], row["stage"]) in stages]
    at = replaced_at[0] if replaced_at else len(old)
    kept = [row for i, row in enumerate(old) if i not in replaced_at]
    components = {row["component"] for row in rows}
    replaced = {**report, "programs": kept[:at] + counted + kept[at:],
                "not_compiled": {name: why for name, why in report["not_compiled"].items()
                                 if name not in components}}
    replaced["compile_s"] = round(sum(r["trace_s"] + r["compile_s"]
                                      for r in replaced["programs"]), 2)
    replaced["verdict"] = _verdict(replaced, targets.named(report["target"]["name"]).facts)
    if report.get("video"):
        replaced["video"] = roofline.video(
            replaced["programs"], report["video"]["steps"], report["roofline"],
            report["video"].get("frames"), report["video"].get("chunked", False),
            tuple(report["video"].get("eager", ())))
    return replaced


def _target_row(target) -> dict:
    chip = target.facts
    return {"name": target.name, "chip": chip.name, "chips": target.chips,
            "hosts": target.hosts, "topology": target.topology,
            "hbm_bytes": chip.hbm_bytes, "usable_hbm_bytes": chip.usable_hbm_bytes,
            "peak_bf16_flops": chip.peak_bf16_flops, "peak_8bit": chip.peak_8bit,
            "hbm_bytes_per_s": chip.hbm_bytes_per_s,
            "ici_bytes_per_s": chip.ici_bytes_per_s, "source": chip.source}


def _program_row(result, resident_total: int, chip) -> dict:
    program = result.program
    row = {"program": program.name, "component": program.component,
           "method": program.method, "stage": program.stage, "calls": program.calls,
           "per_step": program.per_step, "first_chunk": program.first_chunk,
           "frames": program.frames, "note": program.note,
           "inputs": _inputs(program), "trace_s": round(result.trace_s, 2),
           "compile_s": round(result.compile_s, 2), "scanned_blocks": result.scanned,
           "weights_bytes_per_chip": result.weights_bytes, "sized": list(result.sized)}
    if result.failed:
        return {**row, "status": "not traced", "reason": result.failed}
    if result.refused and "RESOURCE_EXHAUSTED" not in result.refused:
        # the compiler could not build the program at all (a kernel that cannot take
        # this dtype or shape): no verdict on its memory
        return {**row, "status": "not compiled", "reason": result.refused}
    if result.refused:
        found = executable.needed_bytes(result.refused)
        needed = None if found is None else resident_total - result.weights_bytes + found[0]
        return {**row, "status": "refused", "reason": result.refused,
                "peak_bytes_per_chip": needed, "fits": False}
    peak = _with_every_weight(result.peak_bytes, result.weights_bytes, resident_total)
    return {**row, "status": "compiled", "memory": result.memory,
            "program_peak_bytes": result.peak_bytes, "peak_bytes_per_chip": peak,
            "fits": peak <= chip.usable_hbm_bytes, "flops": result.flops,
            "call_bound_s": roofline.call_seconds(result, chip),
            "matmul_flops": result.matmul_flops,
            "bytes_accessed": result.bytes_accessed,
            "collectives": {kind: {"count": c.count, "bytes": c.bytes,
                                   "bytes_sent_per_chip": c.traffic_bytes}
                            for kind, c in result.collectives.items()}}


def _with_every_weight(program_peak: int, program_weights: int, resident_total: int) -> int:
    """A program's peak per chip while every component's weights stay on each chip
    (this program's own are among its arguments, so counted once)."""
    return resident_total - program_weights + program_peak


def _inputs(program) -> dict:
    """The program's inputs, shapes and dtypes as text (static values as given)."""
    def text(value):
        if isinstance(value, Input):
            return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
        if isinstance(value, State):  # an object the call writes: its class, its slots
            return {"object": value.name, "slots": text(value.tree)}
        if isinstance(value, (list, tuple)):
            return [text(v) for v in value]
        if isinstance(value, dict):
            return {k: text(v) for k, v in value.items()}
        return repr(value)
    found = {f"arg{i}": text(v) for i, v in enumerate(program.args)}
    found.update({k: text(v) for k, v in program.kwargs.items()})
    return found


def _eager_stages(port, seen: Iterable[str] = ()) -> tuple[str, ...]:
    """The stages with a component the run does not compile (one whose recipe turns
    its compile off), and ``seen`` (those of eager calls of compiled components the dry
    run saw): their time is not in any program's bound. A decoder's stage is the
    decode (an eager VAE's encode runs only where the video starts from an image)."""
    decoders = {name for name, _ in dry_run.DECODE}
    uncompiled = {"decode" if name in decoders else dry_run.stage_of(port.family, name)
                  for name, component in port.components.items() if component.rule is None}
    return tuple(sorted(uncompiled | set(seen)))


def _left_out(port, compiled: set, undeclared: bool, chosen: bool,
              not_found: str | None = None) -> dict:
    """Components a run compiles that no program here covers, with why (``chosen``:
    the programs were named with --program; ``not_found``: why the pipeline's own call
    could not be run on abstract components)."""
    found = {}
    for name, component in port.components.items():
        if component.rule is None or name in compiled:
            continue
        if undeclared and not_found:
            why = ("the pipeline's own call could not run on abstract components "
                   f"({not_found})")
        elif undeclared:
            why = (f"family {port.family.name!r} does not declare the calls its run makes "
                   "(ModelFamily.programs), so they cannot be compiled before running")
        elif chosen:
            why = "not asked for (--program)"
        elif component.rule.modules is not None:
            why = (f"compile.{name}.modules compiles submodules, and the family declares "
                   "no call of this component")
        else:
            why = ("no call of its compiled methods in this recipe's run (a child's "
                   "that the pipeline makes itself runs eagerly)")
        found[name] = why
    return found


def _verdict(report: dict, chip) -> dict:
    """Does every program fit? If not, the worst one, what it needs and what to change."""
    usable = chip.usable_hbm_bytes
    failed = [row for row in report["programs"]
              if row["status"] in ("not traced", "not compiled")]
    over = [row for row in report["programs"] if row.get("fits") is False]
    if not report["programs"]:
        return {"fits": None, "message": "no program compiled", "hint": next(
            iter(report["not_compiled"].values()), "nothing in this recipe is compiled")}
    if over:
        worst = max(over, key=lambda row: row.get("peak_bytes_per_chip") or math.inf)
        need = worst.get("peak_bytes_per_chip")
        amount = f"about {human_bytes(need)}" if need else "more than it has"
        return {"fits": False, "program": worst["program"], "needed_bytes": need,
                "available_bytes": usable,
                "message": f"{worst['program']} does not fit a {report['target']['name']} "
                           f"device: it needs {amount} per device (weights of every component "
                           f"{human_bytes(report['weights_per_chip']['total'])}), "
                           f"{human_bytes(usable)} are available",
                "hint": _hint(worst, report)}
    if failed:
        row = failed[0]
        if row["status"] == "not compiled":
            return {"fits": None, "program": row["program"],
                    "message": f"{row['program']} cannot be compiled for "
                               f"{report['target']['name']}: {row['reason']}",
                    "hint": "the TPU compiler refused the program itself, not its memory: "
                            "a kernel that cannot take this dtype or shape; try "
                            "attention.backend blockwise (pure JAX) or model.dtype "
                            "bfloat16"}
        return {"fits": None, "program": row["program"],
                "message": f"{row['program']} could not be traced with abstract values: "
                           f"{row['reason']}",
                "hint": "a patch for that code (see docs/authoring-recipes.md) lets the "
                        "compiler see it"}
    peak = max(row["peak_bytes_per_chip"] for row in report["programs"])
    return {"fits": True, "peak_bytes_per_chip": peak, "available_bytes": usable,
            "message": f"every program fits: peak {human_bytes(peak)} of "
                       f"{human_bytes(usable)} per device", "hint": None}


def _hint(row: dict, report: dict) -> str:
    """What to change, from what dominates the program's memory."""
    weights = report["weights_per_chip"]["total"]
    memory = row.get("memory") or {}
    temporary = memory.get("temporary", max(0, (row.get("peak_bytes_per_chip") or 0) - weights))
    tips = []
    if row["component"].startswith("vae"):
        tips.append(f"decode tile by tile (setup: {{{row['component']}: [enable_tiling]}})")
    elif temporary >= weights and row["component"].startswith("transformer"):
        if report["attention_backend"] != "auto":
            tips.append("attention.backend: auto (splash on TPU) keeps attention in blocks")
        tips.append("smaller attention.block_q / block_kv, or more chips on the head axis")
    if weights >= temporary or not tips:
        tips.append("shard more weights: rules with spec [tp, ...] for the biggest "
                    "replicated tensors, or FSDP-style [[dp, tp], ...] to split them over "
                    "dp too (`porter plan` lists them)")
        tips.append("or a target with more memory per chip or more chips")
    return "; ".join(tips)


def render(report: dict) -> str:
    t = report["target"]
    mesh = mesh_text(report["mesh"])
    lines = [f"compiled {report['recipe']} for {t['name']}: {t['chips']} x {t['chip']} "
             f"({human_bytes(t['usable_hbm_bytes'])} usable HBM each), mesh {mesh}, "
             f"attention {report['attention_backend'] or 'as torchax lowers it'}"]
    weights = report["weights_per_chip"]
    shown = ", ".join(f"{n} {human_bytes(b)}" for n, b in weights["components"].items())
    lines.append(f"weights per device: {human_bytes(weights['total'])} ({shown}); every "
                 "component stays resident while a run goes on")
    for row in report["programs"]:
        calls = "?" if row["calls"] is None else row["calls"]
        head = f"\n{row['program']} [{row['stage']}, {calls} call(s); {row['note']}]" \
            if row["note"] else f"\n{row['program']} [{row['stage']}, {calls} call(s)]"
        lines.append(head)
        lines.append(f"  inputs: {_short(row['inputs'])}")
        if row["status"] != "compiled":
            lines.append(f"  {row['status'].upper()}: {row['reason']}")
            continue
        m = row["memory"]
        lines.append(f"  per device: arguments {human_bytes(m['argument'])}, outputs "
                     f"{human_bytes(m['output'])}, temporaries {human_bytes(m['temporary'])}, "
                     f"code {human_bytes(m['generated_code'])}; peak with every weight "
                     f"{human_bytes(row['peak_bytes_per_chip'])} of "
                     f"{human_bytes(t['usable_hbm_bytes'])} "
                     f"({'fits' if row['fits'] else 'DOES NOT FIT'})")
        moved = ", ".join(f"{k} x{c['count']} ({human_bytes(c['bytes'])})"
                          for k, c in row["collectives"].items()) or "none"
        lines.append(f"  {human_flops(row['flops'])} (matmuls: "
                     f"{_by_kind(row.get('matmul_flops') or {})}) and "
                     f"{human_bytes(int(row['bytes_accessed']))} accessed per device and call; "
                     f"collectives: {moved}")
        scanned = ", ".join(f"{n} x{c}" for n, c in row["scanned_blocks"].items())
        sized = ", ".join(row["sized"])
        lines.append(f"  traced in {row['trace_s']:.1f} s, compiled in {row['compile_s']:.1f} s"
                     + (f" (blocks as one scan: {scanned})" if scanned else "")
                     + (f" (sizes taken as constants: {sized})" if sized else ""))
    for name, why in report["not_compiled"].items():
        lines.append(f"\n{name}: not compiled here: {why}")
    bound = report["roofline"]
    if bound:
        lines.append(f"\none denoising step ({bound['component']}), a lower bound: "
                     f"{human_seconds(bound['bound_s'])} ({bound['limited_by']}; compute "
                     f"{human_seconds(bound['compute_s'])}, HBM "
                     f"{human_seconds(bound['memory_s'])}, interconnect "
                     f"{human_seconds(bound['interconnect_s'])}); matmuls "
                     f"{_by_kind(bound.get('matmul_flops_per_chip') or {})}, each kind at "
                     f"the chip's peak for it")
        for anchor in report["anchors"]:
            lines.append(f"  published, {anchor['precision']}: "
                         f"{anchor['seconds_per_step']:.3g} s/step ({anchor['how']}):"
                         f" {anchor['times_bound']:.1f}x the bound, MFU "
                         f"{anchor['mfu']:.0%}; {anchor['url']}")
    whole = report.get("video")
    if whole:
        parts = ", ".join(f"{stage} {human_seconds(seconds)}" for stage, seconds
                          in whole["stages_s"].items())
        missing = (f"; not counted: {', '.join(whole['missing'])} (not compiled here)"
                   if whole["missing"] else "")
        steps = f"{whole['steps']} steps" if whole["steps"] else "the pipeline's steps"
        lines.append(f"a whole video, a lower bound: {human_seconds(whole['bound_s'])} "
                     f"({parts}; "
                     f"{steps}){missing}")
        stream = whole.get("stream")
        if stream:
            pace = (f"{stream['chunks']} chunks, the first denoised and decoded in "
                    f"{human_seconds(stream['first_chunk_s'])}, each later one in "
                    f"{human_seconds(stream['chunk_s'])}" if "chunks" in stream
                    else "the decode's bound")
            rate = stream["frames_per_second"]
            rate = f"{rate:,.0f}" if rate >= 1000 else f"{rate:.4g}"
            lines.append(f"  streamed: the first frames after "
                         f"{human_seconds(stream['first_frames_s'])}, then {rate} frames "
                         f"a second ({pace})")
        for anchor in report["anchors"]:
            if anchor.get("video_s") and whole["steps"]:
                at = roofline.video_at(whole, bound, anchor["steps"])
                lines.append(f"  published whole video: {anchor['video_s']:.4g} s for "
                             f"{anchor['steps']} steps ({anchor['how']}): "
                             f"{anchor['video_s'] / at:.1f}x the bound for those steps")
    lines.append(f"\n{report['verdict']['message']} (compile {report['compile_s']:.0f} s)")
    return "\n".join(lines)


def _by_kind(matmuls: dict) -> str:
    """Matmul FLOPs by operand kind, largest first: "bf16 1.2 TFLOP, int8 30.1 TFLOP"."""
    return ", ".join(f"{kind} {human_flops(flops)}" for kind, flops in
                     sorted(matmuls.items(), key=lambda item: -item[1])) or "none"


def _short(inputs: dict) -> str:
    return ", ".join(f"{k}={_brief(v)}" for k, v in inputs.items())


def _brief(value) -> str:
    """An input as the report lists it; a long list (a VAE's cache of feature maps)
    counted: its arrays ("dtype[shape]"), the largest named, the rest by kind."""
    if not isinstance(value, list) or len(value) <= 4:
        return str(value)
    arrays, others = [], collections.Counter()
    for entry in value:
        if isinstance(entry, str) and entry.endswith("]") and "[" in entry:
            arrays.append(entry)
        else:
            others[entry.strip("'") if isinstance(entry, str) else type(entry).__name__] += 1
    parts = [f"{len(arrays)} arrays (largest {max(arrays, key=_elements)})"] if arrays else []
    parts += [f"{kind} x{count}" for kind, count in others.items()]
    return f"[{len(value)}: {', '.join(parts)}]"


def _elements(array: str) -> int:
    """The elements of an input listed as "dtype[d0, d1, ...]"."""
    dims = array[array.index("[") + 1:-1]
    return math.prod(int(d) for d in dims.split(",") if d.strip().isdigit())


# ---------------------------------------------------------------------- choosing a mesh

#: step bounds closer than this share first place; the lower interconnect wins
TIE = 0.005


def choose_mesh(load, registry: Registry, target_name: str, only: list[str] | None = None,
                say=lambda message: None) -> dict:
    """Compile the recipe with every candidate mesh for ``target_name``
    (``porter.aot.meshes``) and choose the one with the lowest step bound that fits.
    ``load(overrides)``: the recipe with those overrides added to the user's. The
    report: each candidate's mesh and its bound, interconnect and peak a chip, or why
    it cannot run; ``chosen``, the overrides that run it (None when none fits)."""
    target = targets.named(target_name)
    recipe = load([])
    family = checks.checked_family(recipe, registry)
    found = meshes.candidates(target.chips, families.batch(family, recipe))
    rows = []
    for index, mesh in enumerate(found, 1):
        say(f"[{index}/{len(found)}] mesh {meshes.shown(mesh)}")
        rows.append(_candidate(load, registry, target, mesh, only))
    if not any(row.get("step_bound_s") for row in rows) and \
            any(row["status"] == "compiled" for row in rows):
        raise UsageError("--choose-mesh ranks meshes by a denoising step's bound, and no "
                         "program compiled here gives one",
                         hint="compile the transformer: --program transformer.forward, or "
                              "every program (no --program)")
    fitting = [row for row in rows if row.get("fits") and row.get("step_bound_s")]
    chosen = None
    if fitting:
        best = min(row["step_bound_s"] for row in fitting)
        close = [row for row in fitting if row["step_bound_s"] <= best * (1 + TIE)]
        chosen = min(close, key=lambda row: row["interconnect_s"])
    return {"recipe": recipe.name, "target": _target_row(target), "candidates": rows,
            "chosen": None if chosen is None else {
                "mesh": chosen["mesh"], "overrides": chosen["overrides"],
                "step_bound_s": chosen["step_bound_s"]}}


def _candidate(load, registry: Registry, target, mesh: dict, only) -> dict:
    """One mesh compiled: its step bound, interconnect and peak a chip; or why not."""
    overrides = meshes.override(mesh)
    row = {"mesh": mesh, "shown": meshes.shown(mesh), "overrides": overrides}
    unfit = meshes.fits_torus(target, mesh)
    if unfit:
        return {**row, "status": "not on the torus", "reason": unfit}
    try:
        try:
            report = build(load(overrides), registry, target.name, only)
        except RecipeError as exc:  # weights this mesh keeps whole: compiled, and said
            replicated = [p.message for p in exc.problems if meshes.REPLICATED in p.message]
            if len(replicated) < len(exc.problems):  # the first problem that is not one
                raise RecipeError([p for p in exc.problems
                                   if meshes.REPLICATED not in p.message]) from None
            overrides = overrides + [meshes.KEEP_REPLICATED]
            row = {**row, "overrides": overrides, "replicated": replicated}
            report = build(load(overrides), registry, target.name, only)
    except RecipeError as exc:  # what validate refuses for this mesh
        return {**row, "status": "refused", "reason": exc.problems[0].message}
    except UsageError as exc:
        return {**row, "status": "refused", "reason": exc.message}
    except Interrupted:  # a kill ends the search, not this mesh alone
        raise
    except Exception as exc:  # noqa: BLE001 - one mesh's failure; the others still count
        return {**row, "status": "failed", "reason": f"{type(exc).__name__}: {first_line(exc)}"}
    bound = report["roofline"] or {}
    peaks = [r.get("peak_bytes_per_chip") or 0 for r in report["programs"]]
    return {**row, "status": "compiled", "fits": report["verdict"]["fits"],
            "step_bound_s": bound.get("bound_s"), "limited_by": bound.get("limited_by"),
            "interconnect_s": bound.get("interconnect_s"),
            "peak_bytes_per_chip": max(peaks, default=0),
            "compile_s": report["compile_s"]}


def render_choice(choice: dict) -> str:
    t = choice["target"]
    lines = [f"{choice['recipe']} on {t['name']} ({t['chips']} x {t['chip']}, "
             f"{human_bytes(t['usable_hbm_bytes'])} usable each): each mesh compiled"]
    for row in choice["candidates"]:
        if row["status"] != "compiled":
            lines.append(f"  {row['shown']:<24} {row['status']}: {row['reason']}")
            continue
        whole = " (keeps weights whole the rules split over other axes)" \
            if row.get("replicated") else ""
        verdict = "" if row["fits"] else ": DOES NOT FIT" if row["fits"] is False else \
            ": a program was not compiled"
        if row["step_bound_s"] is None:
            lines.append(f"  {row['shown']:<24} no step bound, peak "
                         f"{human_bytes(row['peak_bytes_per_chip'])} a chip{verdict}{whole}")
            continue
        lines.append(f"  {row['shown']:<24} step {human_seconds(row['step_bound_s'])} "
                     f"({row['limited_by']}), interconnect "
                     f"{human_seconds(row['interconnect_s'])}, "
                     f"peak {human_bytes(row['peak_bytes_per_chip'])} a chip{verdict}{whole}")
    chosen = choice["chosen"]
    if chosen is None:
        lines.append("no mesh fits")
    else:
        given = " ".join(f"'{o}'" for o in chosen["overrides"])
        lines.append(f"chosen: {meshes.shown(chosen['mesh'])}, "
                     f"{human_seconds(chosen['step_bound_s'])} a step (run it with {given})")
    return "\n".join(lines)
