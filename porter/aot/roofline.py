"""A lower bound on a denoising step's time on the target, from what its compiler
reports: FLOPs over the chip's peak, bytes accessed over its HBM bandwidth, and bytes
sent between chips over its interconnect. A step takes at least the largest of the
three (they can overlap, at best entirely); it is a bound, not a prediction.

Published measurements of the same models on the same slices sit beside it, with
the model FLOPs utilisation (MFU) each implies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from porter.recipe import Recipe


@dataclass(frozen=True)
class Anchor:
    """A published time per denoising step."""

    source: str  # the recipe's model.source it applies to
    target: str
    height: int
    width: int
    frames: int
    seconds_per_step: float
    how: str
    url: str
    precision: str = "bfloat16"  # of the published run's matmuls
    steps: int | None = None  # of the published whole video (seconds_per_step x steps)


#: whole-video wall time divided by the steps (text encoder and VAE included), on
#: TPU v6e-8 through torchax with splash attention
ANCHORS: tuple = (
    Anchor("Wan-AI/Wan2.1-T2V-14B-Diffusers", "v6e-8", 720, 1280, 81, 4.59,
           "229.29 s for 50 steps, torchax, dp=2 x tp=4",
           "https://github.com/yangwhale/gpu-tpu-pedia/blob/main/tpu/Wan2.1/README.md",
           steps=50),
    Anchor("THUDM/CogVideoX1.5-5B", "v6e-8", 720, 1280, 81, 2.13,
           "106.47 s for 50 steps, torchax, dp=2 x tp=4",
           "https://github.com/yangwhale/gpu-tpu-pedia/blob/main/tpu/CogVideoX/README.md",
           steps=50),
    Anchor("hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_t2v", "v6e-8", 720, 1280,
           121, 5.81, "4.8 min for 50 steps, torchax, custom splash kernel",
           "https://github.com/yangwhale/gpu-tpu-pedia/blob/main/tpu/HunyuanVideo-1.5/"
           "README.md", steps=50),
)

# MaxDiffusion's own JAX Wan on TPU7x (Tokamax flash attention, dp=2 x context
# parallel, the two guidance passes batched over dp), 720p, 81 frames: whole-video
# times of its README's ring-attention table, over the steps
_MAXDIFFUSION = ("https://github.com/AI-Hypercomputer/maxdiffusion/blob/"
                 "7cfb8801d41d1728f0232cd7ee59e900a151fecf/README.md#ring-attention")
ANCHORS += (
    Anchor("Wan-AI/Wan2.1-T2V-14B-Diffusers", "v7x-8", 720, 1280, 81, 249.3 / 50,
           "MaxDiffusion: 249.3 s for 50 steps, dp2 x context4", _MAXDIFFUSION, steps=50),
    Anchor("Wan-AI/Wan2.1-T2V-14B-Diffusers", "v7x-16", 720, 1280, 81, 127.1 / 50,
           "MaxDiffusion: 127.1 s for 50 steps, dp2 x context8", _MAXDIFFUSION, steps=50),
    Anchor("Wan-AI/Wan2.2-T2V-A14B-Diffusers", "v7x-8", 720, 1280, 81, 194.4 / 40,
           "MaxDiffusion: 194.4 s for 40 steps, dp2 x context4", _MAXDIFFUSION, steps=40),
    Anchor("Wan-AI/Wan2.2-T2V-A14B-Diffusers", "v7x-16", 720, 1280, 81, 106.0 / 40,
           "MaxDiffusion: 106.0 s for 40 steps, dp2 x context8", _MAXDIFFUSION, steps=40),
)


def anchors_for(recipe: Recipe, target) -> list[Anchor]:
    gen = recipe.generate
    return [a for a in ANCHORS if a.source == recipe.model.source and a.target == target.name
            and (a.height, a.width, a.frames) == (gen.height, gen.width, gen.frames)]


def step(results: list, target) -> dict | None:
    """The bound for one denoising step from the compiled denoise programs (each with
    its ``per_step`` calls): the busiest transformer's, since a step runs one. Where
    the calls a step are averages over the video (a generic pipeline's, found by its
    dry run: two experts sharing the steps each run half of them), the components'
    averaged loads add up instead."""
    denoising = [r for r in results if r.program.stage == "denoise" and r.memory != {}]
    averaged = any(float(r.program.per_step or 1) != int(r.program.per_step or 1)
                   for r in denoising)
    together = " + ".join(sorted({r.program.component for r in denoising}))
    per_component: dict = {}
    for result in denoising:
        program = result.program
        sums = per_component.setdefault(together if averaged else program.component, {
            "flops": 0.0, "accessed": 0.0, "sent": 0.0, "matmuls": {}})
        calls = program.per_step or 1  # unknown: once
        sums["flops"] += result.flops * calls
        sums["accessed"] += result.bytes_accessed * calls
        sums["sent"] += sum(c.traffic_bytes for c in result.collectives.values()) * calls
        for kind, flops in result.matmul_flops.items():
            sums["matmuls"][kind] = sums["matmuls"].get(kind, 0.0) + flops * calls
    if not per_component:
        return None
    chip = target.facts
    rows = []
    for component, sums in per_component.items():
        times = {"compute_s": compute_seconds(sums["flops"], sums["matmuls"], chip),
                 "memory_s": sums["accessed"] / chip.hbm_bytes_per_s,
                 "interconnect_s": sums["sent"] / chip.ici_bytes_per_s}
        rows.append({"component": component, "flops_per_chip": sums["flops"],
                     "matmul_flops_per_chip": sums["matmuls"],
                     "bytes_accessed_per_chip": sums["accessed"],
                     "bytes_sent_per_chip": sums["sent"],
                     **times, "bound_s": max(times.values()),
                     "limited_by": max(times, key=times.get).removesuffix("_s")})
    return max(rows, key=lambda row: row["bound_s"])


#: what a video's stages run, in order
STAGES = ("encode", "denoise", "decode")


def call_seconds(result, chip) -> float:
    """A lower bound on one call of a compiled program: the largest of its FLOPs at
    the chip's peaks, its bytes at HBM's bandwidth, its collectives' at the
    interconnect's."""
    return max(compute_seconds(result.flops, result.matmul_flops, chip),
               result.bytes_accessed / chip.hbm_bytes_per_s,
               sum(c.traffic_bytes for c in result.collectives.values())
               / chip.ici_bytes_per_s)


