"""Every image the README shows is in the repository, and small (the browser tests take them)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_BYTES = 400_000  # an element's screenshot, cropped: a few hundred KB at most


def _images(text: str) -> list[str]:
    markdown = re.findall(r"!\[[^\]]*\]\(([^)\s]+)", text)
    html = re.findall(r"<img[^>]*\ssrc=\"([^\"]+)\"", text)
    return [p for p in markdown + html if not p.startswith(("http://", "https://"))]


def test_readme_images_exist_and_are_small() -> None:
    images = _images((ROOT / "README.md").read_text(encoding="utf-8"))
    assert {Path(p).name for p in images} >= {"dashboard.png", "sidebar.png", "report.png"}
    for image in images:
        path = ROOT / image
        assert path.is_file(), (
            f"README shows {image}, which is missing: run the browser tests with DTWORK_SCREENSHOTS"
        )
        assert path.stat().st_size <= MAX_BYTES, (
            f"{image} is {path.stat().st_size} bytes: crop it to the element"
        )
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{image} is not a PNG"
