"""dtwork against torchrun, raw ipyparallel, Accelerate and Fabric: ``python -m benchmarks``.

- ``workload``  the training code every launcher runs unchanged
- ``runners``   the launchers (``launch_worker``: the notebook process Accelerate and Fabric fork from)
- ``coldstart`` a fresh process per sample, from nothing imported to a ready process group
- ``turns``     launchers training in turns, window by window
- ``windows``   a feature on and off in windows alternating inside one loop (``live``: the live view)
- ``stats``     medians, intervals, cycles and blocks
- ``suite``     the measurements in order, results.json and the targets
- ``tables``    the generated tables of docs/benchmarks.md
"""
