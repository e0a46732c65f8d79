"""Tensor-parallel plans: styles -> split dims, pattern matching, where a plan comes from."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardspec.convert.tp_plan import (
    BUILTIN_PLAN,
    COMMON_EXTRAS,
    STYLES,
    PlanError,
    TPPlan,
    load_plan_file,
    match_pattern,
    resolve_plan,
    split_dim,
    split_sizes,
)


@pytest.mark.parametrize(("style", "shape", "dim"), [
    ("colwise", (8, 4), 0),
    ("colwise", (8,), 0),            # a colwise bias is split like the output features
    ("colwise", (3, 8, 4), 1),       # expert-stacked [E, out, in]: the out dim
    ("colwise_rep", (8, 4), 0),
    ("colwise_gather_output", (8, 4), 0),
    ("local_colwise", (8, 4), 0),
    ("rowwise", (8, 4), 1),
    ("rowwise", (8,), None),         # a rowwise bias is replicated
    ("rowwise", (), None),
    ("rowwise_rep", (8, 4), 1),
    ("rowwise_split_input", (3, 8, 4), 2),
    ("embedding", (16, 4), 0),
    ("embedding_rowwise", (16, 4), 0),
    ("vocab_parallel", (16, 4), 0),
    ("embedding_colwise", (16, 4), 1),
    ("replicate", (16, 4), None),
    ("replicate", (), None),
    ("sequence_parallel", (4,), None),
    ("local", (4, 4), None),
])
def test_split_dim_table(style: str, shape: tuple[int, ...], dim: int | None) -> None:
    assert split_dim(style, shape) == dim


@pytest.mark.parametrize(("style", "shape"), [
    ("colwise", ()), ("embedding", ()), ("embedding_colwise", (4,)),
])
def test_split_dim_refuses_what_cannot_be_split(style: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(PlanError, match="'w'"):
        split_dim(style, shape, "w")


@pytest.mark.parametrize("style", ["packed_colwise", "packed_rowwise", "moe_tp_experts",
                                   "mla_kv_a_proj"])
def test_styles_without_rectangular_pieces_are_refused(style: str) -> None:
    with pytest.raises(PlanError, match="not rectangular"):
        TPPlan({"layers.*.mlp.gate_up_proj": style})


def test_unknown_style_is_refused_naming_it() -> None:
    with pytest.raises(PlanError, match="'diagonal'"):
        TPPlan({"x": "diagonal"})


def test_every_transformers_style_is_known_or_refused() -> None:
    transformers = pytest.importorskip("transformers")
    del transformers
    from transformers.integrations.tensor_parallel import ALL_PARALLEL_STYLES

    for style in ALL_PARALLEL_STYLES:
        if style in STYLES:
            continue
        with pytest.raises(PlanError):
            TPPlan({"x": style})


@pytest.mark.parametrize(("pattern", "name", "kind"), [
    ("layers.*.self_attn.q_proj", "model.layers.3.self_attn.q_proj.weight", 1),
    ("layers.*.self_attn.q_proj", "model.layers.3.self_attn.q_proj.bias", 1),
    ("layers.*.self_attn.q_proj.weight", "model.layers.3.self_attn.q_proj.weight", 0),
    ("model.layers.*.self_attn.q_proj", "model.layers.3.self_attn.q_proj.weight", 1),
    ("lm_head", "lm_head.weight", 1),
    ("embed_tokens", "model.embed_tokens.weight", 1),
    ("norm", "model.norm.weight", 1),
    ("norm", "model.layers.0.input_layernorm.weight", None),
    ("layers.*.self_attn.q_proj", "model.layers.3.self_attn.q_proj_extra.weight", None),
    ("layers.*.mlp", "model.layers.0.mlp.up_proj.weight", None),   # '*' stays in a segment
    ("layers.*", "model.layers.0.mlp.up_proj.weight", None),
    ("layers.*.mlp.*_proj", "model.layers.10.mlp.down_proj.weight", 1),
])
def test_match_pattern(pattern: str, name: str, kind: int | None) -> None:
    assert match_pattern(pattern, name) == kind


@given(st.text("ab*.", max_size=12), st.text("ab.", max_size=12))
def test_patterns_match_as_their_regular_expression_would(pattern: str, name: str) -> None:
    """The backtracking-free matcher means what ``*`` as ``[^.]*`` means."""
    regex = "".join("[^.]*" if c == "*" else re.escape(c) for c in pattern)
    candidates = [name] + ([name[len("model."):]] if name.startswith("model.") else [])
    whole = any(re.fullmatch(regex, n) for n in candidates)
    assert (match_pattern(pattern, name) == 0) == whole


@pytest.mark.timeout(20)
def test_a_pattern_of_many_stars_does_not_backtrack() -> None:
    """Issue 41 item 7: ``*a*a*...*b`` against a long segment without ``b`` took minutes as a
    regular expression (each star backtracks over the others: 4.5 s for 12 stars and 30
    characters, growing exponentially)."""
    pattern = "*a" * 40 + "*b"
    plan = TPPlan({pattern: "replicate", "x": "replicate"})
    names = ["a" * 300 + str(i) for i in range(50)]
    assert all(plan.style_of(n) is None for n in names)
    with pytest.raises(PlanError, match="more than 1024"):
        TPPlan({"*" * 1025: "replicate"})
    with pytest.raises(PlanError, match="4097 patterns, more than 4096"):
        TPPlan({f"x{i}": "replicate" for i in range(4097)})


@given(st.dictionaries(st.text("ab*.", min_size=1, max_size=10),
                       st.sampled_from(["colwise", "rowwise", "replicate"]), max_size=6),
       st.text("ab.", max_size=10))
def test_the_index_picks_the_pattern_a_scan_of_every_pattern_picks(
        patterns: dict[str, str], name: str) -> None:
    """TPPlan.style_of (the segment trie) agrees with checking each pattern in turn by
    match_pattern under the documented order: tensor over module, fewest stars, longest,
    first."""
    ranked = [(kind, p.count("*"), -len(p), i) for i, p in enumerate(patterns)
              if (kind := match_pattern(p, name)) is not None]
    want = patterns[list(patterns)[min(ranked)[3]]] if ranked else None
    assert TPPlan(patterns).style_of(name) == want


def test_many_patterns_cost_checks_per_distinct_segment_not_per_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41, its benchmark: a 10 MB --plan of thousands of many-star patterns took minutes
    on a real model's names (every pattern checked against every name). Starred segments are
    now checked once per distinct text of a name at their depth: 3,000 patterns and 723 names
    cost 3,000 x 3 segment checks (model.{embed_tokens,layers,norm}), not 3,000 x 723."""
    import shardspec.convert.patterns as patterns_module

    calls = 0
    real = patterns_module._segment

    def counted(chunks: list[str], text: str) -> bool:
        nonlocal calls
        calls += 1
        return real(chunks, text)

    monkeypatch.setattr(patterns_module, "_segment", counted)
    plan = TPPlan({"model." + "*a" * 400 + f"{i}": "colwise" for i in range(3000)})
    modules = ["self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj", "input_layernorm"]
    names = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{m}.weight" for i in range(180) for m in modules]
    assert all(plan.style_of(n) is None for n in names)
    assert calls <= 3000 * 3, calls


