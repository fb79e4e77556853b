"""A queue's meta hash as the module keeps it, read for inspection: the claim walk's numbers
(lapnext, qstart, lmin...) are one field, ``walk``, of twelve packed doubles (the module's
THE WALK'S NUMBERS), which ``redis-cli HGETALL`` shows as bytes."""

from __future__ import annotations

import math
import struct

WALK_FIELDS = (
    "qstart",
    "qlen",
    "lapnext",
    "qmin",
    "lapguess",
    "packed",
    "lmin",
    "lstop",
    "lpass",
    "lskip",
    "rpasses",
    "lpasses",
)
_WALK = struct.Struct("<" + "d" * len(WALK_FIELDS))


def walk_numbers(packed: bytes) -> dict[str, int]:
    """The walk field's numbers by name, the absent ones left out (the module packs them as
    -inf); ValueError for a value of another size, which the module reads as no numbers."""
    if len(packed) != _WALK.size:
        raise ValueError(f"a walk field is {_WALK.size} bytes, got {len(packed)}")
    values = _WALK.unpack(packed)
    return {
        name: int(value)
        for name, value in zip(WALK_FIELDS, values, strict=True)
        if not math.isinf(value) and not math.isnan(value)
    }


def meta_fields(raw: dict[bytes, bytes]) -> dict[str, str]:
    """A meta hash (HGETALL's reply) as text, with the walk field's numbers as fields of their
    own, as a queue before the packed field kept them."""
    fields = {k.decode(): v.decode() for k, v in raw.items() if k != b"walk"}
    if b"walk" in raw:
        fields.update({name: str(n) for name, n in walk_numbers(raw[b"walk"]).items()})
    return fields
