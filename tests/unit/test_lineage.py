"""The names a cell binds and reads, and which earlier cells a run's cells need (store/lineage.py)."""

from __future__ import annotations

from dtwork.store.lineage import names, needed


def test_a_cells_names_are_its_module_level_bindings_and_its_free_reads() -> None:
    found = names(
        "%time x = 1\n"
        "import torch.nn as nn, os.path\n"
        "from math import pi\n"
        "def f(a, *rest, k=default):\n"
        "    local = a + pi + outer\n"
        "    return local\n"
        "class C(Base):\n"
        "    z = 1\n"
        "total += step\n"
        "ys = [g(v) for v in values]\n"
        "print(ctx.rank, len(ys))\n"
    )
    assert found.binds == {"nn", "os", "pi", "f", "C", "total", "ys", "v"}
    assert found.keeps == found.binds - {"v"}
    assert found.reads == {"default", "outer", "Base", "total", "step", "g", "values"}
    assert names("def broken(:\n") == names("")


def test_a_run_needs_the_binders_of_what_it_reads_and_the_setup_of_those_not_other_training() -> None:
    earlier = [
        ("import torch", False),
        ("ds = torch.arange(8)", False),
        ("ds.add_(1)", False),  # changes ds, keeps no name: setup of what is read
        ("for i in range(2): ds[i] = 0", False),  # the same, with a loop's variable
        ("unrelated = torch.zeros(3)", False),
        ("model = torch.nn.Linear(1, 1)\nloss = model(ds)", True),  # another run's training
        ("print(loss)", False),  # reads what that training bound, but nothing needs it
    ]
    assert needed(["m = torch.nn.Linear(1, 1)\nout = m(ds)"], earlier) == [0, 1, 2, 3]
    assert needed(["m = model"], earlier) == [0, 1, 2, 3, 5]  # reads that run's model: its training too
    assert needed(["x = 1"], earlier) == []
