"""The Wan plugin's tiny i2v-two-experts pipeline (porter_wan.tiny: diffusers' own Wan test
configurations), for the matrix's modular Wan rows."""


def build_wan22_i2v_pipeline():
    from porter_wan import tiny

    return tiny.build("i2v-two-experts", image=True)
