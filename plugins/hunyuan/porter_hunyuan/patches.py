"""HunyuanVideo-specific patches, usable outside Porter in a ``with`` block."""

from __future__ import annotations

from porter.transforms import rotary
from porter.transforms.patches import Patch
from porter_hunyuan import transformer15

ROPE_CACHE = Patch(
    name="hunyuan.rope_cache",
    target="diffusers.models.transformers.transformer_hunyuan_video:"
           "HunyuanVideoRotaryPosEmbed.forward",
    doc="HunyuanVideo builds its rotary tables inside forward (torch.arange + meshgrid on "
        "the device, every step). Serve them from tables built once on the host for the "
        "recipe's latent grid (recipe: rotary.precompute: true); other grids fall back.",
    replacement=rotary.cached_forward,
    fits="diffusers>=0.32,<0.43",
)

ROPE_CACHE_15 = Patch(
    name="hunyuan.rope_cache_15",
    target="diffusers.models.transformers.transformer_hunyuan_video15:"
           "HunyuanVideo15RotaryPosEmbed.forward",
    doc="The same for HunyuanVideo 1.5's rotary module.",
    replacement=rotary.cached_forward,
    fits="diffusers>=0.36,<0.43",
)


def by_frames(query, key, value, frames: int, per_frame: int):
    """Attention of ``query``, ``key``, ``value`` (batch, heads, frames x per_frame,
    width) in which each frame's queries see the keys of that frame and the frames
    before it: one unmasked attention per frame, never the tokens x tokens mask."""
    import torch

    return torch.cat([torch.nn.functional.scaled_dot_product_attention(
        query[:, :, t * per_frame:(t + 1) * per_frame], key[:, :, :(t + 1) * per_frame],
        value[:, :, :(t + 1) * per_frame]) for t in range(frames)], dim=2)


def frame_causal_attention(attn, tokens, frames: int, per_frame: int):
    """diffusers' attention processor (AttnProcessor2_0) on ``tokens`` (batch, frames x
    per_frame, channels), each frame's queries attending to the keys of that frame and
    the frames before it: the frame-causal mask the VAE builds as a float matrix, as one
    unmasked attention per frame instead."""

    residual, batch = tokens, tokens.shape[0]
    if attn.group_norm is not None:  # over the whole sequence, as the processor does
        tokens = attn.group_norm(tokens.transpose(1, 2)).transpose(1, 2)
    query, key, value = attn.to_q(tokens), attn.to_k(tokens), attn.to_v(tokens)
    heads, width = attn.heads, key.shape[-1] // attn.heads
    query, key, value = (x.view(batch, -1, heads, width).transpose(1, 2)
                         for x in (query, key, value))
    out = by_frames(query, key, value, frames, per_frame)
    out = out.transpose(1, 2).reshape(batch, -1, heads * width).to(query.dtype)
    out = attn.to_out[1](attn.to_out[0](out))
    if attn.residual_connection:
        out = out + residual
    return out / attn.rescale_output_factor


def frame_causal_mid_block(original, **_):
    """``HunyuanVideoMidBlock3D.forward`` with its attention computed frame by frame."""

    def forward(self, hidden_states):
        import torch

        if torch.is_grad_enabled() and self.gradient_checkpointing:
            return original(self, hidden_states)  # training: diffusers' own
        hidden_states = self.resnets[0](hidden_states)
        for attn, resnet in zip(self.attentions, self.resnets[1:]):
            if attn is not None:
                _, _, frames, height, width = hidden_states.shape
                tokens = hidden_states.permute(0, 2, 3, 4, 1).flatten(1, 3)
                tokens = frame_causal_attention(attn, tokens, frames, height * width)
                hidden_states = tokens.unflatten(1, (frames, height, width)) \
                    .permute(0, 4, 1, 2, 3)
            hidden_states = resnet(hidden_states)
        return hidden_states

    forward.__doc__ = f"patched by porter: frame-causal attention by frames (was {original!r})"
    return forward


