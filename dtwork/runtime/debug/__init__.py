"""Seeing inside a rank from the notebook: its threads' stacks while it is blocked (``stacks``)."""