def video(rows: list[dict], steps: int, step_bound: dict | None,
          frames: int | None = None, chunked: bool = False,
          eager: tuple[str, ...] = ()) -> dict | None:
    """A lower bound on a whole video's time on the target, from a compile report's
    program rows: each encode and decode program at its call's bound
    (``call_bound_s``) times its calls (the text encoder as often as guidance calls
    it, the VAE's decode once or per tile), the denoising steps at ``step_bound``
    each. ``missing`` names the stages with a program that was not compiled (or whose
    calls are not known) or with none (run eagerly, or left out of this compile): the
    figure then covers the others alone. ``chunked``: the pipeline makes its video
    chunk by chunk (``ModelFamily.decodes_in_chunks``), a chunk a decode call. Where
    the recipe says no number of steps (a pyramid pipeline's are per stage), the
    denoising programs count at their calls' bounds, as the other stages'. ``eager``:
    the stages where a component runs with no program (a generic recipe's image
    encoder, beside its VAE's compiled encode), missing however many programs they
    have (kept in the result as ``eager``)."""
    if step_bound is None:
        return None
    seconds = {"denoise": step_bound["bound_s"] * steps} if steps else {}
    missing = set()
    for row in rows:
        stage = row["stage"]
        if stage == "denoise" and steps:
            continue
        seconds.setdefault(stage, 0.0)
        if row.get("call_bound_s") is None or row["calls"] is None:
            missing.add(stage)
            continue
        seconds[stage] += row["call_bound_s"] * row["calls"]
    missing |= {"encode", "decode"} - set(seconds)  # eager, or not asked for (--program)
    missing |= set(eager)
    if "denoise" in missing or "denoise" not in seconds:
        return None  # no count of steps, and a denoising program without its bound
    decodes = [row for row in rows if row["stage"] == "decode"]
    # the video's frames as its pipeline made them (a dry run's: Helios makes whole
    # chunks and trims), else the recipe's
    frames = next((row["frames"] for row in decodes if row.get("frames")), frames)
    # a pipeline that decodes chunk by chunk where it can but decoded once here (a
    # size its VAE tiles, a batch) streams as one decode does
    chunked = chunked and sum(row["calls"] or 0 for row in decodes) > 1
    found = {"bound_s": sum(seconds.values()), "steps": steps, "frames": frames,
             "chunked": chunked,
             "stages_s": {stage: seconds[stage] for stage in STAGES if stage in seconds},
             "missing": sorted(missing), "eager": sorted(eager)}
    if chunked and frames and decodes and "decode" not in missing and seconds["decode"] > 0:
        found["stream"] = _chunks(rows, decodes, seconds, found["bound_s"], frames)
    elif frames and decodes and "decode" not in missing and seconds["decode"] > 0:
        # a streamed decode's programs, in the order a run calls them: the first
        # chunk's frames come after its first call, the rest at the decode's rate
        found["stream"] = {"first_frames_s": found["bound_s"] - seconds["decode"]
                           + decodes[0]["call_bound_s"],
                           "frames_per_second": frames / seconds["decode"]}
    return found


