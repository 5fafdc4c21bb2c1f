"""A tiny random Kandinsky 5 image-to-video pipeline (configs as in diffusers' own Kandinsky 5
I2V tests: the T2V components of models.kandinsky5 with a three-block VAE and a transformer
conditioned on the image's latents)."""


def build_kandinsky5_i2v_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image=<32x32 image>, prompt="a cat",
    # height=32, width=32, num_frames=17, num_inference_steps=2, guidance_scale=4.0,
    # max_sequence_length=8, output_type="np") gives 17 finite 32x32 frames (with
    # num_frames=5, 2 latent frames, it gives NaN frames in plain diffusers too).
    from diffusers import Kandinsky5I2VPipeline

    from models.kandinsky5 import kandinsky5_pipeline

    return kandinsky5_pipeline(Kandinsky5I2VPipeline, vae_blocks=3, visual_cond=True)
