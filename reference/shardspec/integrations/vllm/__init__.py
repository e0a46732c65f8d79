"""vLLM's ``load_format="shardspec"``: every worker reads its own bytes through the manifest.

Installed with the package, the plugin is found by vLLM through the ``vllm.general_plugins``
entry point ``shardspec`` (:func:`register`), in every vLLM process, so that

    vllm serve CHECKPOINT --load-format shardspec --tensor-parallel-size 2
    LLM(model=CHECKPOINT, load_format="shardspec", tensor_parallel_size=2)

work with nothing else to configure. ``model_loader_extra_config`` takes ``verify``,
``save_to``, ``ignore_extensions``, ``plan_cache``, and ``source`` with ``storage_options``
(:class:`~.options.LoaderOptions`): a checkpoint in object storage, served with a local
directory of its manifest and extra files as ``model`` (:mod:`.source`).

A worker's bytes go from the data files straight into its parameters, in four steps:

- :mod:`.recorder`: the model's ``load_weights`` run once on stand-ins, recording where each
  checkpoint region lands;
- :mod:`.placements`: that recording against the manifest's pieces -> the reads (a plan);
- :mod:`.plan_cache`: plans kept between starts;
- :mod:`.replay`: the plan executed into the parameters.

And around them:

- :mod:`.options`: the extra config, checked;
- :mod:`.source`: a checkpoint in object storage, and the local directory vLLM takes as its
  model, checked to be of one checkpoint;
- :mod:`.regions`: the box of each global tensor a worker needs, by vLLM's rules (for what a
  plan cannot place);
- :mod:`.own_layout`: whether a checkpoint rank is the worker's own state (vLLM's names at
  its layout), and its tensors' values, joined where the rank holds several pieces;
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
