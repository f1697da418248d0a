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
            str(Path(__file__).resolve().parents[2]),  # dtwork itself, also as an editable install
        )
        if p
    }
)

_files: dict[str, tuple[int, str | None]] = {}  # module name -> (id, its user file or None)
_seen: dict[str, tuple[int, tuple[str, int, int]]] = {}  # module name -> (id, its file's stamp when loaded)
_old_objects: dict[object, object] = {}  # superreload's memory of the objects each reload replaced
_looked: list[tuple[int, str, int] | None] = [None]  # sys.modules' mark when it was last looked through
_users: dict[str, tuple[int, str]] = {}  # the user's modules found then: name -> (id, file)


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


def _mark() -> tuple[int, str, int] | None:
    """sys.modules' size and its newest entry: a module imported, dropped and imported again, or
    set aside and put back, changes one of them, since an entry added goes last (dicts keep order)."""
    try:
        last = next(reversed(sys.modules))
        return len(sys.modules), last, id(sys.modules.get(last))
    except (RuntimeError, StopIteration):  # another thread imports meanwhile
        return None


def _user_files() -> dict[str, tuple[int, str]]:
    """The user's modules now (name -> (id, file)); sys.modules is looked through again only when
    its mark moved or one of these was replaced, since a cell runs among thousands of modules."""
    modules, mark = sys.modules, _mark()
    if mark is None or mark != _looked[0] or any(id(modules.get(n)) != i for n, (i, _) in _users.items()):
        _users.clear()
        for name, module in list(modules.items()):
            if (file := _user_file(name, module)) is not None:
                _users[name] = (id(module), file)
        _looked[0] = mark
    return _users


def user_modules(folders: tuple[str, ...]) -> dict[str, ModuleType]:
    """Modules imported from ``folders`` and not from the Python installation (nor dtwork)."""
    return _in_folders(_user_files(), folders)


def _in_folders(users: dict[str, tuple[int, str]], folders: tuple[str, ...]) -> dict[str, ModuleType]:
    found = {}
    for name, (_, file) in list(users.items()):
        module = sys.modules.get(name)
        if module is not None and within(file, folders):
            found[name] = module
    return found


def _stamp(file: str) -> tuple[str, int, int] | None:
    try:
        st = os.stat(file)
    except OSError:
        return None
    return file, st.st_mtime_ns, st.st_size


def remember() -> dict[str, tuple[int, str]]:
    """Note the files of the user's modules as they are now, for those loaded since (after each
    cell); the user's modules."""
    users = _user_files()
    for name, (ident, file) in list(users.items()):
        seen = _seen.get(name)
        if (seen is None or seen[0] != ident) and (stamp := _stamp(file)):
            _seen[name] = (ident, stamp)
    return users


def reload_changed(folder: str) -> list[str]:
    """Reload the user's modules from ``folder`` whose file changed since it was loaded; their names."""
    from IPython.extensions.autoreload import superreload

    users = remember()  # modules loaded outside a cell (a call) count from now
    reloaded = []
    for name, module in sorted(_in_folders(users, (str(Path(folder).resolve()),)).items()):
        stamp, seen = _stamp(_files[name][1] or ""), _seen.get(name)
        if stamp is None or seen is None or seen[1] == stamp:
            continue
        _seen[name] = (id(module), stamp)  # a file that fails to load is not tried again until edited
        try:
            superreload(module, importlib.reload, _old_objects)
        except Exception as exc:  # the cell still runs, with the module as it was
            reloaded.append(f"{name} (failed, kept as it was: {type(exc).__name__}: {exc})")
            continue
        reloaded.append(name)
    return reloaded
