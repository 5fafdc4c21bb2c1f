"""The recipe schema: what a recipe may say, with types, defaults and limits.

Pydantic models, strict (no silent coercion of "4" to 4), frozen (a recipe
never changes after validation) and closed (an unknown key is an error).
Each section grows with the transforms that read it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

Dtype = Literal["float32", "bfloat16", "float16"]

# Far past any machine, yet small enough that the product of the sizes stays
# printable in messages (Python refuses to print integers over 4300 digits).
MAX_AXIS_SIZE = 1 << 20
MAX_AXES = 16
AxisSize = Annotated[int, Field(le=MAX_AXIS_SIZE)] | Literal["auto"]


def _few_axes(mesh: dict) -> dict:
    if len(mesh) > MAX_AXES:
        raise ValueError(f"a mesh has at most {MAX_AXES} axes (got {len(mesh)})")
    return mesh


def _no_nul(path: str) -> str:
    # The OS cannot open such a path: say so here, not in a traceback mid-run.
    if "\0" in path:
        raise ValueError("a path cannot contain a NUL character")
    return path


PathText = Annotated[str, AfterValidator(_no_nul)]


class Section(BaseModel):
    # allow_inf_nan=False: no recipe number means infinity ('.inf' would pass ge=0)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ModelSection(Section):
    family: str = Field(description="model family a plugin registered, e.g. wan")
    source: PathText = Field(
        "tiny",
        description="'tiny' (random weights built in code), a hub id, a local diffusers "
        "directory, or an original release's folder a family reads (Wan 2.1 "
        "text-to-video: docs/quantize.md)",
    )
    dtype: Dtype = Field("float32", description="compute dtype of the model's weights")
    variant: str | None = Field(
        None, description="with source 'tiny' only: which of the family's layouts to "
        "build (`porter plugins` lists them); a checkpoint's layout comes from its "
        "configuration files")
    config: dict[str, Any] = Field(
        default_factory=dict, description="with source 'tiny': transformer configuration "
        "overrides (e.g. real widths and heads with few layers, for benchmarks)")
    pipeline: str | None = Field(
        None, description="family generic: a diffusers pipeline class name (default: the "
        "checkpoint's model_index.json)")
    transformer: PathText | None = Field(
        None, description="the transformer's weights from one file (.safetensors, or a "
        "PyTorch .pth; e.g. wan2.1_t2v_1.3B_bf16.safetensors or a scaled fp8 file), in "
        "diffusers' or the original release's key names, in place of model.source's; "
        "the rest of the pipeline comes from model.source (docs/quantize.md)")
    vae: PathText | None = Field(
        None, description="the VAE's weights from one file, like model.transformer (e.g. "
        "the original Wan release's Wan2.1_VAE.pth)")
    text_encoder: PathText | None = Field(
        None, description="the text encoder's weights from one file, like "
        "model.transformer (e.g. the original Wan release's "
        "models_t5_umt5-xxl-enc-bf16.pth)")
    allow_nonfinite: bool = Field(
        False, description="load weights that hold NaN or infinity (refused otherwise, "
        "naming each tensor; allowed, they are a warning)")


class RuntimeSection(Section):
    platform: Literal["auto", "cpu", "gpu", "tpu"] = Field(
        "auto", description="JAX platform to run on; auto takes what JAX finds"
    )
    cpu_devices: int | None = Field(
        None, ge=1, le=1024, description="virtual CPU devices (development and tests)"
    )
    compile_cache: bool | PathText = Field(
        True, description="true: user cache dir; false: off; a string: that directory"
    )
    text_cache_mb: int = Field(
        256, ge=0, description="MiB of text-encoder outputs a port keeps, so a prompt "
        "seen again (and every empty negative prompt after the first) skips the encoder; "
        "0: encode every time")
    xla_options: dict[str, bool | int | float | str] | None = Field(
        None, description="XLA compiler options for the compiled components (jax.jit "
        "compiler_options), e.g. {xla_cpu_enable_fast_math: false}; null: Porter's "
        "defaults for the platform; {}: none")


class GenerateSection(Section):
    prompt: str | None = Field(
        None, description="what the video shows (required by every family but generic, "
        "and by a generic pipeline that takes a prompt with no default)")
    negative_prompt: str = ""
    image: PathText | None = Field(
        None, description="image-to-video: path of the first frame")
    last_image: PathText | None = Field(
        None, description="first-last-frame-to-video: path of the last frame (with image)")
    video: PathText | None = Field(
        None, description="video-to-video, editing, inpainting: path of the input video "
        "(a folder of image frames, or a .mp4/.webm/.mov/.mkv/.gif file)")
    mask: PathText | None = Field(
        None, description="inpainting and VACE: path of the mask (an image, or a video as "
        "for video); white is generated, black kept")
    control_video: PathText | None = Field(
        None, description="control pipelines: path of the control video (pose, depth, "
        "edges), as for video")
    pose_video: PathText | None = Field(
        None, description="character animation (Wan Animate): the skeleton renders to "
        "follow, as for video")
    face_video: PathText | None = Field(
        None, description="character animation: the face crops whose expressions to "
        "follow, as for video")
    background_video: PathText | None = Field(
        None, description="character replacement: the scene to put the character in, as "
        "for video (with mask: where the character goes)")
    latents: PathText | None = Field(
        None, description="family generic: another run's final latents (its "
        "latents.safetensors) for a pipeline that continues a run (LTX-2's diffusion "
        "decoder)")
    conditions: list[dict[str, Any]] | None = Field(
        None, description="family generic: the pipeline's condition objects (LTX-2's "
        "frames at a frame index with a strength), each a mapping of the condition class's "
        "fields; a string is a path to an image or a video")
    reference_conditions: list[dict[str, Any]] | None = Field(
        None, description="family generic: reference condition objects (LTX-2 HDR and "
        "IC-LoRA), as conditions")
    height: int | None = Field(
        None, ge=8, le=8192, description="pixels (required by every family but generic; "
        "a generic pipeline without the setting takes its own or its input's)")
    width: int | None = Field(None, ge=8, le=8192, description="pixels, as height")
    frames: int | None = Field(
        None, ge=1, le=4096, description="frames to make (required by every family but "
        "generic; a generic pipeline without the setting takes its own default or its "
        "input video's length)")
    steps: int | None = Field(
        None, ge=1, le=10000, description="denoising steps (required by every family but "
        "generic; a generic pipeline that does not denoise, or counts its steps its own "
        "way, takes none; with timesteps or sigmas: their count, unless set beside them)")
    timesteps: Annotated[list[Annotated[float, Field(ge=0)]], Field(
        min_length=1, max_length=10000)] | None = Field(
        None, description="the schedule's timesteps, in the scheduler's units (e.g. [1000, "
        "750, 500, 250]), in place of steps evenly spread: set on the scheduler by the "
        "core's loop (every family but generic), or passed to a generic pipeline that "
        "takes them")
    sigmas: Annotated[list[Annotated[float, Field(ge=0)]], Field(
        min_length=1, max_length=10000)] | None = Field(
        None, description="the schedule's noise levels (flow matching: 1.0 .. 0), which "
        "the scheduler shifts as its configuration says; as timesteps")
    guidance_scale: float = Field(5.0, ge=0.0)
    guidance_scale_2: float | None = Field(
        None, ge=0.0, description="two-expert models: guidance of the low-noise expert "
        "(default: guidance_scale)")
    seed: int = Field(0, ge=0, le=2**64 - 1, description="0 .. 2^64-1 (torch's range)")
    max_sequence_length: int = Field(512, ge=1, le=8192)
    cfg_parallel: bool = Field(
        False, description="run the conditional and unconditional passes as one batch of 2")
    extra: dict[str, Any] = Field(
        default_factory=dict, description="family generic: more keyword arguments for the "
        "pipeline call (e.g. decode_timestep)")

    @model_validator(mode="before")
    @classmethod
    def _steps_of_the_schedule(cls, data):
        # a schedule given step by step counts its steps; a count given too must agree
        # (the scheduler pass's check says so where the recipe set it; a layer that
        # gives a schedule without a count drops a lower layer's: porter.recipe)
        if isinstance(data, dict) and data.get("steps") is None:
            given = data.get("timesteps") or data.get("sigmas")
            if isinstance(given, list) and given:
                data = {**data, "steps": len(given)}
        return data


# One entry per tensor dimension: a mesh axis, null (not split) or a list of
# axes (split over their product). Shorter than the tensor: the rest is null.
Spec = list[str | None | list[str]]


def resolve_aliases(per_component: dict) -> dict:
    """``transformer_2: transformer`` reuses another component's rules (one level)."""
    if not isinstance(per_component, dict):
        return per_component
    resolved = dict(per_component)
    for name, value in per_component.items():
        if isinstance(value, str):
            target = per_component.get(value)
            if not isinstance(target, list):
                raise ValueError(f"{name}: {value!r} is not a component with its own rules")
            resolved[name] = target
    return resolved


