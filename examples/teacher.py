"""The ported Wan transformer as a frozen teacher inside a PyTorch training loop.

A student (here a small convolution, standing in for a distilled model) learns to
match the teacher's noise prediction on random noisy latents. The teacher runs
compiled on JAX through Porter; the student, its loss and its optimizer are plain
PyTorch on the CPU.

    python examples/teacher.py recipes/wan-tiny.yaml --steps 20
"""

import argparse

import torch

import porter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default="recipes/wan-tiny.yaml")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    port = porter.load(args.recipe)  # loaded and ported once; compiled on first use
    teacher = port.as_torch("transformer")  # torch tensors in, torch tensors out
    config = port.transformer.config  # the diffusers config of the ported model
    gen = port.recipe.generate
    # latent shape for the recipe's video: (batch, channels, frames, height, width)
    shape = (1, config.in_channels, (gen.frames - 1) // 4 + 1, gen.height // 8, gen.width // 8)
    # prompt embeddings from the port's own text encoder, computed once
    prompt = port.encode("a red fox running through fresh snow")["prompt"]

    student = torch.nn.Conv3d(config.in_channels, config.out_channels, 3, padding=1)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for step in range(1, args.steps + 1):
        noisy = torch.randn(shape, generator=generator)
        t = torch.randint(0, 1000, (1,), generator=generator).float()
        with torch.no_grad():
            target = teacher(hidden_states=noisy, timestep=t, encoder_hidden_states=prompt,
                             return_dict=False)[0]
        loss = torch.nn.functional.mse_loss(student(noisy), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 1 or step % 5 == 0:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
