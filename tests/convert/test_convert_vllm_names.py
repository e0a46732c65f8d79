"""``convert(names="vllm")``: vLLM's fused ``qkv_proj`` / ``gate_up_proj`` names, per rank.

The expected state dict of each rank is built here from vLLM's naming (not from the manifest)
and compared bit for bit with what each rank loads. The fused tensors are global tensors of
which each rank holds one piece per part (format 1.3, SPEC 7.2 rule 7), whose join is vLLM's
parameter: the same bytes as the rank-local tensors of ``sharded_state=True`` (what convert
wrote before). That vLLM's own ``sharded_state`` loader accepts the output, and the plugin
serves it, with the same tokens as the Hugging Face original, is tested against a real engine
in test_vllm_engine.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

import shardspec
from hf_helpers import expected_split_dim, llama_tensors, write_hf_dir
from shardspec import Layout, load_rank, validate
from shardspec.cli import app
from shardspec.convert import convert
from shardspec.convert.tp_plan import PlanError, PlanWarning
from shardspec.format.manifest import TensorRecord

FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
         "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def _hf(tmp_path: Path, *, heads: int, kv_heads: int, hidden: int, tie: bool = False,
        bias: bool = False, vocab: int = 64) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = llama_tensors(layers=2, hidden=hidden, heads=heads, kv_heads=kv_heads,
                            tie=tie, bias=bias, dtype=torch.bfloat16, vocab=vocab)
    config: dict[str, object] = {"num_attention_heads": heads, "num_key_value_heads": kv_heads,
                                 "hidden_size": hidden}
    return write_hf_dir(tmp_path / "hf", tensors, tie=tie, config=config), tensors


def _vllm_name(name: str) -> str:
    module, _, leaf = name.rpartition(".")
    head, _, last = module.rpartition(".")
    return f"{head}.{FUSED[last]}.{leaf}" if last in FUSED else name


def _expected(tensors: dict[str, torch.Tensor], tp: int, rank: int, heads: int,
              kv_heads: int, head_dim: int, tie: bool) -> dict[str, torch.Tensor]:
    """vLLM's parameters of ``rank``: fused by heads, the rest sliced as the plan does."""
    full = dict(tensors)
    if tie:
        full["lm_head.weight"] = full.pop("model.embed_tokens.weight")  # vLLM keeps this name
    # vLLM's heads: with fewer key/value heads than ranks, tp / kv_heads ranks share each one
    kv_rank = rank if kv_heads >= tp else rank // (tp // kv_heads)
    heads_of = {"q_proj": (heads // tp, rank), "k_proj": (max(kv_heads // tp, 1), kv_rank),
                "v_proj": (max(kv_heads // tp, 1), kv_rank)}
    out: dict[str, list[torch.Tensor]] = {}
    for name, tensor in full.items():
        last = name.rpartition(".")[0].rpartition(".")[2]
        if last in heads_of:
            rows = heads_of[last][0] * head_dim
            at = heads_of[last][1]
            piece = tensor[at * rows:(at + 1) * rows]
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            # vLLM's vocabulary: padded to a multiple of 64, an equal run of rows a rank,
            # zero rows where the run passes the vocabulary's end
            per_rank = -(-tensor.shape[0] // 64) * 64 // tp
            padded = torch.zeros(per_rank * tp, *tensor.shape[1:], dtype=tensor.dtype)
            padded[:tensor.shape[0]] = tensor
            piece = padded[rank * per_rank:(rank + 1) * per_rank]
        else:
            dim = expected_split_dim(name)
            piece = tensor if dim is None else torch.chunk(tensor, tp, dim=dim)[rank]
        out.setdefault(_vllm_name(name), []).append(piece)
    fused = {n: torch.cat(p, 0) if len(p) > 1 else p[0] for n, p in out.items()}
    for name in list(fused):  # vLLM's Attention buffers, as its default loader leaves them
        if name.endswith("self_attn.qkv_proj.weight"):
            for buffer in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale"):
                fused[name.replace("qkv_proj.weight", "attn." + buffer)] = torch.tensor(1.0)
    return fused


@pytest.mark.parametrize(("heads", "kv_heads", "hidden", "tp", "bias", "tie", "vocab"), [
    (4, 2, 16, 2, False, False, 64),
    (4, 2, 16, 2, True, True, 64),
    (8, 4, 32, 4, True, False, 64),
    (4, 4, 16, 2, False, True, 64),
    (4, 2, 16, 1, True, False, 64),
    (4, 2, 16, 4, True, False, 64),   # 2 key/value heads over 4 ranks: replicas
    (4, 1, 16, 2, False, True, 64),   # 1 key/value head over 2 ranks
    (4, 2, 16, 2, True, False, 100),  # a padded vocabulary: rank-local
])
def test_vllm_names_rank_state_is_vllms_state_dict(
        tmp_path: Path, heads: int, kv_heads: int, hidden: int, tp: int, bias: bool,
        tie: bool, vocab: int) -> None:
    src, tensors = _hf(tmp_path, heads=heads, kv_heads=kv_heads, hidden=hidden, tie=tie,
                       bias=bias, vocab=vocab)
    dst = tmp_path / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)  # replicated key/value heads
        manifest = convert(src, dst, tp_size=tp, names="vllm")
    assert validate(dst, checksums=True).ok
    padded = vocab % 64 != 0
    for name, record in manifest.tensors.items():
        if isinstance(record, TensorRecord):  # only vLLM's padding is no slice of a tensor
            assert record.rank_local == (padded and name.endswith(_VOCAB)), name
    assert not any(n.endswith(("q_proj.weight", "up_proj.weight", "gate_proj.weight"))
                   and "gate_up" not in n for n in manifest.tensors)
    for rank in range(tp):
        want = _expected(tensors, tp, rank, heads, kv_heads, hidden // heads, tie)
        assert any("qkv_proj" in n for n in want) and any("gate_up_proj" in n for n in want)
        assert ("model.layers.0.self_attn.qkv_proj.bias" in want) == bias
        # vLLM's sharded_state file names; at TP 2 and more the second and third pieces of
        # the fused tensors in files of their own (a file holds one entry of a name)
        assert [f.path for f in manifest.ranks[rank].files] == \
            [f"model-rank-{rank}-part-{p}.safetensors" for p in range(1 if tp == 1 else 3)]
        loaded = {name: tensor for name, tensor in load_rank(dst, rank, device="cpu").items()
                   if isinstance(manifest.tensors[name], TensorRecord)}  # the data, not aliases
        assert loaded.keys() == want.keys()
        for name, tensor in want.items():
            assert loaded[name].dtype == tensor.dtype, name
            assert torch.equal(loaded[name], tensor), name


_VOCAB = ("embed_tokens.weight", "lm_head.weight")


def test_vllm_names_qkv_is_rank_slices_by_heads(tmp_path: Path) -> None:
    src, tensors = _hf(tmp_path, heads=4, kv_heads=2, hidden=16)
    dst = tmp_path / "ckpt"
    convert(src, dst, tp_size=2, names="vllm")
    p = "model.layers.1."
    q, k, v = (tensors[f"{p}self_attn.{x}_proj.weight"] for x in "qkv")
    gate, up = tensors[f"{p}mlp.gate_proj.weight"], tensors[f"{p}mlp.up_proj.weight"]
    for rank in range(2):
        state = load_rank(dst, rank, device="cpu")
        qkv = state[f"{p}self_attn.qkv_proj.weight"]
        want = torch.cat([q[rank * 8:(rank + 1) * 8], k[rank * 4:(rank + 1) * 4],
                          v[rank * 4:(rank + 1) * 4]], 0)
        assert qkv.shape == (16, 16)
        assert torch.equal(qkv.view(torch.int16), want.view(torch.int16))
        gate_up = state[f"{p}mlp.gate_up_proj.weight"]
        want = torch.cat([gate[rank * 16:(rank + 1) * 16], up[rank * 16:(rank + 1) * 16]], 0)
        assert torch.equal(gate_up.view(torch.int16), want.view(torch.int16))


def test_vllm_names_refused_for_pp(tmp_path: Path) -> None:
    src, _ = _hf(tmp_path, heads=4, kv_heads=2, hidden=16)
    with pytest.raises(PlanError, match="pp_size = 1"):
        convert(src, tmp_path / "pp", tp_size=2, pp_size=2, names="vllm")
    with pytest.raises(ValueError, match="names must be one of"):
        convert(src, tmp_path / "bad", tp_size=2, names="megatron")
    assert not (tmp_path / "pp").exists()


def test_vllm_names_refused_where_vllm_cannot_deal_the_heads(tmp_path: Path) -> None:
    src, _ = _hf(tmp_path, heads=6, kv_heads=3, hidden=24)
    with pytest.raises(PlanError, match="key/value heads"):
        convert(src, tmp_path / "ckpt", tp_size=2, names="vllm")
    assert not (tmp_path / "ckpt").exists()


def test_vllm_names_need_head_counts(tmp_path: Path) -> None:
    src = write_hf_dir(tmp_path / "hf", llama_tensors(layers=1), heads=None)
    with pytest.raises(PlanError, match="num_attention_heads"):
        convert(src, tmp_path / "ckpt", tp_size=2, names="vllm")


def test_cli_convert_names_vllm(tmp_path: Path) -> None:
    src, _ = _hf(tmp_path, heads=4, kv_heads=2, hidden=16)
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "ckpt"), "--tp", "2",
                                 "--names", "vllm"])
    assert result.exit_code == 0, result.output
    from shardspec import open as open_checkpoint

    tensors = open_checkpoint(tmp_path / "ckpt").manifest.tensors
    assert "model.layers.0.self_attn.qkv_proj.weight" in tensors
    assert "model.layers.0.mlp.gate_up_proj.weight" in tensors
    assert "model.layers.0.self_attn.q_proj.weight" not in tensors
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "pp"), "--tp", "2",
                                 "--pp", "2", "--names", "vllm"])
    assert result.exit_code == 2
    assert "pp_size = 1" in result.output
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "x"), "--tp", "2",
                                 "--names", "nope"])
    assert result.exit_code == 2


