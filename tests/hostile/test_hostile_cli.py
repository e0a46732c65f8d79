"""Hostile input, round three (issue 41), at the CLI: JSON nested past any real configuration
(item 10), config.json values of the wrong type where the vLLM plugin reads them (item 11), and
--storage-options that no filesystem takes, reported in JSON under --json (item 12).

Each case is a clean error with exit 2 (JSON under --json), never "internal error"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from hf_helpers import llama_tensors, write_hf_dir
from shardspec.cli import app
from shardspec.format.json_text import load_json
from shardspec.format.limits import MAX_JSON_DEPTH
from shardspec.integrations.vllm.regions import Heads

runner = CliRunner()

#: Deeper than Python's parser follows (a RecursionError before issue 41 item 10).
DEEP = '{"a":' * 100_000 + "1" + "}" * 100_000
#: Parses, but one level past the bound: refused all the same, whatever the stack.
JUST_PAST = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)


@pytest.fixture
def hf(tmp_path: Path) -> Path:
    return write_hf_dir(tmp_path / "hf", llama_tensors(layers=2, hidden=64, heads=4,
                                                       kv_heads=2, dtype=torch.bfloat16),
                        shards=2)


def _refused_text(result: object, *words: str) -> None:
    """convert has no --json: exit 2 and a message on stderr."""
    said = result.stdout + result.stderr  # type: ignore[attr-defined]
    assert "internal error" not in said and "Traceback" not in said
    assert result.exit_code == 2, said  # type: ignore[attr-defined]
    for word in words:
        assert word in said, said


def _refused(result: object, *words: str) -> dict[str, object]:
    output = result.stdout  # type: ignore[attr-defined]
    assert "internal error" not in output + result.stderr  # type: ignore[attr-defined]
    assert result.exit_code == 2, output  # type: ignore[attr-defined]
    data = json.loads(output)
    assert data["ok"] is False and data["exit_code"] == 2
    for word in words:
        assert word in json.dumps(data), data
    return data


@pytest.mark.parametrize("text", [DEEP, JUST_PAST], ids=["deep", "just-past"])
def test_load_json_refuses_deep_nesting_as_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
        load_json(text)
    assert load_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None


@pytest.mark.parametrize("where", ["config.json", "model.safetensors.index.json"])
@pytest.mark.parametrize("text", [DEEP, JUST_PAST], ids=["deep", "just-past"])
def test_convert_refuses_a_deeply_nested_input_file(hf: Path, tmp_path: Path, where: str,
                                                    text: str) -> None:
    if where == "config.json":
        config = json.loads((hf / where).read_text())
        (hf / where).write_text(json.dumps(config)[:-1] + ', "x": ' + text + "}")
    else:
        (hf / where).write_text(text)
    result = runner.invoke(app, ["convert", str(hf), str(tmp_path / "out"), "--tp", "2"])
    _refused_text(result, where, "nested deeper")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--plan", "--stages"])
def test_convert_refuses_a_deeply_nested_plan_or_stages_file(hf: Path, tmp_path: Path,
                                                             flag: str) -> None:
    file = tmp_path / "given.json"
    file.write_text('{"model.*": ' + DEEP + "}")
    args = ["convert", str(hf), str(tmp_path / "out"), "--tp", "2", flag, str(file)]
    if flag == "--stages":
        args[5:5] = ["--pp", "2"]
    _refused_text(runner.invoke(app, args), "given.json", "nested deeper")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["flag", "environment"])
@pytest.mark.parametrize("options", [DEEP, "[1", "[1]"], ids=["deep", "not-json", "array"])
def test_storage_options_errors_are_json_under_json(source: str, options: str) -> None:
    """The options are parsed before the command runs: their errors used to print as text
    even under --json (and a deep nesting as an internal error)."""
    args = ["validate", "s3://bucket/ckpt", "--json"]
    if source == "flag":
        result = runner.invoke(app, ["--storage-options", options, *args])
    else:
        result = runner.invoke(app, args, env={"SHARDSPEC_STORAGE_OPTIONS": options})
    _refused(result, "--storage-options")


@pytest.mark.parametrize(("options", "said"), [
    ({"client_kwargs": 5}, "client_kwargs must be an object"),
    ({"config_kwargs": [1]}, "config_kwargs must be an object"),
    ({"anon": True, "no_such_option": 1}, "no_such_option"),
], ids=["client-kwargs-int", "config-kwargs-list", "unknown-option"])
def test_storage_options_no_client_takes_are_refused_by_name(options: dict[str, object],
                                                             said: str) -> None:
    """Before, each surfaced from inside s3fs as an internal error (AttributeError in the
    first case, TypeError at the first request in the last)."""
    pytest.importorskip("s3fs")
    result = runner.invoke(app, ["--storage-options", json.dumps(options), "inspect",
                                 "s3://bucket/ckpt", "--json"],
                           env={"AWS_EC2_METADATA_DISABLED": "true"})
    data = _refused(result, "storage-unavailable", said)
    assert data["error"]["file"] == "s3://bucket/ckpt"  # type: ignore[index]


@pytest.mark.parametrize("config", [
    {"num_attention_heads": 8, "hidden_size": "256"},
    {"num_attention_heads": 8, "hidden_size": [256]},
    {"num_attention_heads": "8", "hidden_size": 256},
    {"num_attention_heads": 8, "num_key_value_heads": "2", "hidden_size": 256},
    {"num_attention_heads": 8, "hidden_size": 256, "head_dim": "32"},
    {"num_attention_heads": 8, "hidden_size": True},
])
def test_plugin_head_counts_of_the_wrong_type_are_no_counts(config: dict[str, object]) -> None:
    """Issue 41 item 11 in the vLLM plugin: a string hidden_size raised TypeError while the
    worker computed its boxes; counts that are not positive integers now give none (vLLM's
    head rule is then not applied, and the tensors are read whole)."""
    assert Heads.from_config(config) is None
    assert Heads.from_config({"num_attention_heads": 8, "hidden_size": 256}) == Heads(8, 8, 32)

