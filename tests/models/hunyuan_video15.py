"""The Hunyuan plugin's tiny HunyuanVideo 1.5 text-to-video pipeline (porter_hunyuan.tiny:
diffusers' own test configurations), for the matrix's modular HunyuanVideo 1.5 row."""


def build_hunyuan_video15_pipeline():
    from porter_hunyuan import tiny

    return tiny.build_pipeline_15()
