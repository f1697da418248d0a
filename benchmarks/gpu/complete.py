"""Is a folder of wheels complete for the GPU machine (CPython 3.12, Linux x86-64, its image's packages)?

``python benchmarks/gpu/complete.py DIR``: reads every wheel's METADATA, evaluates each ``Requires-Dist``
marker for that machine (with the extras some requirement asked of the wheel), and checks that every
requirement is met by a wheel in DIR or by a package of the image (``image.txt`` beside this file); also
that each wheel installs there and that no name comes twice. Prints the problems; exit status 1 if any.
``--missing``: instead print, one a line, what ``pip download --no-deps`` should fetch next (the unmet
names with every version range asked of them, and the image's names of unknown version that a range caps
from above), first deleting a wheel whose version a range refuses.

Standalone (the standard library and ``packaging``), so it runs on any machine before dtwork is installed.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidWheelFilename, NormalizedName, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

IMAGE = Path(__file__).resolve().parent / "image.txt"
PYTHON = "3.12.3"
# The marker environment of the GPU machine's interpreter.
TARGET = {
    **default_environment(),
    "implementation_name": "cpython",
    "implementation_version": PYTHON,
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "python_full_version": PYTHON,
    "python_version": "3.12",
    "sys_platform": "linux",
}
INTERPRETERS = {"py3", "py312", "cp312"} | {f"cp3{m}" for m in range(2, 13)}  # cp3x: with abi3 only
GLIBC = (2, 39)  # the image's (Ubuntu 24.04, whose Python 3.12.3 it carries)


@dataclass
class Wheel:
    name: NormalizedName
    version: Version
    path: Path
    requires: list[Requirement] = field(default_factory=list)


def read_image(path: Path = IMAGE) -> dict[NormalizedName, Version | None]:
    """The image's packages: name -> version (None where the list names no version)."""
    out: dict[NormalizedName, Version | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = Version(version) if version else None
    return out


def installs_there(path: Path) -> bool:
    """Whether a wheel's tags fit CPython 3.12 on manylinux x86-64 (glibc up to ``GLIBC``)."""
    for tag in parse_wheel_filename(path.name)[3]:
        abi_ok = tag.abi in ("none", "cp312") or (tag.abi == "abi3" and tag.interpreter.startswith("cp3"))
        if tag.interpreter not in INTERPRETERS or not abi_ok:
            continue
        if tag.interpreter.startswith("cp3") and tag.interpreter != "cp312" and tag.abi != "abi3":
            continue
        if tag.platform == "any" or _manylinux_fits(tag.platform):
            return True
    return False


def _manylinux_fits(platform: str) -> bool:
    legacy = {"manylinux1_x86_64": (2, 5), "manylinux2010_x86_64": (2, 12), "manylinux2014_x86_64": (2, 17)}
    if platform in legacy:
        return legacy[platform] <= GLIBC
    parts = platform.split("_")
    if len(parts) == 5 and parts[0] == "manylinux" and "_".join(parts[3:]) == "x86_64":
        return (int(parts[1]), int(parts[2])) <= GLIBC
    return False


def read_wheel(path: Path) -> Wheel:
    """A wheel's name, version and requirements, from its ``*.dist-info/METADATA``."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        headers = HeaderParser().parsestr(z.read(meta).decode("utf-8"))
    requires = [Requirement(r) for r in headers.get_all("Requires-Dist") or []]
    return Wheel(canonicalize_name(headers["Name"]), Version(headers["Version"]), path, requires)


def active(wheel: Wheel, extras: set[str]) -> list[Requirement]:
    """The requirements of ``wheel`` that apply on the target, with the extras asked of it."""
    out = []
    for req in wheel.requires:
        if req.marker is None or any(req.marker.evaluate({**TARGET, "extra": e}) for e in {"", *extras}):
            out.append(req)
    return out


@dataclass
class Report:
    problems: list[str]
    wanted: dict[NormalizedName, SpecifierSet]  # every range asked of each name needed
    stale: list[Path]  # wheels whose version a range refuses


def check(folder: Path, image: dict[NormalizedName, Version | None]) -> Report:
    """Every problem of the folder's wheels on the target."""
    problems: list[str] = []
    wheels: dict[NormalizedName, Wheel] = {}
    for path in sorted(folder.glob("*.whl")):
        try:
            wheel = read_wheel(path)
            fits = installs_there(path)
        except (InvalidWheelFilename, InvalidRequirement, InvalidVersion, StopIteration, KeyError) as exc:
            problems.append(f"{path.name}: unreadable ({type(exc).__name__}: {exc})")
            continue
        if not fits:
            problems.append(f"{path.name}: does not install on CPython 3.12 manylinux x86-64")
        if wheel.name in wheels:
            problems.append(
                f"two wheels of {wheel.name}: {wheels[wheel.name].path.name}, {path.name} (keep one)"
            )
        wheels[wheel.name] = wheel
    extras: dict[NormalizedName, set[str]] = {n: set() for n in wheels}
    grown = True
    while grown:  # the extras asked of a wheel can switch on requirements asking extras of others
        grown = False
        for wheel in wheels.values():
            for req in active(wheel, extras[wheel.name]):
                asked = extras.setdefault(canonicalize_name(req.name), set())
                if not set(req.extras) <= asked:
                    asked |= set(req.extras)
                    grown = True
    wanted: dict[NormalizedName, SpecifierSet] = {}
    needed_by: dict[NormalizedName, list[str]] = {}
    for wheel in wheels.values():
        for req in active(wheel, extras[wheel.name]):
            name = canonicalize_name(req.name)
            wanted[name] = wanted.get(name, SpecifierSet()) & req.specifier
            needed_by.setdefault(name, []).append(f"{wheel.name} {wheel.version} needs {req}")
    stale = []
    for name, spec in sorted(wanted.items()):
        have = wheels[name].version if name in wheels else image.get(name)
        where = "its wheel" if name in wheels else "the image"
        if name not in wheels and name not in image:
            problems.append(f"missing {name}: {'; '.join(needed_by[name])}")
        elif have is not None and not spec.contains(have, prereleases=True):
            problems.append(f"{name} {have} in {where} does not meet {spec}: {'; '.join(needed_by[name])}")
            if name in wheels:
                stale.append(wheels[name].path)
    return Report(problems, wanted, stale)


def to_fetch(report: Report, folder: Path, image: dict[NormalizedName, Version | None]) -> list[str]:
    """The requirement strings to download next; deletes the stale wheels they replace."""
    have = {read_wheel(p).name for p in folder.glob("*.whl")}
    for path in report.stale:
        path.unlink()
        have.discard(read_wheel_name(path))
    # A name the image holds at an unknown version is fetched too when a range caps it: if the image's
    # is too new, pip installs the folder's instead of failing
    known = {n for n in image if image[n] is not None or not _capped(report.wanted.get(n, SpecifierSet()))}
    return [f"{name}{spec}" for name, spec in sorted(report.wanted.items()) if name not in have | known]


def _capped(spec: SpecifierSet) -> bool:
    return any(s.operator in ("<", "<=", "==", "~=", "===") for s in spec)


def read_wheel_name(path: Path) -> NormalizedName:
    return canonicalize_name(parse_wheel_filename(path.name)[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument(
        "--image", type=Path, default=IMAGE, help="the image's package list (name or name==version)"
    )
    ap.add_argument("--missing", action="store_true", help="print what to download next, one a line")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        ap.error(f"{args.folder} is not a folder: run benchmarks/gpu/prepare.sh {args.folder} first")
    image = read_image(args.image)
    report = check(args.folder, image)
    if args.missing:
        for spec in to_fetch(report, args.folder, image):
            print(spec)
        return 0
    for line in report.problems:
        print(f"complete.py: {line}")
    n = len(list(args.folder.glob("*.whl")))
    print(f"complete.py: {n} wheels in {args.folder}: " + ("INCOMPLETE" if report.problems else "complete"))
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
