"""The training loop: steps, sync, step/backward/log, guards, evaluation, optimizers, data, adaptive batch. Imports the runtime folders below it."""
