"""SPEC 2.2: files are opened only inside the checkpoint, only if regular, never blocking."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from shardspec import PathError
from shardspec.storage.paths import open_inside, resolve_inside


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"hello")
    (root / "sub" / "b.bin").write_bytes(b"world!")
    (tmp_path / "secret.bin").write_bytes(b"outside")
    return root


def code_of(root: Path, relative: str) -> str:
    with pytest.raises(PathError) as info:
        handle, _ = open_inside(root, relative)
        handle.close()
    assert info.value.finding.file == relative
    return info.value.code


def test_regular_file_opens_with_its_size(root: Path) -> None:
    handle, size = open_inside(root, "a.bin")
    with handle:
        assert size == 5 and handle.read() == b"hello"
    handle, size = open_inside(root, "sub/b.bin")
    with handle:
        assert size == 6 and handle.read() == b"world!"


@pytest.mark.parametrize("relative", ["/etc/passwd", "../secret.bin", "sub/../../secret.bin",
                                      "sub\\b.bin", "", "./a.bin", "sub//b.bin"])
def test_unsafe_paths_are_refused_lexically(root: Path, relative: str) -> None:
    assert code_of(root, relative) == "path-unsafe"


def test_absolute_path_to_a_file_inside_is_still_unsafe(root: Path) -> None:
    assert code_of(root, str(root / "a.bin")) == "path-unsafe"


def test_symlink_to_a_file_outside_escapes(root: Path) -> None:
    os.symlink(root.parent / "secret.bin", root / "link.bin")
    assert code_of(root, "link.bin") == "path-escapes"


def test_symlinked_directory_outside_escapes(root: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path, root / "up")
    assert code_of(root, "up/secret.bin") == "path-escapes"


def test_symlink_to_a_file_inside_is_fine(root: Path) -> None:
    os.symlink("sub/b.bin", root / "link.bin")
    handle, size = open_inside(root, "link.bin")
    with handle:
        assert size == 6 and handle.read() == b"world!"


def test_root_reached_through_a_symlink_is_fine(root: Path, tmp_path: Path) -> None:
    os.symlink(root, tmp_path / "alias")
    handle, _ = open_inside(tmp_path / "alias", "a.bin")
    handle.close()


def test_dangling_symlink_inside_is_missing(root: Path) -> None:
    os.symlink("nothing-here.bin", root / "dangling.bin")
    assert code_of(root, "dangling.bin") == "file-missing"


def test_missing_file(root: Path) -> None:
    assert code_of(root, "nope.bin") == "file-missing"
    with pytest.raises(PathError) as info:
        resolve_inside(root, "nope.bin")
    assert info.value.section == "2.1"


def test_directory_is_not_regular(root: Path) -> None:
    assert code_of(root, "sub") == "file-not-regular"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_is_not_regular_and_does_not_block(root: Path) -> None:
    fifo = root / "model-rank-0-part-0.safetensors"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            handle, _ = open_inside(root, fifo.name)
            handle.close()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=10)
    if worker.is_alive():
        # release the blocked open so the thread can end, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("opening a FIFO blocked")
    (result,) = outcome
    assert isinstance(result, PathError) and result.code == "file-not-regular"


def test_error_text_names_the_file_and_the_spec(root: Path) -> None:
    with pytest.raises(PathError) as info:
        open_inside(root, "../secret.bin")
    assert "'../secret.bin'" in str(info.value) and "SPEC 2.2" in str(info.value)
