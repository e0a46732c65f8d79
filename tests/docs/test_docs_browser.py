"""The documentation site renders in a real browser, with its navigation.

The site is built with ``mkdocs build --strict`` into a temporary directory, served on
127.0.0.1 by a thread of this process, and loaded by headless Chromium (Debian's ``chromium``
package, which ``.ci/run`` installs where it is missing), which prints the DOM after the page's
scripts ran. The home page and the specification must have the Material layout (tabs, the
navigation with its entries, search, the palette toggle), their content, and what only the
theme's JavaScript adds (copy buttons on code blocks), which shows that the site's assets load.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

pytest.importorskip("mkdocs", reason="the docs extra is not installed (make test installs it)")
pytestmark = pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                                reason="Chromium is not installed (apt-get install chromium)")


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of the freshly built site, served until the module's tests are done."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                            "--site-dir", str(out)], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(QuietHandler, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def dump_dom(url: str, profile: Path) -> str:
    """The DOM of ``url`` after load, as headless Chromium serializes it."""
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-dev-shm-usage", "--disable-extensions",
         f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)
    assert result.returncode == 0 and "<html" in result.stdout, result.stderr[-3000:]
    return result.stdout


def nav_titles(dom: str) -> list[str]:
    """The titles of the primary navigation's links."""
    return [" ".join(re.sub(r"<[^>]+>", " ", m).split())
            for m in re.findall(r'<a [^>]*class="md-nav__link[^"]*"[^>]*>(.*?)</a>', dom, re.S)]


def assert_material_page(dom: str) -> None:
    assert 'class="md-header' in dom and "md-tabs" in dom, "no Material header and tabs"
    titles = nav_titles(dom)
    for entry in ("Home", "Quickstart", "Specification", "Manifest schema", "Command line",
                  "Python API", "Writing a reader", "Benchmarks", "Changelog"):
        assert entry in titles, f"navigation lacks {entry!r}: {titles}"
    assert "md-search__input" in dom, "no search box"
    assert 'data-md-component="palette"' in dom, "no light/dark palette toggle"
    assert re.search(r"<button[^>]*data-clipboard-target", dom), \
        "no copy buttons on code: the theme's JavaScript did not run"


def test_home_page_renders_with_navigation(site: str, tmp_path: Path) -> None:
    dom = dump_dom(site, tmp_path / "profile")
    assert "<title>shardspec</title>" in dom
    assert_material_page(dom)
    assert "pre-sharded model weights" in dom
    assert 'src="assets/benchmark-load.svg"' in dom
    with urllib.request.urlopen(site + "assets/benchmark-load.svg", timeout=30) as chart:
        assert b"<svg" in chart.read(200)


def test_spec_page_renders_with_navigation(site: str, tmp_path: Path) -> None:
    dom = dump_dom(site + "spec/", tmp_path / "profile")
    assert_material_page(dom)
    active = re.search(r'<a [^>]*class="md-nav__link md-nav__link--active"[^>]*>(.*?)</a>',
                       dom, re.S)
    assert active and "Specification" in active[1], "the spec is not the active page"
    heading = re.search(r'<h3 id="63-safetensors-container-rules">(.*?)</h3>', dom, re.S)
    assert heading and "6.3 safetensors container rules" in heading[1]
    assert 'href="#111-reader-procedure"' in dom, "the contents' links are not there"
    assert "md-sidebar--secondary" in dom and "Appendix A. Complete example manifest" in dom
