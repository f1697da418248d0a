"""Notebook widgets: the cluster view and the live training dashboard."""
