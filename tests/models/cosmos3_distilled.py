"""A tiny random distilled Cosmos 3 modular pipeline: the Cosmos 3 Omni test's components
(models.cosmos3_omni) under Cosmos3DistilledModularPipeline, with the distilled
checkpoint's schedule (``distilled_sigmas``, which a distilled checkpoint's
modular_model_index.json carries) of two steps. Saved as a modular checkpoint."""


def build_cosmos3_distilled_pipeline():
    from diffusers import Cosmos3DistilledModularPipeline, FlowMatchEulerDiscreteScheduler

    from models.cosmos3_omni import build_cosmos3_omni_pipeline

    classic = build_cosmos3_omni_pipeline()
    pipe = Cosmos3DistilledModularPipeline()
    pipe.update_components(**{name: component for name, component in
                              classic.components.items()
                              if name in pipe.pretrained_component_names and name != "scheduler"},
                           scheduler=FlowMatchEulerDiscreteScheduler(),
                           distilled_sigmas=[1.0, 0.5], enable_safety_checker=False)
    return pipe
