"""What transformers knows of an architecture: its tensor-parallel plan and its base model.

transformers keeps each architecture's plan on its config class (``base_model_tp_plan``), not in
the ``config.json`` it saves, and the plan's patterns are relative to the base model, whose
prefix in checkpoint names (``model.``, ``gpt_neox.``, ``transformer.``) is the causal-LM
class's ``base_model_prefix``. ``convert`` asks for both by ``model_type`` when the user gives
no plan; without transformers installed there is nothing to ask.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["LibraryPlan", "base_prefix", "transformers_knows", "transformers_plan"]


@dataclass(frozen=True)
class LibraryPlan:
    """transformers' plan for one ``model_type``: patterns -> styles, the base model's prefix
    (with its dot), and the classes they come from (for messages)."""

    patterns: dict[str, str]
    prefix: str
    source: str


@functools.cache
def transformers_plan(model_type: str) -> LibraryPlan | None:
    """transformers' plan for ``model_type``, or None: transformers not installed, the type
    unknown to it, or its config class without a plan."""
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        return None
    try:
        config_class = CONFIG_MAPPING[model_type]
    except (KeyError, ValueError):
        return None
    patterns = getattr(config_class, "base_model_tp_plan", None)
    if not isinstance(patterns, dict) or not patterns:
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in patterns.items()):
        return None
    return LibraryPlan(dict(patterns), base_prefix(model_type) or "model.",
                       f"transformers' plan for {model_type} ({config_class.__name__})")


def transformers_knows(model_type: str) -> bool:
    """Whether transformers has a config class for ``model_type`` (plan or not)."""
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        return False
    return model_type in CONFIG_MAPPING


@functools.cache
def base_prefix(model_type: str) -> str | None:
    """The base model's prefix, with its dot, in the names of ``model_type``'s causal-LM
    checkpoints; None where transformers does not say."""
    try:
        import transformers
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return None
    class_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if not isinstance(class_name, str):
        return None
    try:  # importing the class imports its modeling module (torch), once
        prefix = getattr(getattr(transformers, class_name), "base_model_prefix", None)
    except (AttributeError, ImportError, RuntimeError):
        return None
    return f"{prefix}." if isinstance(prefix, str) and prefix else None
