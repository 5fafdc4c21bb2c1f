"""The Wan plugin's tiny t2v-two-experts pipeline (porter_wan.tiny: diffusers' own Wan test
configurations), for the matrix's modular Wan rows."""


def build_wan22_t2v_pipeline():
    from porter_wan import tiny

    return tiny.build("t2v-two-experts", image=False)