def test_cli_convert_sharded_state_writes_fused_tensors_rank_local(tmp_path: Path) -> None:
    """``--sharded-state``: one file a rank, fused tensors rank-local, as vLLM's own loader
    reads them; the same bytes each rank joins from the default's pieces."""
    from shardspec import load_rank
    from shardspec import open as open_checkpoint

    src, _ = _hf(tmp_path, heads=4, kv_heads=2, hidden=16)
    runner = CliRunner()
    for out, extra in (("local", ["--sharded-state"]), ("parts", [])):
        result = runner.invoke(app, ["convert", str(src), str(tmp_path / out), "--tp", "2",
                                     "--names", "vllm", *extra])
        assert result.exit_code == 0, result.output
    local = open_checkpoint(tmp_path / "local")
    fused = local.manifest.tensors["model.layers.0.mlp.gate_up_proj.weight"]
    assert isinstance(fused, TensorRecord) and fused.rank_local
    assert [len(r.files) for r in local.manifest.ranks] == [1, 1]
    parts = open_checkpoint(tmp_path / "parts").manifest.tensors[
        "model.layers.0.mlp.gate_up_proj.weight"]
    assert isinstance(parts, TensorRecord) and not parts.rank_local
    for rank in range(2):
        a = load_rank(tmp_path / "local", rank, "cpu")
        b = load_rank(tmp_path / "parts", rank, "cpu")
        assert a.keys() == b.keys()
        assert all(torch.equal(a[n], b[n]) for n in a)
    result = runner.invoke(app, ["convert", str(src), str(tmp_path / "hf"), "--tp", "2",
                                 "--sharded-state"])
    assert result.exit_code == 2 and "names" in result.output