def _chunks(rows: list[dict], decodes: list[dict], seconds: dict, bound: float,
            frames: int) -> dict:
    """A video made chunk by chunk, each denoised then decoded in turn: the first frames
    after the text encoder and the first chunk (the calls made before the first decode,
    where the dry run saw them: a first chunk may take more steps; else an equal share),
    then frames at the later chunks' rate."""
    chunks = sum(row["calls"] for row in decodes)
    made = bound - seconds.get("encode", 0.0)
    denoising = [row for row in rows if row["stage"] == "denoise"]
    if denoising and all(row.get("first_chunk") is not None for row in denoising):
        first = decodes[0]["call_bound_s"] + sum(row["call_bound_s"] * row["first_chunk"]
                                                 for row in denoising)
    else:
        first = made / chunks
    later = (made - first) / (chunks - 1) if chunks > 1 else first
    return {"first_frames_s": seconds.get("encode", 0.0) + first,
            "frames_per_second": frames / chunks / later, "chunks": chunks,
            "first_chunk_s": first, "chunk_s": later}


def video_at(whole: dict, step_bound: dict, steps: int) -> float:
    """The whole video's bound (``video``) with ``steps`` steps in place of its own:
    beside a published whole video of another step count."""
    return whole["bound_s"] + step_bound["bound_s"] * (steps - whole["steps"])


def compute_seconds(flops: float, matmuls: dict, chip) -> float:
    """The FLOPs' time at the chip's peaks: each kind of matmul at its operands' peak
    (int8 at v6e's int8 rate, fp8 at TPU7x's fp8 rate), the rest (attention kernels,
    elementwise work) at the bfloat16 peak."""
    seconds = sum(count / chip.peak(kind) for kind, count in matmuls.items())
    return seconds + max(0.0, flops - sum(matmuls.values())) / chip.peak_bf16_flops


def implied(bound: dict, anchor: Anchor, target) -> dict:
    """What a published time per step implies: the fraction of the chip's peaks it
    reaches (MFU: the time the compiled step's FLOPs take at the peaks for their
    kinds, over the published time; a quantized compile's FLOPs are counted at the
    8-bit peaks while the published run may be bfloat16: ``precision`` says) and its
    ratio to the bound."""
    useful = bound["compute_s"]
    return {"seconds_per_step": anchor.seconds_per_step, "how": anchor.how,
            "steps": anchor.steps,
            "video_s": anchor.seconds_per_step * anchor.steps if anchor.steps else None,
            "precision": anchor.precision,
            "url": anchor.url, "mfu": useful / anchor.seconds_per_step,
            "times_bound": anchor.seconds_per_step / bound["bound_s"]
            if bound["bound_s"] else None}
