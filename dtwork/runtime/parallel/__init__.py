"""How a model is spread over the ranks: DDP, FSDP2/TP. Imports runtime.core and runtime.measure."""
