"""A config's sizes checked against the weights a source stores, before transformers builds a model
of them: a 700-byte config.json that claims ten million layers would otherwise build them (minutes,
then memory), and one whose weights lack a tensor would export a randomly initialised model.

The facts are the family's `Shapes` (`_families`); the same check runs on the config as the file
states it (before transformers is imported) and on the config transformers makes of it (defaults
filled in) just before the model is built.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from coreai_opt.io import ModelFileError, one_line

from ._families import GGUF_LAYERS, UNSTORED_LIMIT, Dim, Family, Rule, Shapes
from ._stored import Stored

_LAYER_INDEX = r"(\d{1,9})"  # a layer's index in a weight name (longer runs of digits are no index)


def check_sizes(family: Family, values: Mapping[str, Any], stored: Stored, config: Path) -> None:
    """Refuse (one line naming `config` or the weights' file) a config whose layer count is not the
    layers stored, whose widths are not the stored weights' dimensions, whose head counts do not
    divide them, or whose unstored sizes are out of bounds; and weights that lack one the family
    needs. `values` maps config fields to what `config` states (a field it leaves out is skipped)."""
    shapes = family.shapes
    _check_layers(shapes, values.get(shapes.layers), stored, config)
    for dim in shapes.dims:
        weight = dim.gguf_weight if stored.gguf else dim.weight
        found = stored.find(weight) if weight is not None else None
        if weight is not None and found is None:
            raise ModelFileError(stored.path, f"lacks {weight}, a weight every {family.model_type} model has")
        value = values.get(dim.field)
        if value is not None:
            _check_dim(dim, _positive(dim.field, value, config), found, config, stored.gguf)
    if shapes.groups is not None:
        kv, heads = (values.get(field) for field in shapes.groups)
        if kv is not None and heads is not None and heads % kv:
            raise ModelFileError(
                config, f"{shapes.groups[0]} {kv} does not divide {shapes.groups[1]} {heads}"
            )


def stated_values(family: Family, config: Any) -> dict[str, Any]:
    """The fields `Shapes` checks, as a transformers config object holds them."""
    return {field: getattr(config, field, None) for field in family.shapes.fields}


def gguf_values(family: Family, reader: Any, architecture: str) -> dict[str, Any]:
    """The fields `Shapes` checks, as a GGUF file's metadata states them."""
    keys = {family.shapes.layers: GGUF_LAYERS[0]}
    keys |= {dim.field: dim.gguf_key for dim in family.shapes.dims if dim.gguf_key is not None}
    values = {}
    for field, key in keys.items():
        found = reader.get_field(f"{architecture}.{key}")
        if found is not None:  # an array (one element a value) is never a size: its type name stands in
            values[field] = found.contents() if len(found.data) == 1 else f"an array of {len(found.data)}"
    return values


def _positive(field: str, value: Any, config: Path) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelFileError(config, f"{field} must be a positive integer, not {one_line(repr(value), 40)}")
    return value


def _check_layers(shapes: Shapes, value: Any, stored: Stored, config: Path) -> None:
    pattern = GGUF_LAYERS[1] if stored.gguf else shapes.layer
    layer = re.compile(pattern.replace(r"(\d+)", _LAYER_INDEX))
    present = {int(found.group(1)) for name in stored.shapes if (found := layer.search(name))}
    if not present:
        raise ModelFileError(stored.path, "holds no layer's weights")
    if value is None:
        return
    count = _positive(shapes.layers, value, config)
    if len(present) != count or max(present) != count - 1:  # distinct indices 0..count-1
        raise ModelFileError(
            config, f"{shapes.layers} is {count} but {stored.path.name} holds {_layers(present)}"
        )


def _layers(present: set[int]) -> str:
    """`2 layers (0-1)`, or the indices when some are missing: `layers 0, 1, 5`."""
    if present == {0}:
        return "1 layer (0)"
    if max(present) == len(present) - 1:
        return f"{len(present)} layers (0-{len(present) - 1})"
    shown = sorted(present)
    return "layers " + ", ".join(map(str, shown[:6])) + (", ..." if len(shown) > 6 else "")


def _check_dim(
    dim: Dim, value: int, found: tuple[str, tuple[int, ...]] | None, config: Path, gguf: bool
) -> None:
    if dim.rule is Rule.BOUNDED:
        if value > UNSTORED_LIMIT:
            raise ModelFileError(
                config, f"{dim.field} is {value}, more than {UNSTORED_LIMIT} (no weight holds it)"
            )
        return
    if found is None:  # the GGUF file names no weight for this field
        return
    name, shape = found
    axis = dim.axis_in(gguf)
    actual = shape[axis] if axis < len(shape) else None
    if dim.rule is Rule.EQUALS and value != actual:
        raise ModelFileError(config, f"{dim.field} is {value} but {name} is {list(shape)}")
    if dim.rule is Rule.DIVIDES and (actual is None or actual % value):
        raise ModelFileError(config, f"{dim.field} is {value}, which does not divide {name} {list(shape)}")
