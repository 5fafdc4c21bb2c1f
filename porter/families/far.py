"""AnyFlow FAR (``AnyFlowFARPipeline``, frame-autoregressive) with its transformer's calls
at fixed shapes, so a longer video compiles no new programs (up to the model's own
length, below).

As diffusers wrote it, FAR's transformer takes the chunks made so far as a static
argument and its cache step runs the whole video so far again: each chunk compiled
programs of its own (15 for the released 81-frame layout, more for a longer video).
Here the pipeline's loop runs as written; for the length of its call its transformer
is ``FixedSize``, which answers the same two calls from a cache of fixed capacity:

- a denoising call (``step``) attends over the whole cache, its rows past what is
  filled masked, so its shapes depend on the chunk's length alone;
- a cache call (``cache``) computes only what changed since the last one, as the
  model's block-causal mask allows: the chunk that leaves the full-resolution window
  for the compressed context (its keys then never change again), and the chunks left
  in the window, attending to the compressed context cached before. Its attention
  runs a chunk's queries at a time, each over the keys it sees (a mask of keys
  alone, which splash runs on a TPU).

Where rows begin (frames and filled rows) goes in as a small integer tensor, not as
program constants. The cache holds the compressed frames of the longer of the call's
and the model's own chunk layout (the released checkpoints': 81 frames): any shorter
video runs the same programs, a longer one compiles its own once. The attention over
masked rows costs what the rows cost: a chunk attends to the whole capacity, where
the model's own call attends to what is filled.

The model's own numerics are kept, including a denoising call's keys padded with
zeros to a multiple of 128 queries, which the model attends to (they weigh in its
softmax; a cache call masks them). Two things the model does for every token or every
cached row are done once instead, with the same values: a frame's time embedding is
applied to its tokens as a frame's (``_conditions``), not repeated into a tensor the
size of the tokens, and a key is rotated by its position once, when it is made, so
the cache keeps rotated keys (``_projected``). On a TPU a call's bytes bound it, not
its arithmetic (benchmarks/README.md, "Chunk by chunk"), and under ``tp`` each
block's residual is split along its width (``porter.families.width``, the generic
family's default) and the cache's heads over the same axis (``cache_split``). ``step``
and ``cache`` are the transformer's compiled functions in a run (the generic family's
``compiled_functions``) and run eagerly on a plain PyTorch module."""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from porter.errors import UsageError
from porter.families import width
from porter.families.base import compiled_function
from porter.shims.compat import import_module

if TYPE_CHECKING:
    from porter.recipe import Recipe

#: the pipeline whose call this module serves
PIPELINE = "AnyFlowFARPipeline"


@dataclass(frozen=True)
class Layout:
    """A call's static sizes: what its programs are compiled for (a static argument:
    hashed, and not walked as a tuple of inputs would be)."""

    full: int  # tokens a latent frame at full resolution
    compressed: int  # tokens a latent frame in the compressed context
    keep: int  # chunks the cache keeps at full resolution (full_chunk_limit - 1)
    longest: int  # frames of the longest chunk
    context: int  # compressed frames the cache holds
    grid: tuple[int, int]  # latent height and width

    @property
    def frames(self) -> int:
        """Frames the rotary tables cover: the context, the window and a chunk."""
        return self.context + (self.keep + 1) * self.longest


def context_frames(partition, limit: int) -> int:
    """Compressed frames a video in chunks ``partition`` caches at most: every chunk
    but the last ``limit`` (the model's ``full_chunk_limit``)."""
    return sum(partition[:max(0, len(partition) - limit)])