class _PerComponentRules(Section):
    """A section whose per-component rule lists may alias each other."""

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data):
        if isinstance(data, dict):
            data = dict(data)
            for key in ("weights", "activations", "overrides"):
                if key in data:
                    data[key] = resolve_aliases(data[key])
        return data


class ShardRule(Section):
    match: str = Field(description="regex, full match on the parameter or buffer name")
    spec: Spec


class ActivationRule(Section):
    module: str = Field(description="regex, full match on the module name")
    spec: Spec


class ShardingSection(_PerComponentRules):
    weights: dict[str, list[ShardRule]] = Field(
        default_factory=dict, description="per component: ordered rules, first match wins")
    inputs: dict[str, Spec] = Field(
        default_factory=dict, description="transformer call arguments -> spec")
    activations: dict[str, list[ActivationRule]] = Field(
        default_factory=dict, description="per component: constrain module outputs")
    report_replicated_mb: float = Field(
        64.0, ge=0, description="report replicated tensors larger than this")


class DtypeRule(Section):
    match: str = Field(description="regex, full match on the parameter or buffer name")
    dtype: Dtype


class DtypesSection(_PerComponentRules):
    components: dict[str, Dtype] = Field(
        default_factory=dict, description="component -> dtype (default: model.dtype)")
    overrides: dict[str, list[DtypeRule]] = Field(
        default_factory=dict, description="per component: tensors kept in another dtype")
    text_embeddings: Dtype | None = Field(
        None, description="dtype of the text conditioning handed to the transformer "
        "(default: the transformer's)")


