"""Tensor-parallel plans: which tensors are split, along which dimension, for ``convert``.

A plan maps name patterns to *styles*, in the vocabulary of transformers' tensor-parallel
plans (``base_model_tp_plan`` in a model's config). A pattern matches a tensor name, or its
module name (the name without its last segment, so ``layers.*.self_attn.q_proj`` covers both
``...q_proj.weight`` and ``...q_proj.bias``), with or without the base model's prefix.
``*`` matches any run of characters other than ``.`` (transformers puts it where layer
numbers go: ``layers.*.mlp.up_proj``). Where several patterns match, the most specific wins:
one naming the tensor over one naming its module, then fewer ``*``, then the longer pattern,
then the one listed first.

How each style stores a tensor of ``n`` dimensions (a linear weight is ``[out, in]``):

=============================================  ============================  ==================
style                                          weight (n >= 2)               1-D (a bias)
=============================================  ============================  ==================
``colwise``, ``colwise_rep``,                  split dim ``n - 2`` (dim 0    split dim 0
``colwise_gather_output``, ``local_colwise``   of ``[out, in]``)
``rowwise``, ``rowwise_rep``,                  split dim ``n - 1`` (dim 1    replicated
``rowwise_split_input``, ``local_rowwise``     of ``[out, in]``)
``embedding``, ``embedding_rowwise``,          split dim 0 (the vocabulary)  split dim 0
``vocab_parallel``
``embedding_colwise``                          split dim 1                   (refused)
``replicate``, ``replicated_with_grad_         replicated                    replicated
allreduce``, ``sequence_parallel``, ``local``,
``gather``, ``all_reduce``, ``local_params``
=============================================  ============================  ==================

The ``_rep`` / ``_gather_output`` / ``_split_input`` variants differ from the plain style only
in how activations flow between ranks, not in how weights are stored. A scalar is replicated
by the styles that replicate a 1-D tensor and refused by the others. Styles whose pieces are
not rectangular slices (``packed_colwise``, ``packed_rowwise``, ``moe_tp_experts``,
``mla_kv_a_proj``, ...) are refused: their pieces would be rank-local (SPEC 7.5).

A split dimension of size ``d`` is cut into ``tp_size`` equal runs; where ``tp_size`` does not
divide ``d``, :func:`split_sizes` refuses unless uneven splits are allowed, and then the first
``d mod tp_size`` ranks hold one more (the sizes ``torch.tensor_split`` gives).

Where the plan comes from (:func:`resolve_plan`), first found:

1. a plan the user gives (``--plan FILE``);
2. :data:`MODEL_PLANS` for the mixtures of experts of :data:`MOE_MODEL_TYPES` (Mixtral,
   Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3 with MLA): transformers' MoE plans name styles whose
   pieces are not slices, and the plan here is vLLM's layout;
3. the config's ``base_model_tp_plan`` completed with :data:`COMMON_EXTRAS` (embedding, norms,
   LM head, which transformers leaves out because it replicates whatever a plan does not name);
4. :data:`MODEL_PLANS` for Llama-, Mistral- and Qwen2/3-shaped models;
5. transformers' own plan for the ``model_type`` (:mod:`.library_plans`), completed the same
   way; tensors it does not name are kept whole on every rank, as transformers keeps them;
6. the Llama-shaped :data:`BUILTIN_PLAN`: for a ``model_type`` transformers knows (without
   a plan: GPT-2, Falcon, BLOOM), what it does not name is kept whole, with a warning that
   ``--plan`` splits more; for any other it must name every tensor.

Patterns may leave out the base model's prefix (``model.``, or transformers' prefix of the
architecture: ``gpt_neox.``, ``transformer.``). Routed experts are split by tensor
parallelism like any MLP; which expert rank holds them is ``convert``'s ``ep_size``
(:mod:`shardspec.format.experts`). Outside steps 5 and 6 a tensor no pattern matches is an
error, never silently replicated: a plan that wants a tensor replicated says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from ..format.json_text import load_json
from .library_plans import base_prefix, transformers_knows, transformers_plan
from .patterns import PatternIndex, glob

__all__ = [
    "BUILTIN_MODEL_TYPES",
    "BUILTIN_PLAN",
    "COMMON_EXTRAS",
    "DEEPSEEK_PLAN",
    "MIXTRAL_PLAN",
    "MODEL_PLANS",
    "MOE_MODEL_TYPES",
    "QWEN_MOE_PLAN",
    "PlanError",
    "PlanWarning",
    "REPLICATED",
    "STYLES",
    "TPPlan",
    "best_matches",
    "load_plan_file",
    "match_pattern",
    "resolve_plan",
    "split_dim",
    "split_sizes",
]


class PlanError(ValueError):
    """A plan that cannot be applied: unknown style, unmatched tensor, bad split."""


class PlanWarning(UserWarning):
    """A layout convert writes but the user should know of: key/value heads replicated over
    tensor-parallel ranks, a pipeline stage without a transformer layer."""


#: Marker for "replicated" in :data:`STYLES`.
REPLICATED = "replicated"

#: style -> (rule for n >= 2 dims, rule for 1-D). A rule is an int (dim counted from the end if
#: negative), REPLICATED, or None (refused).
STYLES: dict[str, tuple[int | str | None, int | str | None]] = {
    **{s: (-2, 0) for s in ("colwise", "colwise_rep", "colwise_gather_output",
                            "local_colwise")},
    **{s: (-1, REPLICATED) for s in ("rowwise", "rowwise_rep", "rowwise_split_input",
                                     "local_rowwise")},
    **{s: (0, 0) for s in ("embedding", "embedding_rowwise", "vocab_parallel")},
    "embedding_colwise": (1, None),
    **{s: (REPLICATED, REPLICATED) for s in ("replicate", "replicated_with_grad_allreduce",
                                              "sequence_parallel", "local", "gather",
                                              "all_reduce", "local_params")},
}

_NOT_SLICES = ("packed_colwise", "packed_rowwise", "local_packed_rowwise", "moe_tp_experts",
               "moe_identity_expert", "mla_kv_a_proj", "grouped_gemm", "ep_router", "isolated")

#: What transformers' ``base_model_tp_plan`` leaves out (it replicates anything unnamed): the
#: vocabulary-parallel embedding, the norms and the LM head, as vLLM shards them.
COMMON_EXTRAS: dict[str, str] = {
    "embed_tokens": "embedding",
    "layers.*.input_layernorm": "replicate",
    "layers.*.post_attention_layernorm": "replicate",
    "layers.*.self_attn.q_norm": "replicate",
    "layers.*.self_attn.k_norm": "replicate",
    "norm": "replicate",
    "lm_head": "colwise_rep",
    "embed_out": "colwise_rep",  # GPT-NeoX's LM head
}

#: The plan of Llama-, Mistral- and Qwen2-shaped models (transformers' plan plus the extras).
BUILTIN_PLAN: dict[str, str] = {
    **COMMON_EXTRAS,
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}

_ATTENTION = {k: v for k, v in BUILTIN_PLAN.items() if ".mlp." not in k}
_MLP = {k: v for k, v in BUILTIN_PLAN.items() if ".mlp." in k}


def _experts(module: str, gate: str, up: str, down: str) -> dict[str, str]:
    """A routed-expert MLP as vLLM shards it: gate/up column-parallel, down row-parallel."""
    return {f"{module}.{gate}": "colwise", f"{module}.{up}": "colwise",
            f"{module}.{down}": "rowwise"}


#: Mixtral: Llama attention; the router (``block_sparse_moe.gate``) replicated, as in vLLM.
MIXTRAL_PLAN: dict[str, str] = {
    **_ATTENTION,
    "layers.*.block_sparse_moe.gate": "replicate",
    **_experts("layers.*.block_sparse_moe.experts.*", "w1", "w3", "w2"),
}

#: Qwen2-MoE and Qwen3-MoE: routed experts, a shared expert (Qwen2-MoE) with its sigmoid gate,
#: dense MLP layers where ``mlp_only_layers`` asks for them.
QWEN_MOE_PLAN: dict[str, str] = {
    **BUILTIN_PLAN,
    "layers.*.mlp.gate": "replicate",
    **_experts("layers.*.mlp.experts.*", "gate_proj", "up_proj", "down_proj"),
    **_experts("layers.*.mlp.shared_expert", "gate_proj", "up_proj", "down_proj"),
    "layers.*.mlp.shared_expert_gate": "replicate",
}

#: DeepSeek-V2/V3 (multi-head latent attention) as vLLM shards it: the low-rank down
#: projections ``q_a_proj`` and ``kv_a_proj_with_mqa`` and their norms are replicated
#: (``ReplicatedLinear``); ``q_b_proj`` (or ``q_proj`` without a q LoRA rank) and ``kv_b_proj``
#: split by heads, ``o_proj`` by its input; the router and its correction bias replicated; routed
#: and shared experts as MLPs.
DEEPSEEK_PLAN: dict[str, str] = {
    **COMMON_EXTRAS,
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.q_a_proj": "replicate",
    "layers.*.self_attn.q_a_layernorm": "replicate",
    "layers.*.self_attn.q_b_proj": "colwise",
    "layers.*.self_attn.kv_a_proj_with_mqa": "replicate",
    "layers.*.self_attn.kv_a_layernorm": "replicate",
    "layers.*.self_attn.kv_b_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    **_MLP,
    "layers.*.mlp.gate": "replicate",
    **_experts("layers.*.mlp.experts.*", "gate_proj", "up_proj", "down_proj"),
    **_experts("layers.*.mlp.shared_experts", "gate_proj", "up_proj", "down_proj"),
}

#: ``model_type`` -> its built-in plan. For the mixture-of-experts types it is used even when
#: the config carries a ``base_model_tp_plan``: transformers' MoE plans name styles whose pieces
#: are not slices (``moe_tp_experts``, ``ep_router``...), and the plan here is vLLM's layout.
MODEL_PLANS: dict[str, dict[str, str]] = {
    "llama": BUILTIN_PLAN, "mistral": BUILTIN_PLAN, "qwen2": BUILTIN_PLAN, "qwen3": BUILTIN_PLAN,
    "mixtral": MIXTRAL_PLAN, "qwen2_moe": QWEN_MOE_PLAN, "qwen3_moe": QWEN_MOE_PLAN,
    "deepseek_v2": DEEPSEEK_PLAN, "deepseek_v3": DEEPSEEK_PLAN,
}

#: The types whose built-in plan wins over the config's own plan.
MOE_MODEL_TYPES = frozenset({"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"})

#: ``model_type`` values with a built-in plan.
BUILTIN_MODEL_TYPES = frozenset(MODEL_PLANS)


#: The longest pattern a plan may hold: patterns come from files users and checkpoints give.
MAX_PATTERN_CHARS = 1024
#: The most patterns a plan may hold (transformers' largest plans hold a few dozen): 300,000
#: starred patterns in a 10 MB plan cost 5 s on a large model's names, 4,096 cost 0.1 s.
MAX_PLAN_PATTERNS = 4096


def match_pattern(pattern: str, name: str, prefixes: tuple[str, ...] = ("model.",)
                  ) -> int | None:
    """0 if ``pattern`` names the tensor ``name``, 1 if it names its module, else None.
    ``pattern`` may leave out one of ``prefixes`` (the base model's: ``model.``,
    ``gpt_neox.``...). PlanError for a pattern longer than :data:`MAX_PATTERN_CHARS`."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PlanError(f"a plan pattern has {len(pattern)} characters, more than "
                        f"{MAX_PATTERN_CHARS}: {pattern[:60]!r}...")
    candidates = _candidates(name, prefixes)
    if any(glob(pattern, n) for n in candidates):
        return 0
    modules = [n.rpartition(".")[0] for n in candidates]
    if any(m and glob(pattern, m) for m in modules):
        return 1
    return None


