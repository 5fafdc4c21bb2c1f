"""Stand-ins for the pieces of a published checkpoint this machine cannot build, named
by the layouts Porter ships (``porter/loading/layouts/``) in place of the real class.

MiniMax-H3 names ``Qwen3VLProcessor``, which transformers cannot build (nor load)
without torchvision: its video processor's class check fails. Its text-to-video
blocks read the processor's ``create_mm_token_type_ids`` and its image processor
alone (a video reference, ref2va, needs torchvision anyway), so the dry run of
``porter compile`` reads the layout's processor as Qwen3VLProcessor without its video
processor. A run downloads the repository and loads the real class.
"""

from __future__ import annotations

from transformers import Qwen3VLProcessor


class Qwen3VLProcessorWithoutVideo(Qwen3VLProcessor):
    """Qwen3VLProcessor with its image processor and tokenizer alone."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # its sub-processors are this class's __init__ arguments: image_processor, tokenizer
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)
