"""Ahead-of-time compilation for a target Porter does not run on: ``porter compile``.

JAX compiles for a TPU topology without a TPU once ``libtpu`` is installed
(deviceless compilation). This package builds a recipe's port with every weight
and input abstract (shapes, dtypes and shardings, no values), lowers each
program a run compiles, and has the target's own compiler compile it: the
chip's real memory and cost figures, or its refusal when a program cannot fit.

- ``targets``: the chips and slices Porter compiles for, with their public facts;
- ``programs``: what a family says each compiled program is called with;
- ``port``: the recipe's components as a run ports them, with abstract weights;
- ``executable``: one program lowered and compiled for the target;
- ``hlo``: collectives and loop trip counts read from the compiled program;
- ``roofline``: lower bounds on a denoising step's time from those figures;

``porter.commands.compile`` drives them: the whole compile, as text or JSON.
"""
