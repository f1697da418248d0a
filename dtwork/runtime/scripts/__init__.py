"""Unchanged torchrun scripts on warm ranks: script runs, fresh launch, autoreload. Imports every runtime folder but the top."""
