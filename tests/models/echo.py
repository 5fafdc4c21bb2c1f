"""A tiny random Echo modular pipeline (EchoModularPipeline: the Echo long-video DMD checkpoint,
an LTX-2 model with first-frame and memory conditioning, video and audio, modular only). Echo
runs on LTX-2's components, so these are the LTX-2 test's (models.ltx2, configs as in
diffusers' own LTX-2 tests, as diffusers' Echo modular test's tiny hub repository also holds
LTX-2 parts: a four-channel VAE of spatial ratio 2), without a scheduler: Echo steps its own
DMD sigma schedule (the ``sigmas`` call input). Saved as a modular checkpoint."""


def build_echo_pipeline():
    from diffusers import EchoModularPipeline

    from models.ltx2 import ltx2_components

    components = ltx2_components()
    components.pop("scheduler")  # the Echo blocks take no scheduler
    pipe = EchoModularPipeline()
    pipe.update_components(**components)
    return pipe