def test_most_specific_pattern_wins() -> None:
    plan = TPPlan({
        "layers.*.mlp.*_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
        "layers.*.mlp.down_proj.bias": "replicate",
        "layers.0.mlp.up_proj": "replicate",
    })
    assert plan.style_of("model.layers.1.mlp.gate_proj.weight") == "colwise"
    assert plan.style_of("model.layers.1.mlp.down_proj.weight") == "rowwise"
    assert plan.style_of("model.layers.1.mlp.down_proj.bias") == "replicate"
    assert plan.style_of("model.layers.0.mlp.up_proj.weight") == "replicate"
    assert plan.style_of("model.layers.1.mlp.up_proj.weight") == "colwise"
    assert plan.style_of("model.norm.weight") is None


def test_unmatched_tensor_is_an_error_naming_it() -> None:
    plan = TPPlan({"norm": "replicate"})
    with pytest.raises(PlanError, match="'model.layers.0.mystery.weight'.*replicate"):
        plan.styles(["model.norm.weight", "model.layers.0.mystery.weight"])


def test_split_sizes() -> None:
    assert split_sizes(8, 4) == [2, 2, 2, 2]
    assert split_sizes(0, 4) == [0, 0, 0, 0]
    with pytest.raises(PlanError, match=r"'w'.*dim 1 has size 10.*--allow-uneven"):
        split_sizes(10, 4, name="w", dim=1)
    assert split_sizes(10, 4, allow_uneven=True) == [3, 3, 2, 2]