class LoraAdapter(Section):
    file: PathText = Field(
        description="a .safetensors file, a folder holding one, or a hub id (org/name)")
    weight_name: str | None = Field(
        None, description="the file inside a folder or hub repository (default: "
        "pytorch_lora_weights.safetensors)")
    scale: float = Field(1.0, description="strength: the update is added scale times")
    components: list[str] = Field(
        default_factory=lambda: ["transformer"], min_length=1,
        description="the transformers it applies to (two-expert models: transformer, "
        "transformer_2 or both)")


class SchedulerSection(Section):
    name: str | None = Field(
        None, description="a diffusers scheduler class (any the installed diffusers has), "
        "e.g. FlowMatchEulerDiscreteScheduler; default: the pipeline's own")
    config: dict[str, Any] = Field(
        default_factory=dict, description="its configuration's overrides, e.g. {shift: "
        "5.0} or {flow_shift: 3.0}: the scheduler is made as "
        "from_config(pipe.scheduler.config, **config)")


class QuantizeSection(Section):
    format: Literal["fp8", "int8", "fp8-weights", "int8-weights", "auto"] | None = Field(
        None, description="fp8 (e4m3 weights and activations) or int8 (int8 weights and "
        "activations, int32 sums): 8-bit matmuls; fp8-weights, int8-weights: 8-bit weights, "
        "matmuls in the model's dtype; auto: the 8-bit matmul the chip runs fastest; "
        "null: off. Weights scaled per output channel, activations per token, on the fly")
    components: list[str] | None = Field(
        None, min_length=1, description="the components quantized (default: the "
        "family's transformers; another component needs an include that names its "
        "layers, as the default names the transformer blocks')")
    include: list[str] | None = Field(
        None, description="regexes, full match on linear layers' module names, in every "
        "component named (default: the family's: the layers inside the transformer "
        "blocks)")
    exclude: list[str] | None = Field(
        None, description="regexes of layers kept in the model's dtype (default: the "
        "family's: the blocks' modulation layers)")
    keep_edge_blocks: bool = Field(
        False, description="keep each block list's first and last block in the model's "
        "dtype (their blocks then differ: no scan)")


