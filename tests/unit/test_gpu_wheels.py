"""benchmarks/gpu/complete.py on small synthetic folders of wheels: what the GPU machine lacks is found."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from benchmarks.gpu import complete

TAG = "py3-none-any"


def wheel(folder: Path, name: str, version: str, *requires: str, tag: str = TAG) -> Path:
    """A wheel holding only its METADATA."""
    path = folder / f"{name}-{version}-{tag}.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(meta) + "\n")
    return path


@pytest.fixture()
def image(tmp_path: Path) -> Path:
    path = tmp_path / "image.txt"
    path.write_text("# the image\ntorch==2.11.0\nnumpy\nPyYAML\n")
    return path


def problems(folder: Path, image: Path) -> list[str]:
    return complete.check(folder, complete.read_image(image)).problems


def test_a_complete_set_passes_with_markers_extras_and_the_image(tmp_path: Path, image: Path) -> None:
    wheel(
        tmp_path,
        "app",
        "1.0",
        "torch>=2.3",
        "numpy>=1.24",
        "pyyaml",
        "lib[fast]>=2",
        "win-only; sys_platform == 'win32'",
        "old-py; python_version < '3.12'",
        "tests-only; extra == 'test'",
    )
    wheel(tmp_path, "lib", "2.1", "speedup; extra == 'fast'", "slow; extra == 'slow'")
    fast = wheel(tmp_path, "speedup", "0.3", tag="cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64")
    assert problems(tmp_path, image) == []
    assert complete.main([str(tmp_path), "--image", str(image)]) == 0
    fast.unlink()  # what the extra asked for is missing now; what no one asked for stays unneeded
    assert [p.split(":")[0] for p in problems(tmp_path, image)] == ["missing speedup"]


def test_missing_and_refused_versions_are_named_and_listed_to_fetch(
    tmp_path: Path, image: Path, capsys
) -> None:
    wheel(tmp_path, "app", "1.0", "lib>=2,<3", "extra-thing[x]", "torch>=2.12", "numpy<3", "pyyaml>=5")
    stale = wheel(tmp_path, "lib", "3.0")
    found = problems(tmp_path, image)
    assert any(p.startswith("missing extra-thing: app 1.0 needs extra-thing[x]") for p in found), found
    assert any("lib 3.0 in its wheel does not meet <3,>=2" in p for p in found), found
    assert any("torch 2.11.0 in the image does not meet >=2.12" in p for p in found), found
    assert complete.main([str(tmp_path), "--image", str(image)]) == 1
    capsys.readouterr()
    assert complete.main([str(tmp_path), "--image", str(image), "--missing"]) == 0
    # torch and pyyaml: the image's; numpy too, but its version is unknown and capped: fetched as well
    assert capsys.readouterr().out.split() == ["extra-thing", "lib<3,>=2", "numpy<3"]
    assert not stale.exists()  # the refused wheel goes, so that the next download replaces it


def test_wheels_that_cannot_install_there_or_come_twice_are_refused(tmp_path: Path, image: Path) -> None:
    wheel(tmp_path, "native", "1.0", tag="cp311-cp311-manylinux_2_17_x86_64")
    wheel(tmp_path, "arm", "1.0", tag="cp312-cp312-manylinux_2_17_aarch64")
    wheel(tmp_path, "newglibc", "1.0", tag="cp312-cp312-manylinux_2_40_x86_64")
    wheel(tmp_path, "stable", "1.0", tag="cp39-abi3-manylinux_2_28_x86_64")
    wheel(tmp_path, "twice", "1.0")
    wheel(tmp_path, "twice", "1.1", tag="py2.py3-none-any")
    found = problems(tmp_path, image)
    for name in ("native", "arm", "newglibc"):
        assert any(p.startswith(f"{name}-1.0-") and "does not install" in p for p in found), (name, found)
    assert not any(p.startswith("stable") for p in found), found
    assert any(p.startswith("two wheels of twice") for p in found), found