# --- the fused tensors are global, cut per part (format 1.3) ---------------------------------

def _ckpt(tmp_path: Path, *, tp: int, kv_heads: int = 2, **kwargs: object
          ) -> tuple[Path, dict[str, torch.Tensor]]:
    src, tensors = _hf(tmp_path, heads=4, kv_heads=kv_heads, hidden=16, bias=True)
    dst = tmp_path / f"ckpt-tp{tp}{'-local' if kwargs else ''}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)  # replicated key/value heads
        convert(src, dst, tp_size=tp, names="vllm", **kwargs)  # type: ignore[arg-type]
    return dst, tensors


def _global(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The global tensor of a name of the vLLM-named checkpoint, from the Hugging Face ones."""
    module, _, leaf = name.rpartition(".")
    prefix, _, last = module.rpartition(".")
    if last == "qkv_proj":
        return torch.cat([tensors[f"{prefix}.{x}_proj.{leaf}"] for x in "qkv"])
    if last == "gate_up_proj":
        return torch.cat([tensors[f"{prefix}.{x}_proj.{leaf}"] for x in ("gate", "up")])
    if name.endswith(("_k_scale", "_v_scale", "_q_scale", "_prob_scale")):
        return torch.tensor(1.0)
    return tensors[name]


def test_vllm_names_fused_are_global_with_a_piece_per_part_and_replicas(tmp_path: Path) -> None:
    """TP 4 with 2 key/value heads: each rank holds its q rows, and the rows of its key/value
    head of k and of v, each in a file of its own; the second rank of each head holds
    replicas. gate_up_proj: the rank's gate rows and its up rows."""
    dst, _ = _ckpt(tmp_path, tp=4)
    manifest = shardspec.open(dst).manifest
    for leaf in ("weight", "bias"):
        qkv = manifest.tensors[f"model.layers.0.self_attn.qkv_proj.{leaf}"]
        assert isinstance(qkv, TensorRecord) and not qkv.rank_local
        assert qkv.shape is not None and qkv.shape[0] == 16 + 8 + 8  # q, k, v rows (head 4)
        for rank in range(4):
            head = rank // 2  # two ranks a key/value head
            pieces = [(p.file, p.offset[0], p.shape[0], p.replica)  # type: ignore[index]
                      for p in qkv.pieces if p.rank == rank]
            assert pieces == [
                (f"model-rank-{rank}-part-0.safetensors", rank * 4, 4, 0),
                (f"model-rank-{rank}-part-1.safetensors", 16 + head * 4, 4, rank % 2),
                (f"model-rank-{rank}-part-2.safetensors", 24 + head * 4, 4, rank % 2)]
    gate_up = manifest.tensors["model.layers.1.mlp.gate_up_proj.weight"]
    assert isinstance(gate_up, TensorRecord) and gate_up.shape == (64, 16)
    for rank in range(4):
        assert [(p.offset, p.shape, p.replica) for p in gate_up.pieces if p.rank == rank] == [
            ((rank * 8, 0), (8, 16), 0), ((32 + rank * 8, 0), (8, 16), 0)]


def test_vllm_names_replicated_heads_warning_names_the_fused_tensor(tmp_path: Path) -> None:
    """The notice of replicated key/value heads names a tensor the checkpoint holds."""
    src, _ = _hf(tmp_path, heads=4, kv_heads=2, hidden=16)
    with pytest.warns(PlanWarning, match="each key/value head is held by 2") as caught:
        convert(src, tmp_path / "out", tp_size=4, names="vllm")
    message = str(caught[0].message)
    assert "self_attn.qkv_proj.weight'" in message and "k_proj" not in message, message


def test_vllm_names_each_file_says_where_its_own_piece_lies(tmp_path: Path) -> None:
    """torch's DCP_SHARDING_INFO: one entry per name per file, each the offset of the piece
    that file holds."""
    dst, _ = _ckpt(tmp_path, tp=2)
    manifest = shardspec.open(dst).manifest
    for rank in range(2):
        for record in manifest.ranks[rank].files:
            with safe_open(str(dst / record.path), framework="pt") as f:
                info = json.loads(f.metadata()["DCP_SHARDING_INFO"])
                assert set(info) == set(f.keys())
            for name, entry in info.items():
                tensor = manifest.tensors[name]
                assert isinstance(tensor, TensorRecord)
                piece = next(p for p in tensor.pieces
                             if p.rank == rank and p.file == record.path)
                assert entry == {"saved_offsets": list(piece.offset or ())}, (name, record)


@pytest.mark.parametrize(("tp", "kv_heads"), [(1, 2), (2, 2), (4, 2), (2, 1)])
def test_vllm_names_ranks_load_what_the_rank_local_convert_wrote(
        tmp_path: Path, tp: int, kv_heads: int) -> None:
    """Every rank's value, joined from its pieces, is byte for byte the rank-local tensor of
    ``sharded_state=True`` (what convert wrote before format 1.3)."""
    joined, _ = _ckpt(tmp_path, tp=tp, kv_heads=kv_heads)
    local, _ = _ckpt(tmp_path, tp=tp, kv_heads=kv_heads, sharded_state=True)
    records = shardspec.open(local).manifest
    for name in ("model.layers.0.self_attn.qkv_proj.weight",
                 "model.layers.0.self_attn.qkv_proj.bias",
                 "model.layers.1.mlp.gate_up_proj.weight"):
        record = records.tensors[name]
        assert isinstance(record, TensorRecord) and record.rank_local
    assert [len(r.files) for r in records.ranks] == [1] * tp  # one entry a name a rank
    for rank in range(tp):
        want = load_rank(local, rank, device="cpu")
        got = load_rank(joined, rank, device="cpu")
        assert got.keys() == want.keys()
        for name, tensor in want.items():
            assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
            assert torch.equal(got[name].view(torch.uint8) if tensor.dim() else got[name],
                               tensor.view(torch.uint8) if tensor.dim() else tensor), name


def test_vllm_names_sharded_state_needs_vllm_names(tmp_path: Path) -> None:
    src, _ = _hf(tmp_path, heads=4, kv_heads=2, hidden=16)
    with pytest.raises(ValueError, match="sharded_state"):
        convert(src, tmp_path / "ckpt", tp_size=2, sharded_state=True)


@pytest.mark.parametrize(("tp", "kv_heads"), [(2, 2), (4, 2)])
def test_vllm_names_validate_and_reshard_as_slices_of_the_global_tensors(
        tmp_path: Path, tp: int, kv_heads: int) -> None:
    dst, tensors = _ckpt(tmp_path, tp=tp, kv_heads=kv_heads)
    runner = CliRunner()
    result = runner.invoke(app, ["validate", str(dst), "--checksums"])
    assert result.exit_code == 0, result.output
    resharded = tmp_path / "tp1"
    result = runner.invoke(app, ["reshard", str(dst), str(resharded), "--tp", "1"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["validate", str(resharded), "--checksums"])
    assert result.exit_code == 0, result.output
    manifest = shardspec.open(resharded).manifest
    state = load_rank(resharded, 0, device="cpu")
    for name, record in manifest.tensors.items():
        if not isinstance(record, TensorRecord):
            continue
        assert record.shape is not None and len(record.pieces) == 1, name
        assert torch.equal(state[name], _global(tensors, name)), name
    # At TP 1 the fused tensors are vLLM's TP 1 parameters: q, k, v rows; gate, up rows.
    assert state["model.layers.0.self_attn.qkv_proj.weight"].shape == (32, 16)
    # Read at TP 1 without writing it: the same values (resharded on load).
    on_load = shardspec.open(dst).load_rank(0, "cpu", layout=Layout(tp_size=1))
    assert on_load.keys() == state.keys()
    assert all(torch.equal(on_load[name], state[name]) for name in state)


@pytest.mark.parametrize(("source", "target", "kv_heads"),
                         [(2, 1, 2), (2, 4, 2), (4, 2, 2), (4, 1, 2), (4, 2, 1), (2, 4, 1)])
def test_vllm_names_reshard_keeps_parts_as_convert_writes_them_at_the_new_tp(
        tmp_path: Path, source: int, target: int, kv_heads: int) -> None:
    """SPEC 11.3 rule 12: `reshard` of a vLLM-named checkpoint cuts qkv_proj and gate_up_proj
    part by part, q, k and v in whole heads (key/value heads replicated where fewer than
    ranks): the manifest's tensors are those convert writes at the new TP, and every data
    file holds the same entries and bytes. Read at the new TP without writing: the same."""
    src, _ = _hf(tmp_path, heads=4, kv_heads=kv_heads, hidden=16, bias=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)  # replicated key/value heads
        convert(src, tmp_path / "from", tp_size=source, names="vllm")
        convert(src, tmp_path / "want", tp_size=target, names="vllm")
    result = CliRunner().invoke(app, ["reshard", str(tmp_path / "from"), str(tmp_path / "got"),
                                      "--tp", str(target)])
    assert result.exit_code == 0, result.output
    got, want = (shardspec.open(tmp_path / d).manifest for d in ("got", "want"))
    assert got.to_dict()["tensors"] == want.to_dict()["tensors"]
    qkv = got.tensors["model.layers.0.self_attn.qkv_proj.weight"]
    assert isinstance(qkv, TensorRecord)
    assert len([p for p in qkv.pieces if p.rank == 0]) == (1 if target == 1 else 3)
    for rank in want.ranks:
        for record in rank.files:
            with safe_open(str(tmp_path / "got" / record.path), framework="pt") as a, \
                    safe_open(str(tmp_path / "want" / record.path), framework="pt") as b:
                names = sorted(b.keys())
                assert sorted(a.keys()) == names, record.path
                for name in names:
                    x, y = a.get_tensor(name), b.get_tensor(name)
                    assert x.dtype == y.dtype and torch.equal(
                        x.view(torch.uint8) if x.dim() else x,
                        y.view(torch.uint8) if y.dim() else y), (record.path, name)
    for rank in range(target):
        on_load = shardspec.open(tmp_path / "from").load_rank(rank, "cpu",
                                                              layout=Layout(tp_size=target))
        wanted = load_rank(tmp_path / "want", rank, device="cpu")
        assert on_load.keys() == wanted.keys()
        for name, tensor in wanted.items():
            assert torch.equal(on_load[name], tensor), (rank, name)
