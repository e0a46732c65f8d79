"""A world of spawned ranks, as the distributed tests run one: each rank a process that writes
its report to ``result-RANK.json`` in the run's folder; a world that outlives its time is hung,
and fails rather than waits."""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def spawn_world(run_dir: Path, world: int, child: Callable[..., None], args: tuple[Any, ...],
                seconds: float, name: str) -> list[dict[str, Any] | None]:
    """Run ``child(rank, world, run_dir, *args)`` on ``world`` spawned ranks; each rank's report
    (None: it died without one)."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=child, args=(r, world, str(run_dir), *args))
             for r in range(world)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + seconds
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, proc in enumerate(procs) if proc.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert not hung, f"ranks {hung} of {name!r} still running after {seconds}s"
    results = []
    for r in range(world):
        out = run_dir / f"result-{r}.json"
        results.append(json.loads(out.read_text()) if out.exists() else None)
    return results