def _candidates(name: str, prefixes: tuple[str, ...]) -> list[str]:
    """``name``, and ``name`` without each of ``prefixes`` it starts with."""
    return [name] + [name[len(p):] for p in prefixes if name.startswith(p)]


def best_matches(index: PatternIndex, name: str, prefixes: tuple[str, ...]
                 ) -> dict[int, int]:
    """Pattern index -> 0 where it names tensor ``name``, 1 where only its module (as
    :func:`match_pattern`), for every pattern of ``index`` that matches."""
    out: dict[int, int] = {}
    for candidate in _candidates(name, prefixes):
        whole, module = index.matches(candidate)
        for i in module:
            out.setdefault(i, 1)
        for i in whole:
            out[i] = 0
    return out


@dataclass(frozen=True)
class TPPlan:
    """Patterns -> styles, and where the plan came from (for messages).

    ``prefixes``: what a pattern may leave out at the start of a name (transformers' plans are
    relative to the base model: ``model.``, ``gpt_neox.``, ``transformer.``). ``unnamed``: the
    style of a tensor no pattern names, None to refuse it; a plan taken from transformers
    keeps such tensors whole, as transformers does.
    """

    patterns: Mapping[str, str]
    source: str = "plan"
    prefixes: tuple[str, ...] = ("model.",)
    unnamed: str | None = None

    def __post_init__(self) -> None:
        if len(self.patterns) > MAX_PLAN_PATTERNS:
            raise PlanError(f"{self.source}: {len(self.patterns)} patterns, more than "
                            f"{MAX_PLAN_PATTERNS}")
        for pattern, style in self.patterns.items():
            if not isinstance(pattern, str) or not pattern:
                raise PlanError(f"{self.source}: a pattern must be a non-empty string")
            _check_style(style, f"{self.source}: pattern {pattern!r}")
            if len(pattern) > MAX_PATTERN_CHARS:
                raise PlanError(f"{self.source}: a pattern has {len(pattern)} characters, more "
                                f"than {MAX_PATTERN_CHARS}: {pattern[:60]!r}...")
        if self.unnamed is not None:
            _check_style(self.unnamed, f"{self.source}: the style of unnamed tensors")

    @cached_property
    def _index(self) -> PatternIndex:
        return PatternIndex(self.patterns)

    def style_of(self, name: str) -> str | None:
        """The style of tensor ``name``, or None where no pattern matches: of the patterns
        that match, one naming the tensor over one naming its module, then the one with
        the fewest stars, then the longest, then the first."""
        patterns = self._index.patterns
        found = best_matches(self._index, name, self.prefixes)
        if not found:
            return None
        best = min(found, key=lambda i: (found[i], patterns[i].count("*"), -len(patterns[i]),
                                         i))
        return self.patterns[patterns[best]]

    def unnamed_of(self, names: Iterable[str]) -> list[str]:
        """The ``names`` no pattern names: they get :attr:`unnamed`."""
        return [name for name in names if self.style_of(name) is None]

    def styles(self, names: Iterable[str]) -> dict[str, str]:
        """The style of every name; PlanError naming the first tensor no pattern matches."""
        out: dict[str, str] = {}
        unmatched = []
        for name in names:
            style = self.style_of(name) or self.unnamed
            if style is None:
                unmatched.append(name)
            else:
                out[name] = style
        if unmatched:
            more = f" (and {len(unmatched) - 1} more)" if len(unmatched) > 1 else ""
            raise PlanError(
                f"tensor {unmatched[0]!r}{more} matches no pattern of the tensor-parallel plan "
                f"({self.source}); add a pattern for it, with style 'replicate' to keep it whole "
                f"on every rank: {unmatched}")
        return out


