"""Compile pipeline components with jax.jit through torchax."""

from __future__ import annotations

# Arguments that change the Python structure of the output, not its values:
# they must be static or tracing fails.
STATIC_ARGNAMES = ("return_dict",)


def apply(module, methods: tuple[str, ...]):
    """A module whose ``methods`` are jitted once per input shape and reused."""
    import torchax

    options = torchax.CompileOptions(
        methods_to_compile=list(methods),
        jax_jit_kwargs={"static_argnames": STATIC_ARGNAMES},
    )
    return torchax.compile(module, options)
