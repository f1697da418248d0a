"""One prepared call on a lent GPU machine: prepare.sh (wheels), run.sh (install, then drive.py)."""