def _check_style(style: Any, where: str) -> None:
    if style in STYLES:
        return
    if style in _NOT_SLICES:
        raise PlanError(f"{where}: style {style!r} stores pieces that are not rectangular "
                        "slices of one tensor; convert cannot write it (SPEC 7.5)")
    raise PlanError(f"{where}: unknown style {style!r}; known styles: {sorted(STYLES)}")


def split_dim(style: str, shape: tuple[int, ...], name: str = "tensor") -> int | None:
    """The dimension ``style`` splits a tensor of ``shape`` along, or None: replicated."""
    _check_style(style, f"tensor {name!r}")
    big, one = STYLES[style]
    ndim = len(shape)
    rule = big if ndim >= 2 else one
    if ndim == 0:
        if one == REPLICATED:
            return None
        raise PlanError(f"tensor {name!r} is a scalar; style {style!r} cannot split it")
    if rule is None:
        raise PlanError(f"tensor {name!r} has {ndim} dimension(s); style {style!r} needs more")
    if rule == REPLICATED:
        return None
    assert isinstance(rule, int)
    dim = rule % ndim if rule < 0 else rule
    if dim >= ndim:
        raise PlanError(f"tensor {name!r} has {ndim} dimension(s); style {style!r} splits "
                        f"dim {dim}")
    return dim