class PatchRef(Section):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class SetupCall(Section):
    name: str = Field(description="a method of the component (porter.transforms.setup.ALLOWED)")
    params: dict[str, Any] = Field(default_factory=dict, description="its keyword arguments")


class RotarySection(Section):
    precompute: bool = Field(
        False, description="build rotary tables on the host for the recipe's shapes and "
        "hand them to the compiled transformer")


#: three numbers, one per axis of the video's token grid (frames, height, width)
Tokens3 = Annotated[list[Annotated[int, Field(ge=1, le=4096)]],
                    Field(min_length=3, max_length=3)]
Reach3 = Annotated[list[Annotated[int, Field(ge=0, le=4096)]],
                   Field(min_length=3, max_length=3)]


class WindowSection(Section):
    tile: Tokens3 = Field(description="a tile's size in video tokens (frames, height, "
                          "width of the transformer's token grid: latents cut into "
                          "patches); a tile is one block of the kernel")
    reach: Reach3 = Field(description="tiles on each side of a query's own tile whose "
                          "keys it sees, per axis (frames, height, width)")
    global_frames: int = Field(0, ge=0, description="the first N token frames' keys "
                               "every query sees too (a multiple of tile's frames)")
    dense_steps: int = Field(0, ge=0, description="the first N denoising steps run "
                             "dense attention (they lay the video out)")


class AttentionSection(Section):
    backend: str | None = Field(
        None, description="registered backend or 'auto'; null keeps torchax's own lowering")
    cross_backend: str | None = Field(
        None, description="the backend for cross-attention (keys of another length than "
        "the queries: video tokens to text tokens), where it should differ from "
        "`backend` (e.g. cudnn-fp8 for self-attention, cudnn for the short cross-attention "
        "fp8 runs slower); null: `backend`")
    block_q: int = Field(512, ge=1, description="query block (blockwise, splash)")
    block_kv: int = Field(512, ge=1, description="key/value block (blockwise, splash)")
    min_seq_len: int = Field(0, ge=0, description="shorter query sequences keep torchax's lowering")
    skip: list[str] = Field(default_factory=list, description="components left alone, e.g. vae")
    data_axis: str | None = Field(None, description="mesh axis that splits the batch")
    head_axis: str | None = Field(
        None, description="mesh axis that splits heads (or the sequence when heads don't divide)")
    window: WindowSection | None = Field(
        None, description="block-sparse video self-attention: each query sees a 3-D "
        "window of tiles around its own (and the first frames); null: dense")

    def batch_axis(self, axes: dict) -> str | None:
        """The axis a split activation keeps its batch on: ``data_axis``, as attention's
        kernel holds it, where the mesh (``axes``: name -> size) splits over it."""
        axis = self.data_axis
        return axis if axis is not None and axes.get(axis, 1) != 1 else None


class CompileRule(Section):
    methods: list[str] = Field(default_factory=lambda: ["forward"],
                               description="methods jitted; [] runs the component eagerly")
    static_argnames: list[str] = Field(
        default_factory=lambda: ["return_dict"],
        description="arguments that change the program's structure, not its values")
    donate_argnames: list[str] = Field(
        default_factory=list, description="inputs whose buffers the program may reuse; "
        "only for inputs not used again after the call")
    modules: str | None = Field(
        None, description="regex of submodules to compile one by one (e.g. blocks) instead "
        "of the whole component: the glue between them runs eagerly, so value-dependent "
        "Python in the top-level forward keeps working")
    scan: bool | None = Field(
        None, description="run each list of identical blocks as one lax.scan over their "
        "stacked weights: traced and compiled once, whatever the depth (default: the "
        "family's say for its transformers; exact only where blocks run one after "
        "another, each one's outputs the next one's inputs)")


class VerifySection(Section):
    tolerance: float | None = Field(
        None, gt=0, description="max relative error (max |diff| / max |reference|); "
        "default 1e-5 for float32, 5e-2 for 16-bit models, or the quantize format's bound "
        "when larger (docs/quantize.md)")
    modules: str = Field(r"blocks\.\d+", description="regex of the modules compared one by one")
    seed: int = Field(0, ge=0, description="seed of the random inputs")


