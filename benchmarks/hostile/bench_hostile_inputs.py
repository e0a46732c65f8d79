"""Hostile inputs other than a manifest (issue 41): time and peak memory of each CLI command.

The bound of issue 41, the one bench_hostile.py checks on manifests: no input under 10 MB makes
a command take more than 5 s or 1 GiB. Here the inputs are the ones round three added, each
about 10 MB (the conformance runner is bench_hostile_runner.py, DCP objects
bench_hostile_dcp.py):

- ``convert`` of a small Hugging Face directory whose ``config.json``, ``model.safetensors.
  index.json``, ``--plan`` or ``--stages`` file nests 5 million levels deep;
- ``convert`` with a ``--plan`` of many-star patterns (each as long as allowed, 1024
  characters) and with a ``config.json`` of 10 MB of keys (wide, not deep);
- ``import`` of a distributed save whose file's ``DCP_SHARDING_INFO`` nests deeply;
- ``validate s3://...`` with ``SHARDSPEC_STORAGE_OPTIONS`` nesting deeply (answered before any
  request; 120 KB, as Linux caps one environment string at 128 KiB);
- ``fetch-config`` (issue 49) of a local checkpoint with 1,024 tiny extra files, the most it
  fetches, and of one with a 256 MiB extra file, streamed to its temporary file.

Each command runs in a fresh child process through ``shardspec.cli.main`` (torch imported
before the clock, as the commands import it); time is the command alone, memory the child's
peak resident set (``ru_maxrss``, imports included). Median of ``--repeats`` for time, largest
peak for memory. The answer column is the exit status: 2 is the clean refusal expected of
every deep input.

Run: ``PYTHONPATH=reference python benchmarks/hostile/bench_hostile_inputs.py [--repeats 3]``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import harness.hostile as hostile  # noqa: E402
from harness import use_test_helpers  # noqa: E402

use_test_helpers()
from hf_helpers import llama_tensors, write_hf_dir  # noqa: E402

SIZE = 10_000_000  # bytes of each hostile input
ENV_SIZE = 120_000  # Linux caps one environment string at 128 KiB (MAX_ARG_STRLEN)



def deep(size: int = SIZE) -> str:
    half = size // 2
    return "[" * half + "]" * half


def many_star_plan(size: int = SIZE) -> str:
    pattern = "model." + "*a" * 505  # 1016 characters, and an index: about the longest allowed
    count = size // (len(pattern) + 12)
    return json.dumps({f"{pattern}{i}": "colwise" for i in range(count)})


def wide_config(base: dict[str, object], size: int = SIZE) -> str:
    extra = {f"key_{i:07d}": i for i in range(size // 20)}
    return json.dumps({**base, **extra})


Case = Callable[[Path, Path], list[str]]  # (hf dir, work dir) -> command arguments


def cases() -> dict[str, tuple[Case, str]]:
    def convert(hf: Path, work: Path, *more: str) -> list[str]:
        return ["convert", str(hf), str(work / "out"), "--tp", "2", *more]

    def deep_config(hf: Path, work: Path) -> list[str]:
        (hf / "config.json").write_text(deep())
        return convert(hf, work)

    def wide(hf: Path, work: Path) -> list[str]:
        base = json.loads((hf / "config.json").read_text())
        (hf / "config.json").write_text(wide_config(base))
        return convert(hf, work)

    def deep_index(hf: Path, work: Path) -> list[str]:
        (hf / "model.safetensors.index.json").write_text(deep())
        return convert(hf, work)

    def deep_plan(hf: Path, work: Path) -> list[str]:
        (work / "plan.json").write_text(deep())
        return convert(hf, work, "--plan", str(work / "plan.json"))

    def star_plan(hf: Path, work: Path) -> list[str]:
        (work / "plan.json").write_text(many_star_plan())
        return convert(hf, work, "--plan", str(work / "plan.json"))

    def deep_stages(hf: Path, work: Path) -> list[str]:
        (work / "stages.json").write_text(deep())
        return ["convert", str(hf), str(work / "out"), "--tp", "1", "--pp", "2", "--stages",
                str(work / "stages.json")]

    def deep_sharding_info(hf: Path, work: Path) -> list[str]:
        from safetensors.torch import save_file
        save = work / "save"
        save.mkdir()
        shutil.copy(hf / "config.json", save / "config.json")
        save_file({"w": torch.zeros(4)}, str(save / "shard-00001-model-00001-of-00001"
                                                   ".safetensors"),
                  metadata={"DCP_SHARDING_INFO": deep()})
        return ["import", str(save)]

    def many_extras(hf: Path, work: Path) -> list[str]:
        """A local checkpoint with 1,024 tiny extra files (the bound): fetch-config."""
        import shardspec
        sources = work / "sources"
        sources.mkdir()
        extras = {}
        for i in range(1024):
            extras[f"tok/{i}.json"] = sources / f"{i}.json"
            extras[f"tok/{i}.json"].write_text("{}")
        shardspec.save({0: {"w": torch.zeros(2)}}, work / "ckpt",
                       layout=shardspec.Layout(tp_size=1), extra_files=extras)
        return ["fetch-config", str(work / "ckpt"), str(work / "local")]

    def big_extra(hf: Path, work: Path) -> list[str]:
        """A 256 MiB extra file: fetch-config streams it (it was held whole: 486 MB peak for
        200 MB)."""
        import shardspec
        big = work / "big.bin"
        with big.open("wb") as out:
            for _ in range(256):
                out.write(os.urandom(1 << 20))
        shardspec.save({0: {"w": torch.zeros(2)}}, work / "ckpt",
                       layout=shardspec.Layout(tp_size=1), extra_files=[big])
        return ["fetch-config", str(work / "ckpt"), str(work / "local")]

    def deep_options(hf: Path, work: Path) -> list[str]:
        os.environ["SHARDSPEC_STORAGE_OPTIONS"] = deep(ENV_SIZE)
        return ["validate", "s3://bucket/ckpt", "--json"]

    return {
        "convert-deep-config": (deep_config, "config.json nested 5 million levels"),
        "convert-wide-config": (wide, "config.json of 500,000 keys"),
        "convert-deep-index": (deep_index, "model.safetensors.index.json nested deeply"),
        "convert-deep-plan": (deep_plan, "--plan nested deeply"),
        "convert-many-star-plan": (star_plan, "--plan of ~9,700 patterns of ~1020 characters, "
                                   "505 stars each"),
        "convert-deep-stages": (deep_stages, "--stages nested deeply"),
        "import-deep-sharding-info": (deep_sharding_info, "DCP_SHARDING_INFO nested deeply"),
        "validate-deep-storage-options": (deep_options, "SHARDSPEC_STORAGE_OPTIONS nested "
                                          "60,000 levels (120 KB)"),
        "fetch-config-many-extras": (many_extras, "1,024 tiny extra files (0.15 MB manifest)"),
        "fetch-config-big-extra": (big_extra, "one 256 MiB extra file"),
    }


def main() -> None:
    args, chosen = hostile.begin(__doc__, cases(), (
        "| input | what | answer | s | peak RSS MiB | within bound |",
        "|---|---|---|---:|---:|---|"))
    rows = []
    tensors = llama_tensors(layers=2, hidden=64, heads=4, kv_heads=2, dtype=torch.bfloat16)
    for name, (make, what) in chosen.items():
        runs = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="shardspec-hostile-") as tmp:
                hf = write_hf_dir(Path(tmp) / "hf", tensors, shards=2)
                saved = os.environ.get("SHARDSPEC_STORAGE_OPTIONS")
                try:
                    runs.append(hostile.measure(hostile.cli_script(),
                                                [json.dumps(make(hf, Path(tmp)))], timeout=600))
                finally:
                    os.environ.pop("SHARDSPEC_STORAGE_OPTIONS", None)
                    if saved is not None:
                        os.environ["SHARDSPEC_STORAGE_OPTIONS"] = saved
        fields, cells = hostile.within_bound(runs)
        rows.append({"input": name, "what": what, **fields})
        print(f"| {name} | {what} | {fields['answer']} | {cells}", flush=True)
    hostile.finish(rows, args.json)


if __name__ == "__main__":
    main()
