"""A tiny random distilled Wan-Animate-2 modular pipeline
(WanAnimate2DistilledModularPipeline): the components of models.wan_animate2 (configs of
diffusers' own Wan-Animate-2 tests, see there) under the distilled blocks, with the scheduler
class the released distilled checkpoint ships (FlowMatchEulerDiscreteScheduler, shift 5.0);
the guider is the distilled blocks' default (guidance_scale=1.0: no classifier-free
guidance). Saved as a modular checkpoint."""


def build_wan_animate2_distilled_pipeline():
    from diffusers import FlowMatchEulerDiscreteScheduler, WanAnimate2DistilledModularPipeline

    from models.wan_animate2 import wan_animate2_components

    pipe = WanAnimate2DistilledModularPipeline()
    pipe.update_components(**wan_animate2_components(),
                           scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0))
    return pipe
