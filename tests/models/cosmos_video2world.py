"""A tiny random Cosmos (1.0) video-to-world pipeline (configs as in diffusers' own Cosmos
video-to-world tests; the text encoder, tokenizer, VAE and scheduler of
models.cosmos_text2world, the transformer taking the condition mask too, 4 + 1 channels;
concat_padding_mask=False and the pass-through safety checker as there)."""


def build_cosmos_video2world_pipeline():
    # Checked in plain diffusers (CPU, float32): pipe(image=<32x32 image>, prompt="a cat",
    # height=32, width=32, num_frames=9, num_inference_steps=2, guidance_scale=3.0,
    # max_sequence_length=16, output_type="np") gives 9 finite 32x32 frames.
    from diffusers import CosmosVideoToWorldPipeline

    from models.cosmos_text2world import cosmos_pipeline

    return cosmos_pipeline(CosmosVideoToWorldPipeline, in_channels=4 + 1)
