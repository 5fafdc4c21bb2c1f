"""Pipelines that make their video chunk by chunk, each chunk's frames handed on as
the pipeline finishes it (``GenericFamily.generate``'s ``on_frames``), their own loops
run as written. Two kinds:

- ``DECODES_CHUNKS`` (Helios): the pipeline decodes each chunk itself (``vae.decode``
  once a chunk, in order), then trims the joined frames to 4n+1. Each decode's frames
  are handed on as it returns, less the last few a trim can take (the VAE's temporal
  compression less one), which come with the next chunk.
- ``FINISHES_CHUNKS`` (SkyReels-V2 diffusion forcing, AnyFlow FAR): the pipeline
  finishes a chunk's latents at a call of its own (named here, with where that call's
  arguments hold every latent frame finished so far) and decodes the whole video with
  Wan's VAE at its end. At that call Porter decodes the frames finished since the last
  one, latent frame by latent frame with the VAE's causal cache carried
  (``wan_vae.FrameByFrame``), and hands them on; the pipeline's final ``vae.decode``
  is answered with those pixels and the rest's, decoded on from the same cache: the
  whole decode's pixels, each frame decoded once. Final latents that do not begin with
  the frames decoded (a pipeline that changed them after) get the VAE's own decode,
  with a warning. A video that begins with the pipeline's input (diffusion forcing's
  video-to-video: the input video's frames, then the new ones) hands those frames on
  at that call's first time, before any chunk.
"""

from __future__ import annotations

import contextlib
from typing import Callable, NamedTuple

from porter.families import wan_vae
from porter.families.base import Handover, as_uint8, first_of
from porter.runtime import notices
from porter.shims import lazy
from porter.shims.attributes import replaced
from porter.shims.carried import one_ahead
from porter.shims.interop import to_host

torch = lazy.module("torch", __name__)

DECODES_CHUNKS = ("HeliosPipeline", "HeliosPyramidPipeline")


def _skyreels_finished(args, kwargs):
    # prepare_latents(..., video_latents=accumulated): at a long video's later
    # iterations, every latent frame made so far (None at the first)
    return kwargs.get("video_latents")


def _far_finished(args, kwargs):
    # encode_kv_cache(..., chunk_partition=the chunks done, output=...): the chunks'
    # latents as the loop keeps them, frames second
    done = sum(kwargs["chunk_partition"])
    return kwargs["output"][:, :done].permute(0, 2, 1, 3, 4)


def _skyreels_input_video(args, kwargs):
    # prepare_latents(video, ...): the input video as the pipeline preprocessed it,
    # which it joins before the frames it makes
    return args[0] if args else kwargs["video"]


class Finishing(NamedTuple):
    """How a pipeline finishes its chunks: ``method``, the call it makes once a chunk is
    finished; ``finished_of``, the latents finished so far from that call's (args,
    kwargs) (batch, channels, frames, height, width); ``begins_with``, where the video
    begins with pixels the pipeline was given, those pixels from the same (args,
    kwargs) (batch, channels, frames, height, width; None: it begins with the chunks)."""
    method: str
    finished_of: Callable
    begins_with: Callable | None = None


FINISHES_CHUNKS = {
    "SkyReelsV2DiffusionForcingPipeline": Finishing("prepare_latents", _skyreels_finished),
    "SkyReelsV2DiffusionForcingImageToVideoPipeline": Finishing("prepare_latents",
                                                                _skyreels_finished),
    "SkyReelsV2DiffusionForcingVideoToVideoPipeline": Finishing(
        "prepare_latents", _skyreels_finished, _skyreels_input_video),
    "AnyFlowFARPipeline": Finishing("encode_kv_cache", _far_finished),
}


def _named(cls, names):
    """The first of ``cls``'s classes (itself, then its bases) named in ``names``."""
    return next((base.__name__ for base in cls.__mro__ if base.__name__ in names), None)


def decodes_chunks(cls) -> bool:
    """Does pipeline class ``cls`` (or a class it is built on) decode chunk by chunk
    itself (``DECODES_CHUNKS``)?"""
    return _named(cls, DECODES_CHUNKS) is not None


def finishes_chunks(cls) -> bool:
    """Does pipeline class ``cls`` finish its chunks at a call of its own
    (``FINISHES_CHUNKS``), where a run that takes its frames decodes them?"""
    return _named(cls, FINISHES_CHUNKS) is not None


def handed_on(pipe, on_frames) -> tuple[Handover, contextlib.AbstractContextManager]:
    """The call's ``Handover`` and what to run the pipeline's call in, so that its
    chunks reach ``on_frames`` as the pipeline makes them (for a pipeline that makes
    its video whole, or no ``on_frames``: nothing; ``Handover.finish`` hands the video
    on at the end)."""
    cls = type(pipe)
    if on_frames is not None and decodes_chunks(cls):
        # a chunk's last frames wait for the next: the pipeline's trim to 4n+1 may take them
        handover = Handover(on_frames, hold=pipe.vae_scale_factor_temporal - 1)
        return handover, replaced(pipe.vae, "decode", _handing_on(pipe, handover))
    finishing = FINISHES_CHUNKS.get(_named(cls, FINISHES_CHUNKS))
    if on_frames is not None and finishing and wan_vae.is_wan_vae(pipe.vae):
        handover = Handover(on_frames)
        return handover, _Finished(pipe, handover).watching(finishing)
    return Handover(on_frames), contextlib.nullcontext()


