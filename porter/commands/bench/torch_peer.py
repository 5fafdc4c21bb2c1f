"""The PyTorch model under ``torch.compile``, timed in a process of its own: the peer a
user already has beside Porter.

Why a process of its own: torchax names PyTorch's out-of-tree device "jax", and
TorchDynamo then takes "jax" for the machine's accelerator and fails before it traces
anything ("PyTorch is not linked with support for jax devices"). A spawned process
that never imports torchax compiles the model as a user's own script would. The model
and inputs travel to it pickled, on the host; it moves them to ``device`` itself.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time

import torch


def compiled_step(model: torch.nn.Module, inputs: dict, device: str, steps: int) -> dict:
    """``{"first_call_s", "step_s"}`` of ``model(**inputs)`` under ``torch.compile`` (its
    default mode) on ``device``: the first call compiles; the step is the median of
    ``steps`` calls after it. A failure is reported as ``{"error": ...}``, not raised:
    the port's own figures still stand without the peer."""
    host = {k: v.cpu() for k, v in inputs.items()}
    model.cpu()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the eager side's cached blocks: the child needs them
    try:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            return pool.apply(_in_child, (model, host, device, steps))
    except Exception as error:  # noqa: BLE001 - the peer's failure is a finding
        return {"error": f"{type(error).__name__}: {error}"[:500]}


def _in_child(model, inputs, device, steps) -> dict:
    try:
        model = model.to(device).eval()
        inputs = {k: v.to(device) for k, v in inputs.items()}
        synchronize = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        compiled = torch.compile(model)

        def call():
            compiled(return_dict=False, **inputs)
            synchronize()  # CUDA runs asynchronously: time the work, not the launch

        with torch.no_grad():
            start = time.perf_counter()
            call()
            first = time.perf_counter() - start
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
    except Exception as error:  # noqa: BLE001 - reported to the parent as text
        return {"error": f"{type(error).__name__}: {error}"[:500]}
    return {"first_call_s": round(first, 3), "step_s": round(statistics.median(times), 5)}
