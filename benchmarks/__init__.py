"""dtwork against torchrun, raw ipyparallel, Accelerate and Fabric: ``python -m benchmarks``.

- ``workload``  the training code every launcher runs unchanged
- ``runners``   the launchers, their cold start in fresh processes, the process Accelerate/Fabric fork from
- ``turns``     launchers training in turns, window by window
- ``windows``   a feature on and off in windows alternating inside one loop (live view, GNS, hand loop)
- ``kernel_scale`` the kernel's path fed by simulated ranks
- ``stats``     medians, intervals, cycles and blocks
- ``suite``     the measurements in order (phases, ``--only``), results.json and the targets
- ``tables``    the generated tables of docs/benchmarks.md
- ``gpu/``      one prepared call on a lent GPU machine (prepare.sh, run.sh, drive.py)
"""
