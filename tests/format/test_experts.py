"""Routed experts found by name (SPEC 11.3 rule 10, informative)."""

from __future__ import annotations

from shardspec.format.experts import ExpertTensor, expert_rank, find_experts


def test_per_expert_stacked_shared_and_routers() -> None:
    found = find_experts({
        "model.layers.0.mlp.experts.0.gate_proj.weight": (8, 4),
        "model.layers.0.mlp.experts.7.gate_proj.weight_scale_inv": (1, 1),
        "model.layers.1.block_sparse_moe.experts.2.w1.weight": (8, 4),
        "model.layers.2.mlp.experts.gate_up_proj": (16, 8, 4),
        "model.layers.2.mlp.experts.down_proj_blocks": (16, 4, 1, 16),
        "model.layers.0.mlp.shared_experts.gate_proj.weight": (8, 4),
        "model.layers.0.mlp.shared_expert.gate_proj.weight": (8, 4),
        "model.layers.0.mlp.gate.weight": (8, 4),
        "model.layers.0.mlp.experts": (8, 4),
    })
    assert found == {
        "model.layers.0.mlp.experts.0.gate_proj.weight":
            ExpertTensor("model.layers.0.mlp.experts", 8, 0),
        "model.layers.0.mlp.experts.7.gate_proj.weight_scale_inv":
            ExpertTensor("model.layers.0.mlp.experts", 8, 7),
        "model.layers.1.block_sparse_moe.experts.2.w1.weight":
            ExpertTensor("model.layers.1.block_sparse_moe.experts", 3, 2),
        "model.layers.2.mlp.experts.gate_up_proj":
            ExpertTensor("model.layers.2.mlp.experts", 16, None),
        "model.layers.2.mlp.experts.down_proj_blocks":
            ExpertTensor("model.layers.2.mlp.experts", 16, None),
    }


def test_contiguous_blocks() -> None:
    assert [expert_rank(e, 8, 4) for e in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [expert_rank(e, 4, 1) for e in range(4)] == [0, 0, 0, 0]