def layout(config, partition, height: int, width: int) -> Layout:
    """The fixed sizes for a call of chunks ``partition`` at latent ``height`` x
    ``width``: the cache sized for the longer of ``partition`` and the model's own
    layout (``config.chunk_partition``)."""
    patch, compressed = config.patch_size, config.compressed_patch_size
    limit = config.full_chunk_limit
    own = list(config.chunk_partition)
    return Layout(full=(height // patch[1]) * (width // patch[2]),
                  compressed=(height // compressed[1]) * (width // compressed[2]),
                  keep=limit - 1, longest=max(max(partition), max(own)),
                  context=max(context_frames(partition, limit), context_frames(own, limit)),
                  grid=(height, width))


def is_far(cls) -> bool:
    """Is pipeline class ``cls`` AnyFlow FAR's, or built on it?"""
    return any(base.__name__ == PIPELINE for base in cls.__mro__)


def cache_split(recipe: Recipe, cls, axes: dict, config) -> dict:
    """The cache's placement in FAR's calls (their keyword inputs ``context`` and
    ``window``, layers x 2 x batch x heads x rows x head width): its heads over the
    axis the residual's width is split over (``width.split_axes``: attention's head
    axis), where they divide it, and the batch on its data axis; whatever the recipe's
    own activation rules (``config``: the transformer's, None: not known, no split).
    Left to the compiler, a run kept the compressed context whole on every chip (4.2
    GB a chip for the 14B model's 13 compressed frames, against 0.5 split over 8), and
    ``porter compile``, which places an input as the run does, held both whole."""
    if cls is None or not is_far(cls):  # (the residual's split is not FAR's alone)
        return {}
    found = width.split_axes(recipe, cls, axes)
    if found is None or config is None or config.num_attention_heads % axes[found[1]]:
        return {}
    batch, heads = found
    return {name: [None, None, batch, heads, None, None] for name in ("context", "window")}


def problems(recipe: Recipe, cls) -> list:
    """What a recipe of pipeline ``cls`` asks that FAR's fixed-shape calls cannot do:
    its transformer compiled in pieces (a step cache that skips blocks, or
    ``compile.transformer.modules``), which would run ``step`` and ``cache`` op by op
    around the pieces, with nothing skipped."""
    if not is_far(cls):
        return []
    found = []
    if recipe.cache and recipe.cache.get("method") != "guidance":
        found.append(recipe.problem(
            "cache", "AnyFlow FAR's transformer runs its own fixed-shape calls "
            "(porter/families/far.py), which a cache that skips blocks cannot see into",
            hint="leave the cache section out (the guidance cache is taken)"))
    rule = recipe.compile.get("transformer")
    if rule is not None and rule.modules is not None:
        found.append(recipe.problem(
            "compile.transformer.modules", "AnyFlow FAR's transformer is compiled as "
            "its fixed-shape calls, not module by module", hint="leave modules out"))
    return found


# ------------------------------------------------------------ the compiled functions

def step(model, hidden_states, timestep, r_timestep, text, context, window, where,
         layout: Layout):
    """A chunk's denoising call: latents (batch, frames, channels, height, width) to
    the model's prediction of the same shape. ``context`` and ``window``: the cache's
    keys and values (layers, 2, batch, heads, rows, head width, the keys rotated;
    None before the first cache call); ``where``: the filled context rows, the filled
    window rows, the chunk's first frame."""
    import torch

    chunk = hidden_states.shape[1]
    context, window = empty(model, hidden_states, layout) if context is None \
        else (context, window)
    tokens = _patches(model.patch_embedding, hidden_states)
    temb, projection, text, groups = _conditions(model, timestep, r_timestep, text, chunk,
                                                 layout)
    rope = _rows(_tables(model, layout).full, where[2], chunk)  # the chunk's own rows
    queries = tokens.shape[1]
    pad = math.ceil(queries / 128) * 128 - queries  # the model's zero keys, attended
    rows = torch.arange(context.shape[-2] + window.shape[-2], device=tokens.device)
    filled = torch.cat([rows[:context.shape[-2]] < where[0],
                        rows[context.shape[-2]:] - context.shape[-2] < where[1],
                        torch.ones(queries + pad, dtype=torch.bool, device=tokens.device)])[None]
    for index, block in enumerate(model.blocks):
        def attend(attn, x, cached=(context[index], window[index])):
            return _attention(attn, x, cached, rope, filled, pad)

        tokens = _block(block, tokens, text, projection, groups, attend)
    shift, scale = (model.scale_shift_table + temb.unsqueeze(2)).chunk(2, dim=2)
    tokens = _by_frame(model.norm_out(tokens.float()), groups, _modulated,
                       scale.squeeze(2), shift.squeeze(2)).type_as(tokens)
    height, width = layout.grid
    return model._unpack_latent_sequence(model.proj_out(tokens), num_frames=chunk,
                                         height=height, width=width,
                                         patch_size=model.config.patch_size[1])


def cache(model, hidden_states, text, context, where, layout: Layout,
          chunks: tuple[int, ...], leaving: int):
    """A cache call after a chunk: the keys and values of the chunk leaving the window
    (its first ``leaving`` frames, compressed; 0: none leaves yet) written after the
    context's filled rows, and those of the window's ``chunks`` (frames each), which
    replace the window's. ``hidden_states``: those frames' clean latents, in order;
    ``where``: the filled context rows, the leaving chunk's first frame, the window's
    first frame. Returns the new (context, window)."""
    import torch
    import torch.nn.functional as F

    device = hidden_states.device
    frames = hidden_states.shape[1]
    context = empty(model, hidden_states, layout)[0] if context is None else context
    parts = [_patches(model.far_patch_embedding, hidden_states[:, :leaving])] \
        if leaving else []
    parts.append(_patches(model.patch_embedding, hidden_states[:, leaving:]))
    tokens = torch.cat(parts, dim=1)
    zeros = torch.zeros(hidden_states.shape[:2], device=device)
    _, projection, text, groups = _conditions(model, zeros, zeros, text, frames - leaving,
                                              layout)
    tables = _tables(model, layout)
    rope = torch.cat([_rows(tables.compressed, where[1], leaving),
                      _rows(tables.full, where[2], frames - leaving)])
    # the model's block-causal mask among the new tokens (a chunk sees itself and the
    # chunks before) and every filled context row: taken a chunk at a time, each
    # chunk's queries see the filled rows and the new tokens up to its own end, a mask
    # of keys alone (splash's segment ids on a TPU; one mask over every query and key
    # ran the blockwise fallback, most of a cache call's bytes)
    sizes = ([leaving * layout.compressed] if leaving else []) \
        + [n * layout.full for n in chunks]
    ends = list(itertools.accumulate(sizes))
    seen = torch.arange(context.shape[-2], device=device) < where[0]
    keys, values = [], []
    for index, block in enumerate(model.blocks):
        def attend(attn, x, cached=context[index]):
            query, key, value = _projected(attn, x, rope)
            keys.append(key)
            values.append(value)
            out = [F.scaled_dot_product_attention(
                query[:, :, start:end], torch.cat([cached[0], key[:, :, :end]], dim=2),
                torch.cat([cached[1], value[:, :, :end]], dim=2),
                attn_mask=torch.cat([seen, seen.new_ones(end)])[None])
                for start, end in zip([0, *ends], ends)]
            return _output(attn, torch.cat(out, dim=2), query)

        tokens = _block(block, tokens, text, projection, groups, attend)
    new = torch.stack([torch.stack([k, v]) for k, v in zip(keys, values)])
    left = leaving * layout.compressed
    rows = context.shape[-2]
    if left:  # the leaving chunk's rows written after the filled ones
        position = torch.arange(rows, device=device)
        taken = (position >= where[0]) & (position < where[0] + left)
        source = (position - where[0]).clamp(0, left - 1)
        context = torch.where(taken[:, None], new[..., :left, :].index_select(-2, source),
                              context)
    window = new[..., left:, :]
    spare = layout.keep * layout.longest * layout.full - window.shape[-2]
    window = torch.cat([window, window.new_zeros(*window.shape[:-2], spare,
                                                  window.shape[-1])], dim=-2)
    return context, window


def empty(model, hidden_states, layout: Layout):
    """The cache before the first chunk, (context, window): zeros made in the program,
    placed as the compiler places the programs' own (not on one device, as a tensor
    made on the host would be)."""
    import torch

    config = model.config
    shape = (config.num_layers, 2, hidden_states.shape[0], config.num_attention_heads)
    made = {"device": hidden_states.device, "dtype": hidden_states.dtype}
    return (torch.zeros(*shape, layout.context * layout.compressed,
                        config.attention_head_dim, **made),
            torch.zeros(*shape, layout.keep * layout.longest * layout.full,
                        config.attention_head_dim, **made))


# ------------------------------------------------------------- the model's pieces

def _patches(embedding, latents):
    """(batch, frames, channels, h, w) latents as (batch, tokens, width) tokens."""
    return embedding(latents.permute(0, 2, 1, 3, 4)).flatten(2, 4).transpose(1, 2)


def _conditions(model, timestep, r_timestep, text, full: int, layout: Layout):
    """The model's time embedding and its projection by six for each frame, the
    text's embedding, and the frames' groups, (frames, tokens a frame) each: the
    compressed frames, then the last ``full``. The model's own call repeats a frame's
    embedding for each of its tokens; every token of a frame has the same, so here it
    stays a frame's and each block applies it frame by frame (``_by_frame``): a
    block then reads (frames, 6, width) values, not six tensors the size of the
    tokens (in float32, 0.58 GB a block for a 3-frame chunk of the 14B model)."""
    import torch

    embedder = model.condition_embedder
    delta = {"r": r_timestep, "t-r": timestep - r_timestep}[embedder.deltatime_type]
    frames = timestep.shape[1]
    groups = tuple((count, tokens) for count, tokens in
                   ((frames - full, layout.compressed), (full, layout.full)) if count > 0)
    made, first = [], 0
    for count, _ in groups:  # the model embeds the two kinds of frame apart: so here
        made.append(embedder.forward_timestep(timestep[:, first:first + count],
                                              delta[:, first:first + count], text, 1))
        first += count
    temb = torch.cat([m[0] for m in made], dim=1)
    projection = torch.cat([m[1] for m in made], dim=1)
    return temb, projection.unflatten(2, (6, -1)), embedder.text_embedder(text), groups


def _by_frame(tokens, groups, apply, *values):
    """``apply(tokens, *values)`` with each (batch, frames, width) value broadcast over
    its frame's tokens: the tokens (batch, tokens, width) taken a frame at a time."""
    import torch

    parts, token, frame = [], 0, 0
    for count, per in groups:
        for _ in range(count):
            taken = [value[:, frame, None] for value in values]
            parts.append(apply(tokens[:, token:token + per], *taken))
            token, frame = token + per, frame + 1
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _modulated(x, scale, shift):
    return x * (1 + scale) + shift


def _gated(x, gate):
    return x * gate


class _Tables(NamedTuple):
    full: object  # (frames, tokens a frame, head width / 2), complex
    compressed: object  # the same on the compressed grid, the context's frames


def _tables(model, layout: Layout) -> _Tables:
    """The model's rotary tables for the layout's frames (constants of a program)."""
    device = model.patch_embedding.weight.device
    height, width = layout.grid
    patch, compressed = model.config.patch_size, model.config.compressed_patch_size
    frames = min(layout.frames, model.rope.max_seq_len)
    # the rotary module keeps its table between calls unless it is told it is being
    # compiled; built inside a trace, the kept table would be that trace's: it is built
    # afresh and the module's own left as it was
    kept = getattr(model.rope, "_freqs_cache", None)
    model.rope._freqs_cache = None
    try:
        full = model.rope._forward_full_frame(frames, height // patch[1],
                                              width // patch[2], device)
        small = model.rope._forward_compressed_frame(
            layout.context, height // compressed[1], width // compressed[2], device)
    finally:
        model.rope._freqs_cache = kept
    small = small.reshape(layout.context, layout.compressed, model.config.attention_head_dim // 2)
    return _Tables(full.flatten(1, 2), small)


def _rows(table, first, frames: int):
    """``frames`` frames of a (frames, tokens, width) table from frame ``first`` (a
    tensor), flattened to rows; frames past the table repeat its last (masked rows
    only read them)."""
    import torch

    index = (first + torch.arange(frames, device=table.device)).clamp(max=table.shape[0] - 1)
    return table.index_select(0, index).flatten(0, 1)


def _block(block, tokens, text, projection, groups, attend):
    """One of the model's blocks (``AnyFlowTransformerBlock.forward``) with its
    self-attention ``attend(attn, normed tokens)`` and its modulation by frame
    (``projection``: batch, frames, 6, width)."""
    parts = (block.scale_shift_table + projection.float()).chunk(6, dim=2)
    shift, scale, gate, c_shift, c_scale, c_gate = (p.squeeze(2) for p in parts)
    normed = _by_frame(block.norm1(tokens.float()), groups, _modulated, scale, shift)
    attended = attend(block.attn1, normed.type_as(tokens))
    tokens = (tokens.float() + _by_frame(attended, groups, _gated, gate)).type_as(tokens)
    normed = block.norm2(tokens.float()).type_as(tokens)
    tokens = tokens + block.attn2(hidden_states=normed, encoder_hidden_states=text)
    normed = _by_frame(block.norm3(tokens.float()), groups, _modulated, c_scale, c_shift)
    fed = block.ffn(normed.type_as(tokens)).float()
    return (tokens.float() + _by_frame(fed, groups, _gated, c_gate)).type_as(tokens)


def _attention(attn, x, cached, rope, mask, pad: int):
    """The model's causal self-attention (``AnyFlowCausalAttnProcessor``) of a
    denoising call over the cached keys and values (``cached``: parts of the cache,
    each (2, batch, heads, rows, head width)), then ``x``'s own, then the model's
    ``pad`` zero keys, joined in one copy; ``mask`` (keys) says which it sees."""
    import torch
    import torch.nn.functional as F

    query, key, value = _projected(attn, x, rope)
    keys, values = (torch.cat([*(part[side] for part in cached), mine,
                               *([mine.new_zeros(*mine.shape[:2], pad, mine.shape[3])]
                                 if pad else [])], dim=2)
                    for side, mine in ((0, key), (1, value)))
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask)
    return _output(attn, out, query)


def _projected(attn, x, rope):
    """``x``'s queries, keys and values (batch, heads, tokens, head width), the queries
    and keys rotated by their positions (``rope``: the rows of ``x``'s tokens).

    The cache keeps keys so, with their rotary embedding applied. The model keeps them
    without and rotates the whole cache at every call; a row's position never changes
    once cached, and the rotation is elementwise, so rotating each key once, when it
    is made, gives the same keys, and a call no longer rotates its whole cache in
    float32."""
    rotate = import_module(type(attn).__module__).apply_rotary_emb
    dtype = x.dtype
    query, key, value = attn.to_q(x), attn.to_k(x), attn.to_v(x)
    query, key = attn.norm_q(query).to(dtype), attn.norm_k(key).to(dtype)
    query, key, value = (t.unflatten(2, (attn.heads, -1)).transpose(1, 2)
                         for t in (query, key, value))
    query, key = (rotate(t, rope[None, None]) for t in (query, key))
    return query, key, value


def _output(attn, out, query):
    """The attention's output (batch, heads, tokens, head width) projected back."""
    out = out.transpose(1, 2).flatten(2, 3).type_as(query)
    return attn.to_out[1](attn.to_out[0](out))


# ---------------------------------------------------------------- the pipeline's side

class FixedSize:
    """The pipeline's transformer for one call: its cache calls and denoising calls
    answered by ``cache`` and ``step`` at fixed shapes; a call without a cache (the
    pipeline's ``use_kv_cache=False``) passed to the transformer as it is.
    ``partition``: the call's chunks."""

    def __init__(self, transformer, partition):
        self._target = transformer
        self._partition = list(partition)
        self._layout = None
        self._context = self._window = None

    def __getattr__(self, name):
        return getattr(self._target, name)

    @property
    def config(self):
        """The transformer's configuration as the pipeline reads it: no layers, so it
        allocates no cache of its own (sized by the video's length, on one device: 17
        GiB for the 14B model's 81 frames), which only this object's calls would read;
        its other settings as they are."""
        return _Configuration(self._target.config)

    def build_attention_mask(self, **_):
        """No mask: a cache call here makes its own (the model's, built over the whole
        video so far, would be thrown away)."""
        return None

    def __call__(self, hidden_states, timestep, r_timestep, encoder_hidden_states, *,
                 chunk_partition, kv_cache=None, kv_cache_flag=None, attention_kwargs=None,
                 return_dict=True, attention_mask=None, **rest):
        if kv_cache is None:
            return self._target(hidden_states=hidden_states, timestep=timestep,
                                r_timestep=r_timestep,
                                encoder_hidden_states=encoder_hidden_states,
                                chunk_partition=chunk_partition,
                                kv_cache_flag=kv_cache_flag,
                                attention_kwargs=attention_kwargs, return_dict=return_dict,
                                attention_mask=attention_mask, **rest)
        _refuse(attention_kwargs, rest)
        if self._layout is None:
            height, width = hidden_states.shape[-2:]
            self._layout = layout(self._target.config, self._partition, height, width)
        if kv_cache_flag.get("is_cache_step"):
            sample = self._cache(hidden_states, encoder_hidden_states, chunk_partition)
        else:
            sample = self._step(hidden_states, timestep, r_timestep, encoder_hidden_states,
                                chunk_partition)
        if not return_dict:
            return sample, kv_cache
        output = import_module(type(self._target).__module__).AnyFlowFARTransformerOutput
        return output(sample=sample, kv_cache=kv_cache)

    def _step(self, hidden_states, timestep, r_timestep, text, partition):
        lay, chunk = self._layout, len(partition) - 1
        compressed = max(0, len(partition) - (lay.keep + 1))  # chunks in the context
        if partition[-1] > lay.longest or sum(partition[:compressed]) > lay.context:
            raise ValueError(f"chunks {partition} exceed the layout {self._partition}")
        where = _where([sum(partition[:compressed]) * lay.compressed,
                        sum(partition[compressed:chunk]) * lay.full,
                        sum(partition[:chunk])], hidden_states)
        # the cache by name: placed by its keywords (``cache_split``, or the recipe's
        # sharding.inputs)
        return compiled_function(self._target, "far_step", step)(
            hidden_states, timestep, r_timestep, text, context=self._context,
            window=self._window, where=where, layout=lay)

    def _cache(self, hidden_states, text, partition):
        lay, chunk = self._layout, len(partition) - 1
        leaving = chunk - lay.keep  # the chunk that leaves the window now, if any
        first = sum(partition[:leaving]) if leaving >= 0 else 0
        window = partition[leaving + 1:] if leaving >= 0 else partition
        frames = partition[leaving] if leaving >= 0 else 0
        where = _where([first * lay.compressed, first, first + frames], hidden_states)
        self._context, self._window = compiled_function(self._target, "far_cache", cache)(
            hidden_states[:, first:], text, context=self._context, where=where, layout=lay,
            chunks=tuple(window), leaving=frames)


def _refuse(attention_kwargs, rest: dict) -> None:
    """What the fixed-shape calls do not take: a LoRA scale other than 1 (the model's
    only use of ``attention_kwargs``; Porter fuses a recipe's adapters at their scale),
    and the training rollout's inputs, which the pipeline never gives."""
    other = {key: value for key, value in (attention_kwargs or {}).items()
             if not (key == "scale" and value == 1.0)}
    given = sorted(key for key, value in rest.items() if value is not None)
    named = [f"attention_kwargs.{key}" for key in other] + given
    if named:
        raise UsageError(f"AnyFlow FAR's fixed-shape calls take no {', '.join(named)}",
                         hint="fuse a LoRA adapter at its scale (the recipe's lora section)")


def _where(values, like):
    """Where rows begin: a small integer tensor beside ``like`` (an input of a
    program, not a constant of it)."""
    import torch

    return torch.tensor(values, dtype=torch.int32, device=like.device)


class _Configuration:
    """A configuration read through, less its layers (``FixedSize.config``)."""

    def __init__(self, config):
        self._config = config

    def __getattr__(self, name):
        return 0 if name == "num_layers" else getattr(self._config, name)


@contextlib.contextmanager
def fixed_size(pipe, call: dict):
    """``pipe``'s transformer ``FixedSize`` while the block runs, where ``pipe`` is an
    ``AnyFlowFARPipeline`` (or built on one) with a transformer; ``call``: the keyword
    arguments of its call (its ``chunk_partition``, else the model's own). Works on a
    plain diffusers pipeline too."""
    transformer = pipe.__dict__.get("transformer")
    if not is_far(type(pipe)) or transformer is None or isinstance(transformer, FixedSize):
        yield
        return
    partition = call.get("chunk_partition") or transformer.config.chunk_partition
    # set in the instance's dict: the pipeline's setattr would register it as a
    # component in its configuration
    pipe.__dict__["transformer"] = FixedSize(transformer, partition)
    try:
        yield
    finally:
        pipe.__dict__["transformer"] = transformer