VAE_FRAME_CAUSAL = Patch(
    name="hunyuan.vae_frame_causal",
    target="diffusers.models.autoencoders.autoencoder_kl_hunyuan_video:"
           "HunyuanVideoMidBlock3D.forward",
    doc="The VAE's mid-block attention spans every token of a tile with a frame-causal "
        "mask diffusers builds as a float matrix (tokens x tokens: 72,000 at 720p, 20 GiB "
        "in float32, and scores and softmax beside it). Computed instead as one unmasked "
        "attention per frame over the keys of that frame and those before it: the same "
        "values, no mask, and an attention the recipe's backend (splash, blockwise) runs "
        "without materialising its scores.",
    replacement=frame_causal_mid_block,
    fits="diffusers>=0.32,<0.43",
)


def frame_causal_attn_block_15(original, **_):
    """``HunyuanVideo15AttnBlock.forward`` with its attention computed frame by frame."""

    def forward(self, x):
        identity, x = x, self.norm(x)
        query, key, value = self.to_q(x), self.to_k(x), self.to_v(x)
        batch, channels, frames, height, width = query.shape
        # one head of all channels, tokens in (frame, height, width) order, as diffusers
        query, key, value = (t.reshape(batch, channels, -1).permute(0, 2, 1).unsqueeze(1)
                             for t in (query, key, value))
        out = by_frames(query, key, value, frames, height * width)
        out = out.squeeze(1).reshape(batch, frames, height, width, channels) \
            .permute(0, 4, 1, 2, 3)
        return self.proj_out(out) + identity

    forward.__doc__ = f"patched by porter: frame-causal attention by frames (was {original!r})"
    return forward


VAE_FRAME_CAUSAL_15 = Patch(
    name="hunyuan.vae_frame_causal_15",
    target="diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15:"
           "HunyuanVideo15AttnBlock.forward",
    doc="HunyuanVideo 1.5's VAE builds its mid-block's frame-causal mask with a Python "
        "loop over every token, one write each (111,600 at 720p and 121 frames: a "
        "program of as many scatters, whose compile outgrew a 24 GiB host), into a float "
        "matrix of tokens x tokens (46 GiB in float32). Computed instead as one unmasked "
        "attention per frame over the keys of that frame and those before it: the same "
        "values, no mask, no loop over tokens.",
    replacement=frame_causal_attn_block_15,
    fits="diffusers>=0.36,<0.43",
)


TRACEABLE_FORWARD_15 = Patch(
    name="hunyuan.traceable_forward_15",
    target="diffusers.models.transformers.transformer_hunyuan_video15:"
           "HunyuanVideo15Transformer3DModel.forward",
    doc="HunyuanVideo 1.5's transformer forward branches on a value (`if "
        "torch.all(image_embeds == 0)`) and reorders each sequence's text tokens with "
        "boolean indexing, so a run could compile only its blocks, one by one, with the "
        "glue between them eager, and `porter compile` could not compile it ahead. "
        "Patched: the branch a torch.where, the reordering a gather by a sort key (the "
        "same tokens in the same order): the whole forward is one program, its 54 "
        "identical blocks a scan.",
    replacement=transformer15.traceable_forward,
    fits="diffusers>=0.37,<0.43",  # diffusers.utils.apply_lora_scale came with 0.37
)


KEY_MASK_15 = Patch(
    name="hunyuan.key_mask_15",
    target="diffusers.models.transformers.transformer_hunyuan_video15:"
           "HunyuanVideo15AttnProcessor2_0.__call__",
    doc="HunyuanVideo 1.5's attention hands its text padding to attention as a square "
        "tokens x tokens boolean mask (12.9 GB per chip at 720p and 121 frames; no kernel "
        "reads it as padding, so splash falls back to blockwise with the whole matrix). "
        "Patched: the same padding as a key mask, which splash takes as segment ids. Only "
        "the rows of text padding queries change, and nothing reads them: the same video.",
    replacement=transformer15.key_mask_attention,
    fits="diffusers>=0.37,<0.43",  # checked against 0.42 (dispatch_attention_fn's arguments)
)