def test_resolve_plan_precedence(tmp_path: Path) -> None:
    given = TPPlan({"x": "replicate"}, source="mine")
    assert resolve_plan({"model_type": "llama"}, given) == given
    assert resolve_plan(None, {"x": "colwise"}).patterns == {"x": "colwise"}
    config_plan = {"layers.*.mlp.up_proj": "rowwise"}
    from_config = resolve_plan({"model_type": "whatever", "base_model_tp_plan": config_plan},
                               None)
    assert from_config.patterns == {**COMMON_EXTRAS, **config_plan}
    for model_type in ("llama", "mistral", "qwen2"):
        assert resolve_plan({"model_type": model_type}, None).patterns == BUILTIN_PLAN
    # Neither the config nor transformers has one: the Llama-shaped plan. For a type
    # transformers knows, what it does not name is kept whole; for any other it must name
    # every tensor, and the message says what to do.
    known = resolve_plan({"model_type": "gpt2"}, None)
    assert known.patterns == BUILTIN_PLAN and known.unnamed == "replicate"
    assert known.styles(["transformer.h.0.attn.c_attn.weight"]) == {
        "transformer.h.0.attn.c_attn.weight": "replicate"}
    unknown = resolve_plan({"model_type": "mystery"}, None)
    assert unknown.patterns == BUILTIN_PLAN and unknown.unnamed is None
    with pytest.raises(PlanError, match="'mystery'.*--plan"):
        unknown.styles(["transformer.h.0.attn.c_attn.weight"])


def test_builtin_plan_agrees_with_transformers() -> None:
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    for config in (LlamaConfig, MistralConfig, Qwen2Config):
        for pattern, style in config.base_model_tp_plan.items():
            assert BUILTIN_PLAN[pattern] == style, (config.__name__, pattern)


def test_load_plan_file(tmp_path: Path) -> None:
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"norm": "replicate"}))
    assert load_plan_file(flat).patterns == {"norm": "replicate"}
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"base_model_tp_plan": {"norm": "replicate"}}))
    # transformers' wrapping is read as transformers reads it: completed, the rest kept whole
    assert load_plan_file(nested).patterns == {**COMMON_EXTRAS, "norm": "replicate"}
    assert load_plan_file(nested).unnamed == "replicate"
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(PlanError, match="JSON object"):
        load_plan_file(bad)
    with pytest.raises(PlanError, match="cannot read"):
        load_plan_file(tmp_path / "missing.json")


@pytest.mark.parametrize("model_type", [["llama"], 3, {"a": 1}])
def test_a_model_type_that_is_not_a_string_is_refused(model_type: object) -> None:
    """Issue 41 item 11: a list was looked up in a set and surfaced as a TypeError."""
    with pytest.raises(PlanError, match="model_type must be a string"):
        resolve_plan({"model_type": model_type}, None)
