"""The user's own modules on a rank: which they are, and reloading those edited on disk.

A module is the user's when its file lies in a given folder (the notebook's, a script's) and
not in the Python installation nor in dtwork. Cells reload the edited ones before they run, as
IPython's ``%autoreload 2`` does: functions and classes are updated in place, so objects built
from an old class keep working and names imported with ``from m import f`` see the new code.
"""

from __future__ import annotations

import importlib
import os
import site
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

# Folders of the Python installation: modules from there stay imported, as a library does.
INSTALLED: tuple[str, ...] = tuple(
    {
        str(Path(p).resolve())
        for p in (
            *(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")),
            *site.getsitepackages(),
            site.getusersitepackages(),
            sys.prefix,
            sys.base_prefix,
            str(Path(__file__).resolve().parents[1]),  # dtwork itself, also as an editable install
        )
        if p
    }
)

_files: dict[str, tuple[int, str | None]] = {}  # module name -> (id, its user file or None)
_seen: dict[str, tuple[int, tuple[str, int, int]]] = {}  # module name -> (id, its file's stamp when loaded)
_old_objects: dict[object, object] = {}  # superreload's memory of the objects each reload replaced


def within(path: str, folders: tuple[str, ...]) -> bool:
    """Whether ``path`` is one of ``folders`` or inside one."""
    return any(path == f or path.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def _user_file(name: str, module: object) -> str | None:
    """The module's resolved source file when it is the user's (not installed, not dtwork); cached."""
    known = _files.get(name)
    if known is not None and known[0] == id(module):
        return known[1]
    file = getattr(module, "__file__", None)
    try:
        path = str(Path(file).resolve()) if isinstance(file, str) and name != "__main__" else None
    except OSError:
        path = None
    user = path if path is not None and not within(path, INSTALLED) else None
    _files[name] = (id(module), user)
    return user


def user_modules(folders: tuple[str, ...]) -> dict[str, ModuleType]:
    """Modules imported from ``folders`` and not from the Python installation (nor dtwork)."""
    found = {}
    for name, module in list(sys.modules.items()):
        file = _user_file(name, module)
        if file is not None and within(file, folders):
            found[name] = module
    return found


def _stamp(file: str) -> tuple[str, int, int] | None:
    try:
        st = os.stat(file)
    except OSError:
        return None
    return file, st.st_mtime_ns, st.st_size


def remember() -> None:
    """Note the files of the user's modules as they are now, for those loaded since (after each cell)."""
    for name, module in list(sys.modules.items()):
        file = _user_file(name, module)
        seen = _seen.get(name)
        if file is not None and (seen is None or seen[0] != id(module)) and (stamp := _stamp(file)):
            _seen[name] = (id(module), stamp)


def reload_changed(folder: str) -> list[str]:
    """Reload the user's modules from ``folder`` whose file changed since it was loaded; their names."""
    from IPython.extensions.autoreload import superreload

    remember()  # modules loaded outside a cell (a call) count from now
    reloaded = []
    for name, module in sorted(user_modules((str(Path(folder).resolve()),)).items()):
        stamp = _stamp(_files[name][1] or "")
        if stamp is None or _seen[name][1] == stamp:
            continue
        _seen[name] = (id(module), stamp)  # a file that fails to load is not tried again until edited
        try:
            superreload(module, importlib.reload, _old_objects)
        except Exception as exc:  # the cell still runs, with the module as it was
            reloaded.append(f"{name} (failed, kept as it was: {type(exc).__name__}: {exc})")
            continue
        reloaded.append(name)
    return reloaded