class OutputSection(Section):
    dir: PathText | None = Field(
        None, description="run directory; default outputs/<recipe name>")
    fps: int = Field(16, ge=1, le=240)
    video: bool = Field(True, description="write video.mp4 (false: only the lossless "
                        "outputs below)")
    frames: Literal["png", "npy"] | None = Field(
        None, description="also write the frames losslessly: png (frames/00000.png, ...) "
        "or npy (frames.npy, uint8 (count, height, width, 3))")
    latents: bool = Field(False, description="also write the final latents "
                          "(latents.safetensors, key 'latents')")
    audio: bool = Field(True, description="where the pipeline makes sound (LTX-2, "
                        "Kandinsky 6 TI2VA, MiniMax-H3, ...): the video carries it (AAC, "
                        "at the pipeline's sample rate, or 48 kHz where AAC has no such "
                        "rate); false: the frames only")
    wav: bool = Field(False, description="also write the sound losslessly (audio.wav, "
                      "32-bit float), where the pipeline makes sound")
    checkpoint_every: int = Field(10, ge=0, description="save denoising progress every N "
                                  "steps, for --resume; 0: only when interrupted")
    stream: bool = Field(True, description="while decoding, write stream.mp4: the frames "
                         "as the VAE makes them, a fragmented MP4 a player starts before "
                         "the video is done (porter serve: GET /jobs/{id}/stream); "
                         "video.mp4 is written as ever. false: none")
    preview_every: int = Field(0, ge=0, description="write preview.png every N denoising "
                               "steps: the current latents as a picture, through a linear "
                               "map fitted to the VAE once (no decode a step); 0: never "
                               "(porter serve's jobs: serve.preview_every)")

    @property
    def streams(self) -> bool:
        """Does a run write its frames as they are decoded (a video, and its stream)?"""
        return self.video and self.stream


class ServeSection(Section):
    warmup: list[dict[str, Any]] = Field(
        default_factory=list, description="porter serve: the jobs to expect, as generate "
        "settings (a job's body, e.g. {height: 480, width: 832, frames: 81}); each runs "
        "once when the server starts, before /health says it is ready, so the first "
        "request of its shape compiles nothing")
    preview_every: int = Field(2, ge=0, description="porter serve: each job's preview.png "
                               "every N denoising steps (GET /jobs/{id}/preview); 0: none")


class RecipeSpec(Section):
    model: ModelSection
    runtime: RuntimeSection = RuntimeSection()
    mesh: Annotated[dict[str, AxisSize], AfterValidator(_few_axes)] = Field(
        default_factory=lambda: {"dp": "auto"},
        description="named device-mesh axes and their sizes; one may be 'auto'; an axis "
        "named sp splits the transformer's tokens (sequence parallelism)",
    )
    generate: GenerateSection
    patches: list[str | PatchRef] = Field(
        default_factory=list, description="registered patch names, in the order applied")
    setup: dict[str, list[str | SetupCall]] = Field(
        default_factory=dict, description="per component: diffusers' own set-up methods "
        "called after loading, before porting (e.g. vae: [enable_tiling])")
    scheduler: SchedulerSection = Field(
        SchedulerSection(), description="the scheduler: another class, its settings")
    lora: list[LoraAdapter] = Field(
        default_factory=list, description="LoRA adapters fused into the weights on the host, "
        "before dtypes, sharding and compile")
    dtypes: DtypesSection = DtypesSection()
    quantize: QuantizeSection = Field(
        QuantizeSection(), description="8-bit weights and matmuls (docs/quantize.md)")
    sharding: ShardingSection = ShardingSection()
    rotary: RotarySection = RotarySection()
    attention: AttentionSection = AttentionSection()
    compile: dict[str, CompileRule] = Field(
        default_factory=dict, description="per component; replaces the family's defaults")
    cache: dict[str, Any] = Field(
        default_factory=dict, description="step caching: one method and its parameters, "
        "e.g. {method: magcache, threshold: 0.06, mag_ratios: ratios.json}; methods: "
        "magcache, first_block, taylorseer, guidance (docs/caching.md)")
    verify: VerifySection = VerifySection()
    output: OutputSection = OutputSection()
    serve: ServeSection = ServeSection()
