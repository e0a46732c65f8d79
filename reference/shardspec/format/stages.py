"""Which pipeline stage holds each tensor, for tools that choose a layout (convert, reshard).

The rule, overridable by giving an explicit mapping: transformer layers (names containing
``layers.<i>.``, ``h.<i>.`` or ``blocks.<i>.``) are split into ``pp_size`` contiguous runs as
evenly as possible, earlier stages taking the extra layer; the embedding and everything before
the first layer go to the first stage; the final norm, the LM head and everything else after
the layers go to the last stage.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = ["LAYER_PATTERN", "assign_stages", "layer_index", "stage_of_layer"]

#: Matches the layer index in names such as ``model.layers.12.mlp.up_proj.weight``.
LAYER_PATTERN = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")

_FIRST_STAGE_HINTS = ("embed", "wte", "wpe", "tok_embeddings")


def layer_index(name: str) -> int | None:
    """The transformer layer a tensor belongs to, or None for tensors outside the layers."""
    match = LAYER_PATTERN.search(name)
    return int(match[1]) if match else None


def stage_of_layer(layer: int, num_layers: int, pp_size: int) -> int:
    """The stage of ``layer`` when ``num_layers`` are split into ``pp_size`` contiguous runs."""
    base, extra = divmod(num_layers, pp_size)
    # The first `extra` stages hold base + 1 layers each, the rest hold base.
    boundary = extra * (base + 1)
    if layer < boundary:
        return layer // (base + 1)
    return extra + (layer - boundary) // base if base else pp_size - 1


def assign_stages(
    names: Iterable[str], pp_size: int, overrides: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Stage of every tensor name (see the module docstring); ``overrides`` win."""
    names = list(names)
    overrides = overrides or {}
    for name, stage in overrides.items():
        if not 0 <= stage < pp_size:
            raise ValueError(f"stage {stage} for {name!r} is not in 0..{pp_size - 1}")
    layers = sorted({i for n in names if (i := layer_index(n)) is not None})
    position = {layer: k for k, layer in enumerate(layers)}
    stages: dict[str, int] = {}
    for name in names:
        if name in overrides:
            stages[name] = overrides[name]
            continue
        layer = layer_index(name)
        if layer is not None:
            stages[name] = stage_of_layer(position[layer], len(layers), pp_size)
        elif any(hint in name for hint in _FIRST_STAGE_HINTS):
            stages[name] = 0
        else:
            stages[name] = pp_size - 1
    return stages
