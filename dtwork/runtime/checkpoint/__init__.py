"""Checkpoints of a trial: folders, durable files, DCP shards. Imports runtime.core, measure, parallel."""
