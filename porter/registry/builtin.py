"""What the core registers like a plugin would: the generic family, generic patches,
attention backends."""

from __future__ import annotations

from porter.families import rotary_halves
from porter.families.generic import GenericFamily
from porter.registry.hookspecs import hookimpl
from porter.shims import fixes as torchax_fixes
from porter.shims import flex, setitem
from porter.shims.patch import Patch
from porter.transforms.attention import BUILTIN
from porter.transforms.attention import flex as flex_attention


def _always(value):
    def replacement(original, **_):
        def constant(*args, **kwargs):
            return value
        constant.__doc__ = f"patched by porter: always {value!r} (was {original!r})"
        return constant
    return replacement


COMPILING = Patch(
    name="core.report_compiling",
    target="torch.compiler:is_compiling",
    doc="Make torch.compiler.is_compiling() return True, so model code takes the branches "
        "it keeps for graph capture (diffusers skips value-dependent checks and "
        "data-dependent shortcuts under it), which also cannot run under JAX tracing.",
    replacement=_always(True),
    fits="torch>=2.3,<2.14",
)

NO_TORCH_ASSERT = Patch(
    name="core.no_torch_assert",
    target="torch:_assert",
    doc="Turn torch._assert into a no-op: asserts on tensor values need a concrete value, "
        "which a traced (compiled) program does not have.",
    replacement=_always(None),
    fits="torch>=1.8,<2.14",
)

SETITEM = Patch(
    name="core.setitem",
    target="torchax.tensor:Tensor.__setitem__",
    doc="Indexed assignment as PyTorch does it: a value's leading size-1 dimensions are "
        "dropped before broadcasting (batch[i] = x[None]); assignment into strided slices "
        "(out[..., 0::2] = a) is an elementwise pad + select that XLA fuses, instead of a "
        "scatter, same result. Applied on every run.",
    replacement=setitem.setitem,
    fits="torchax>=0.0.11,<0.0.14",
)


DEEPCOPY = Patch(
    name="core.deepcopy",
    target="torch._tensor:Tensor.__deepcopy__",
    doc="copy.deepcopy of tensors inside torchax's environment (a pipeline that "
        "deep-copies its scheduler): host tensors copied by PyTorch with torchax's modes "
        "set aside, torchax tensors around the same immutable array. Applied on every run.",
    replacement=torchax_fixes.deepcopy,
    fits="torchax>=0.0.11,<0.0.14",
)

VIEW_INDEX = Patch(
    name="core.view_index",
    target="torchax.view:View.__getitem__",
    doc="List and tensor indexing of a torchax view (t[:5][[0, -1]]), which indexes the "
        "view's missing array in torchax: the view is made a tensor first, as such "
        "indexing copies in PyTorch too. Applied on every run.",
    replacement=torchax_fixes.view_getitem,
    fits="torchax>=0.0.11,<0.0.14",
)

BLOCK_MASK = Patch(
    name="core.block_mask",
    target="torch.nn.attention.flex_attention:create_block_mask",
    doc="Flex attention's create_block_mask as a mask whose every block is partial, "
        "built without evaluating its mask_mod (torch.vmap over torchax's tensors fails); "
        "core.flex_attention then applies the mask_mod to every score. Applied on every "
        "run, in every module that imported the function.",
    replacement=flex.dense_block_mask,
    fits="torch>=2.5,<2.14",
    imported_by_name=True,
)

FLEX_ATTENTION = Patch(
    name="core.flex_attention",
    target="torch.nn.attention.flex_attention:flex_attention",
    doc="Flex attention (a higher-order operator torchax cannot lower) as attention "
        "with its score_mod and the block mask's mask_mod applied to every score, softmax "
        "in float32: every score at once, or, beyond 256 MiB of scores, block by block "
        "with an online softmax, skipping the blocks the mask leaves empty where it is "
        "alike over batch and heads. Applied on every run, in every module that "
        "imported it.",
    replacement=flex_attention.flex_attention,
    fits="torch>=2.5,<2.14",
    imported_by_name=True,
)

TYPE_AS = Patch(
    name="core.type_as",
    target="torchax.tensor:Tensor.type_as",
    doc="x.type_as(other) as PyTorch does it: a new tensor of other's dtype (torchax casts "
        "x in place, and fails on a view as other). Applied on every run.",
    replacement=torchax_fixes.type_as,
    fits="torchax>=0.0.11,<0.0.14",
)


