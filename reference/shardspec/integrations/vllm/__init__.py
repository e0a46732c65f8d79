"""vLLM's ``load_format="shardspec"``: every worker reads its own bytes through the manifest.

Installed with the package, the plugin is found by vLLM through the ``vllm.general_plugins``
entry point ``shardspec`` (:func:`register`), in every vLLM process, so that

    vllm serve CHECKPOINT --load-format shardspec --tensor-parallel-size 2
    LLM(model=CHECKPOINT, load_format="shardspec", tensor_parallel_size=2)

work with nothing else to configure. ``model_loader_extra_config`` takes ``verify``,
``save_to`` and ``ignore_extensions`` (:class:`~.options.LoaderOptions`).

- :mod:`.options`: the extra config, checked;
- :mod:`.regions`: the box of each global tensor a worker needs, by vLLM's rules;
- :mod:`.loader`: the ``BaseModelLoader`` (imports vLLM);
- :mod:`.state`: workers writing the state they loaded as a checkpoint.

Only :mod:`.loader` and :mod:`.state` import vLLM, and only when vLLM loads the plugin.
"""

from __future__ import annotations

__all__ = ["LOAD_FORMAT", "register"]

#: The name vLLM knows the loader by.
LOAD_FORMAT = "shardspec"


def register() -> None:
    """Register the loader with vLLM (the ``vllm.general_plugins`` entry point). vLLM calls it
    once in each of its processes."""
    from vllm.model_executor.model_loader import register_model_loader

    from .loader import ShardspecModelLoader

    register_model_loader(LOAD_FORMAT)(ShardspecModelLoader)
