"""The kernel side, one way down: the trial session (``session``) drives the cell watcher
(``watcher``) and the engine group (``engines``), which calls the ranks (``calls``) and watches
their health (``health``). ``dtwork.cluster.Cluster`` composes them. Nothing here imports torch.
"""