def split_sizes(size: int, parts: int, *, allow_uneven: bool = False, name: str = "tensor",
                dim: int = 0) -> list[int]:
    """How many of ``size`` rows each of ``parts`` ranks holds (torch.tensor_split's sizes)."""
    base, extra = divmod(size, parts)
    if extra and not allow_uneven:
        raise PlanError(f"tensor {name!r}: dim {dim} has size {size}, which {parts} ranks "
                        "cannot split evenly; choose another tp size or allow uneven splits "
                        "(--allow-uneven)")
    return [base + (1 if i < extra else 0) for i in range(parts)]


def load_plan_file(path: str | Path) -> TPPlan:
    """A plan from a JSON file: ``{pattern: style}``, used as given (it must name every
    tensor), or an object with ``tp_plan`` or ``base_model_tp_plan`` holding one, read as
    transformers reads its plans: completed with :data:`COMMON_EXTRAS`, and what it does not
    name kept whole."""
    try:
        data = load_json(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PlanError(f"cannot read the plan file {path}: {exc}") from None
    wrapped = False
    if isinstance(data, dict):
        for key in ("tp_plan", "base_model_tp_plan"):
            if isinstance(data.get(key), dict):
                data, wrapped = data[key], True
                break
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise PlanError(f"{path}: a plan is a JSON object mapping name patterns to style names")
    if wrapped:
        return TPPlan({**COMMON_EXTRAS, **data}, source=f"{path} (as transformers reads it)",
                      unnamed="replicate")
    return TPPlan(dict(data), source=str(path))


def resolve_plan(config: Mapping[str, Any] | None, plan: TPPlan | Mapping[str, str] | None
                 ) -> TPPlan:
    """The plan to use (see the module docstring for the order)."""
    config = config or {}
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise PlanError(f"config.json: model_type must be a string, got {model_type!r}")
    if isinstance(plan, TPPlan):  # a user's plan may use transformers' relative patterns
        return replace(plan, prefixes=_with_base_prefix(plan.prefixes, model_type))
    if plan is not None:
        return TPPlan(dict(plan), source="the given plan",
                      prefixes=_with_base_prefix(("model.",), model_type))
    if model_type in MOE_MODEL_TYPES:
        return TPPlan(MODEL_PLANS[model_type], source=f"the built-in plan for {model_type}")
    from_config = config.get("base_model_tp_plan")
    if isinstance(from_config, dict) and from_config:
        return TPPlan({**COMMON_EXTRAS, **from_config},
                      source="config.json base_model_tp_plan and the common extras")
    if model_type in BUILTIN_MODEL_TYPES:
        return TPPlan(MODEL_PLANS[model_type], source=f"the built-in plan for {model_type}")
    library = transformers_plan(model_type) if isinstance(model_type, str) else None
    if library is not None:
        return TPPlan({**COMMON_EXTRAS, **library.patterns},
                      source=f"{library.source} and the common extras",
                      prefixes=tuple(dict.fromkeys(("model.", library.prefix))),
                      unnamed="replicate")
    known = isinstance(model_type, str) and transformers_knows(model_type)
    return TPPlan(BUILTIN_PLAN, source=(
        f"the built-in Llama-shaped plan: neither config.json nor transformers has a plan for "
        f"model_type {model_type!r}; give one with --plan FILE (a JSON object mapping name "
        "patterns to styles)"), prefixes=_with_base_prefix(("model.",), model_type),
        unnamed="replicate" if known else None)


def _with_base_prefix(prefixes: tuple[str, ...], model_type: Any) -> tuple[str, ...]:
    if not isinstance(model_type, str) or model_type in BUILTIN_MODEL_TYPES:
        return prefixes
    found = base_prefix(model_type)
    return prefixes if found is None else tuple(dict.fromkeys((*prefixes, found)))