VIEW_TOLIST = Patch(
    name="core.view_tolist",
    target="torchax.view:View.tolist",
    doc="A torchax view's values as a Python list (grid_sizes[0].tolist()), which "
        "PyTorch refuses for a tensor subclass: the view is made a tensor first. Applied "
        "on every run.",
    replacement=torchax_fixes.view_tolist,
    fits="torchax>=0.0.11,<0.0.14",
)

VIEW_OF_VIEW = Patch(
    name="core.view_of_view",
    target="torchax.view:View.view",
    doc="x[:, a:b].view(shape) as a view of the view (torchax's views are slices only: "
        "it copied, and an assignment into it never reached x). Applied on every run.",
    replacement=torchax_fixes.view_of_view,
    fits="torchax>=0.0.11,<0.0.14",
)

HOST_INPLACE = Patch(
    name="core.host_inplace",
    target="torchax.ops.op_base:InplaceOp.__call__",
    doc="An in-place op on a host tensor with device operands (table[indices] = x, the "
        "table made with no device): run on a device copy and copied back, so the host "
        "tensor changes as in PyTorch (torchax mutates only its own tensors). Applied on "
        "every run.",
    replacement=torchax_fixes.host_inplace,
    fits="torchax>=0.0.11,<0.0.14",
)

WAN_ROTARY_HALVES = Patch(
    name="core.wan_rotary_halves",
    target="diffusers.models.transformers.transformer_wan:WanAttnProcessor.__call__",
    doc="Wan's self-attention with its queries and keys rotated in halves order (each "
        "head's channels as every pair's first part, then every second) instead of "
        "interleaved: the same scores (queries and keys share the order), none of the "
        "broadcasts a TPU spends on writing pairs back interleaved "
        "(porter/families/rotary_halves.py). Every Wan run applies it.",
    replacement=rotary_halves.wan_processor,
    fits="diffusers>=0.35,<0.43",
)

SKYREELS_V2_ROTARY_HALVES = Patch(
    name="core.skyreels_v2_rotary_halves",
    target="diffusers.models.transformers.transformer_skyreels_v2:SkyReelsV2AttnProcessor"
           ".__call__",
    doc="SkyReels-V2's self-attention (Wan's processor, copied) with its queries and keys "
        "rotated in halves order, as core.wan_rotary_halves does Wan's.",
    replacement=rotary_halves.wan_processor,
    fits="diffusers>=0.36,<0.43",
)

CHRONOEDIT_ROTARY_HALVES = Patch(
    name="core.chronoedit_rotary_halves",
    target="diffusers.models.transformers.transformer_chronoedit:WanAttnProcessor.__call__",
    doc="ChronoEdit's self-attention (Wan's processor, copied) with its queries and keys "
        "rotated in halves order, as core.wan_rotary_halves does Wan's.",
    replacement=rotary_halves.wan_processor,
    fits="diffusers>=0.36,<0.43",
)

WAN_ANIMATE_ROTARY_HALVES = Patch(
    name="core.wan_animate_rotary_halves",
    target="diffusers.models.transformers.transformer_wan_animate:WanAttnProcessor.__call__",
    doc="Wan-Animate's self-attention (Wan's processor, copied) with its queries and keys "
        "rotated in halves order, as core.wan_rotary_halves does Wan's.",
    replacement=rotary_halves.wan_processor,
    fits="diffusers>=0.36,<0.43",
)

HELIOS_ROTARY_HALVES = Patch(
    name="core.helios_rotary_halves",
    target="diffusers.models.transformers.transformer_helios:apply_rotary_emb_transposed",
    doc="Helios's rotation of its self-attention's queries and keys in halves order, as "
        "core.wan_rotary_halves does Wan's: the same scores, fewer TPU cycles.",
    replacement=rotary_halves.helios_rotation,
    fits="diffusers>=0.37,<0.43",
)


@hookimpl
def porter_register_patches(register):
    for patch in (COMPILING, NO_TORCH_ASSERT, SETITEM, DEEPCOPY, VIEW_INDEX, TYPE_AS,
                  VIEW_TOLIST, VIEW_OF_VIEW, HOST_INPLACE,
                  BLOCK_MASK, FLEX_ATTENTION, WAN_ROTARY_HALVES, SKYREELS_V2_ROTARY_HALVES,
                  CHRONOEDIT_ROTARY_HALVES, WAN_ANIMATE_ROTARY_HALVES, HELIOS_ROTARY_HALVES):
        register(patch)


@hookimpl
def porter_register_families(register):
    register(GenericFamily())


@hookimpl
def porter_register_attention(register):
    for backend in BUILTIN:
        register(backend)
