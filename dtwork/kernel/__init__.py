"""The kernel side, one way down: the trial session (``session``) keeps its store (``store_handle``),
its run book (``segments``), background cells (``background``) and the replay after dead ranks
(``replay``); it drives the cell watcher (``watcher``: ``output``, ``progress``, ``tracebacks``) and
the engine group (``engines``, started from a ``spec``), which holds ipyparallel's processes
(``processes``), calls the ranks (``calls``, their replies typed in ``replies``) and watches their
health (``health``). ``dtwork.cluster.Cluster`` composes them. Nothing here imports torch.
"""
