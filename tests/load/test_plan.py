"""SPEC 6.1 and 11.1: a rank's plan names only its own files and what each must hold."""

from __future__ import annotations

from checkpoints import Tiny
from shardspec.load.plan import plan_rank


def test_plan_lists_only_the_ranks_files_and_tensors(tiny: Tiny) -> None:
    for rank in range(2):
        plan = plan_rank(tiny.manifest, rank)
        assert [f.record.path for f in plan.files] == [f"model-rank-{rank}-part-0.safetensors"]
        (file_plan,) = plan.files
        stored = set(tiny.expected[rank]) - {"lm_head.weight"}
        assert set(file_plan.expected) == stored
        assert plan.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
        assert plan.total_bytes == tiny.manifest.ranks[rank].files[0].size


def test_plan_expects_each_pieces_dtype_and_shape(tiny: Tiny) -> None:
    plan = plan_rank(tiny.manifest, 1)
    expected = plan.files[0].expected
    assert expected["layers.0.col.weight"] == ("BF16", (4, 4))
    assert expected["layers.0.row.weight"] == ("F32", (4, 3))
    assert expected["layers.0.qkv.weight"] == ("BF16", (4, 4))
    assert expected["step"] == ("F64", ())
    assert expected["empty"] == ("F16", (0, 4))
