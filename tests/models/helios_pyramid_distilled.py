"""A tiny random distilled Helios pyramid pipeline: the pyramid test's components
(models.helios_pyramid) with the distilled model's scheduler (HeliosDMDScheduler), the
layout HeliosPyramidDistilledModularPipeline loads."""

from models.helios_pyramid import build_helios_pyramid_pipeline


def build_helios_pyramid_distilled_pipeline():
    return build_helios_pyramid_pipeline("HeliosDMDScheduler")