def _frames(pipe, video):
    """A VAE's pixels (on the device, as decoded) made frames as the pipeline makes its
    video's: its video processor on the tensor as it is, the first video of a batch."""
    return as_uint8(first_of(pipe.video_processor.postprocess_video(video,
                                                                    output_type="np")))


def _handing_on(pipe, handover: Handover):
    """``vae.decode`` with each decode's frames handed over as it returns."""
    decode = pipe.vae.decode

    def handed_on(*args, **kwargs):
        out = decode(*args, **kwargs)
        handover.add(_frames(pipe, out[0] if isinstance(out, (tuple, list)) else out.sample))
        return out

    return handed_on


class _Finished:
    """One call of a ``FINISHES_CHUNKS`` pipeline: its finished latent frames decoded
    and handed on at each chunk's end, its final decode answered from them."""

    def __init__(self, pipe, handover: Handover):
        self.pipe, self.vae, self.handover = pipe, pipe.vae, handover
        self.decode = self.vae.decode  # the VAE's own, for what cannot be answered
        self.frames = wan_vae.FrameByFrame(self.vae)
        self.latents: list = []  # the latent frames decoded (host copies, the VAE's scale)
        self.pixels: list = []  # their pixels, on the device, in order
        self.off = False  # a video this cannot stream: the VAE's own decode at the end
        self.begun = False  # the pixels the video begins with, handed on
        # the dtype the pipeline brings its decoded pixels to before it joins them to
        # those it began with (video-to-video: float32), so the frames shown are its
        self.pixel_dtype = None

    @contextlib.contextmanager
    def watching(self, finishing: Finishing):
        called = getattr(self.pipe, finishing.method)

        def watched(*args, **kwargs):
            if finishing.begins_with is not None and not self.begun:
                self.begin(finishing.begins_with(args, kwargs))
            latents = finishing.finished_of(args, kwargs)
            if latents is not None:
                self.finished(latents)
            return called(*args, **kwargs)

        with replaced(self.pipe, finishing.method, watched), \
                replaced(self.vae, "decode", self.answered):
            yield

    def begin(self, pixels) -> None:
        """The pixels the video begins with (the pipeline's input), handed on first;
        a batch is the pipeline's own, as its latents are."""
        self.begun, self.pixel_dtype = True, pixels.dtype
        if pixels.shape[0] == 1 and not self.off:
            self.handover.add(_frames(self.pipe, pixels))

    def _streams(self, latents) -> bool:
        """Can these latents be decoded here? Not a batch (its VAE may slice it) nor a
        size the VAE tiles (tiles have no frame order): those the VAE decodes itself."""
        self.off = self.off or latents.shape[0] != 1 or wan_vae.tiles(
            self.vae, *latents.shape[-2:])
        return not self.off

    def finished(self, latents) -> None:
        """Every latent frame the pipeline has finished (its scale): those not decoded
        yet decoded now and handed on."""
        if self._streams(latents) and latents.shape[2] > self.frames.count:
            self._decode(to_host(self._scaled(latents[:, :, self.frames.count:])))

    def _scaled(self, latents):
        # as these pipelines scale their latents for the VAE, op for op, so that the
        # frames decoded here are the ones their final decode is given
        config = self.vae.config
        latents = latents.to(self.vae.dtype)
        mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1).to(
            latents.device, latents.dtype)
        inv_std = 1.0 / torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1).to(
            latents.device, latents.dtype)
        return latents / inv_std + mean

    def _decode(self, z) -> None:
        self.latents.append(z)
        for out in one_ahead(self.frames(z)):
            self.pixels.append(out)
            shown = out if self.pixel_dtype is None else out.to(self.pixel_dtype)
            self.handover.add(_frames(self.pipe, shown))

    def answered(self, z, return_dict: bool = True, **kwargs):
        """The pipeline's final decode of its whole video (``z``: the VAE's scale): the
        pixels decoded so far, then the rest's."""
        if not self._streams(z) or not self._begins_with_decoded(z):
            return self.decode(z, return_dict=return_dict, **kwargs)
        if z.shape[2] > self.frames.count:
            self._decode(to_host(z[:, :, self.frames.count:]))
        video = torch.cat(self.pixels, dim=2) if len(self.pixels) > 1 else self.pixels[0]
        if not return_dict:
            return (video,)
        from diffusers.models.autoencoders.vae import DecoderOutput

        return DecoderOutput(sample=video)

    def _begins_with_decoded(self, z) -> bool:
        if not self.latents:
            return True
        decoded = torch.cat(self.latents, dim=2)
        if z.shape[2] >= decoded.shape[2] and torch.equal(
                to_host(z[:, :, :decoded.shape[2]]), decoded):
            return True
        notices.warn("the pipeline's final latents differ from the chunks it finished "
                     "before: its video is decoded again whole, and the stream shows "
                     "frames the video does not have")
        self.off = True
        return False
