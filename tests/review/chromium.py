"""A report opened in headless Chromium (Debian's ``chromium`` package): its DOM after
load, and a screenshot whose pixels show the charts drawn.

If ``chromium`` is missing, it is installed with apt-get (the tests run as root on the
CI image); if that fails, the test fails saying so: nothing is skipped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The report's run colours (``headway.review.report.RUN_COLOURS``): today, proposal.
BLUE = (0x1F, 0x77, 0xB4)
ORANGE = (0xFF, 0x7F, 0x0E)


def chromium() -> str:
    found = shutil.which("chromium")
    if found:
        return found
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        if r.returncode != 0:
            pytest.fail(f"chromium is missing and {' '.join(cmd)} failed: {r.stderr[-500:]}")
    found = shutil.which("chromium")
    if not found:
        pytest.fail("apt-get installed chromium, but no chromium is on PATH")
    return found


def _run(args: list[str], profile: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )


@dataclass
class Shown:
    """What the browser showed: charts in the DOM (an ``<img>`` of an embedded SVG each)
    and pixels of each run's colour in the screenshot."""

    charts: int
    #: Pixels of any saturated colour: chart lines and bars (text and tables are grey).
    coloured_pixels: int
    blue_pixels: int
    orange_pixels: int


def screenshot_shows_charts(html: Path, png: Path, *, two_runs: bool = True) -> Shown:
    """Open ``html`` in headless Chromium, check its DOM and a screenshot (to ``png``)."""
    url = html.resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="hw-chromium-") as profile:
        dom = _run(["--dump-dom", url], profile).stdout
        _run(["--window-size=1400,7000", f"--screenshot={png}", url], profile)
    figures = re.findall(r'<figure data-chart="([\w-]+)">.*?<img [^>]*src="([^"]{0,40})', dom)
    assert figures, "no chart in the report's DOM"
    for name, src in figures:
        assert src.startswith("data:image/svg+xml;base64,"), (name, src)
    # Nothing is fetched at view time: no remote URL anywhere in the page.
    assert not re.search(r'(src|href)="(https?:)?//', dom)
    coloured, blue, orange = _colour_pixels(png)
    assert coloured > 2000, f"no chart is drawn in the screenshot ({coloured} coloured pixels)"
    if two_runs:
        assert blue > 500, f"today's lines are not in the screenshot ({blue} blue pixels)"
        assert orange > 500, f"the proposal's lines are not in the screenshot ({orange})"
    return Shown(len(figures), coloured, blue, orange)


def _colour_pixels(png: Path) -> tuple[int, int, int]:
    import matplotlib.image as mpimg
    import numpy as np

    img = np.asarray(mpimg.imread(png))[..., :3]
    if img.dtype != np.uint8:
        img = (img * 255).round()
    img = img.astype(int)

    def near(c: tuple[int, int, int]) -> int:
        return int((np.abs(img - np.array(c)).sum(axis=-1) < 40).sum())

    saturated = int(((img.max(axis=-1) - img.min(axis=-1)) > 80).sum())
    return saturated, near(BLUE), near(ORANGE)
