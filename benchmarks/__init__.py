"""dtwork benchmarks: one entry point, ``python -m benchmarks [--smoke] [--out DIR]``.

Everything is measured side by side in one run on the same machine and reported as ratios
(medians of interleaved repetitions), because absolute times on a shared 2-core machine are
noise. Modules:

- ``workload``  the training code (an MLP and a small convnet, synthetic data in memory): one
                source text that every launcher runs unchanged
- ``runners``   how each launcher runs it: dtwork cells, raw ipyparallel with hand-written DDP
                setup, torchrun, HuggingFace Accelerate's notebook_launcher, Lightning Fabric
- ``coldstart`` a fresh "kernel" process per sample: cold start and resident memory
- ``features``  dtwork's own features on and off, in the same ``ctx.steps`` loop
- ``suite``     the order of the measurements (interleaved) and results.json
- ``report``    results.json -> summary, plots and docs/benchmarks.md
"""

__all__ = ["__doc__"]
