"""Measuring on a rank: DDP and FSDP gradient hooks (timing, GNS norms), memory. Imports runtime.core only."""
