"""What a request to ``porter serve`` may be: its bytes and how deep its JSON nests
(checked before it is parsed: a parser recursing 100,000 levels deep takes the server
down with it). Porter's routes and OpenAI's share them."""

from __future__ import annotations

import re

#: bytes a request body may have: room for two largest images as data URLs
MAX_BODY = 12 * 2**20
#: nesting a request body may have (a job's settings nest two levels)
MAX_DEPTH = 32


_STRUCTURE = re.compile(rb'[\[\]{}"\\]')


def nesting(body: bytes, stop: int) -> int:
    """How deep ``body``'s arrays and objects nest (strings skipped), counted no
    further than ``stop`` + 1; linear in the brackets, quotes and backslashes."""
    depth = deepest = 0
    in_string, escaped_at = False, -1
    for found in _STRUCTURE.finditer(body):
        char, at = found.group(), found.start()
        if in_string:
            if at == escaped_at:
                continue
            if char == b"\\":
                escaped_at = at + 1
            elif char == b'"':
                in_string = False
        elif char == b'"':
            in_string = True
        elif char in b"[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > stop:
                break
        elif char in b"]}":
            depth -= 1
    return deepest
