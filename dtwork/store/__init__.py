"""The run store: SQLite file, schema and upgrades, the ordered writer, perf thinning, mounts. Imports shared/, runtime.core.timing, errors."""
