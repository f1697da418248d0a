"""The source each rank runs for the windowed benchmarks (``windows.py``), pushed by ``runners.DtworkRunner``."""

ENGINE_SOURCE = '''
import random
from dtwork.runtime.measure.ddp_hooks import measure_state


def in_windows(kind, warmup, cycles, window, seed, tops, arms, cpus):
    """Yield (x, y, arm): after ``warmup`` steps, windows on and off (arm None but at a window's first
    step); each window's start time and CPU time go to ``tops`` and ``cpus``, a last one closing it."""
    rng = random.Random(seed)  # the same order on every rank
    on_first = [rng.random() < 0.5 for _ in range(cycles)]
    end = warmup + 2 * cycles * window
    for step, (x, y) in ctx.steps(make_batches(kind, ctx.rank), max_steps=end + 1):
        arm = None
        if step >= warmup and (step - warmup) % window == 0:
            w = (step - warmup) // window
            if w == 0:
                dist.barrier()
            tops.append(time.perf_counter())
            cpus.append(time.process_time())
            if step == end:
                return
            arm = on_first[w // 2] != bool(w % 2)
            arms.append(arm)
        yield x, y, arm


def gns_windows(kind, warmup, cycles, seed):
    """GNS measured in on windows, not in off windows, of whole measuring periods (8 steps or more)."""
    every = ctx.config.gns.every
    window = every * max(2, 8 // every)
    model = ctx.wrap(make_model(kind), gns=True)
    state = measure_state(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    tops, cpus, arms = [], [], []
    for x, y, arm in in_windows(kind, -(-warmup // every) * every, cycles, window, seed, tops, arms, cpus):
        if arm is not None:
            state.gns = arm
        loss = F.cross_entropy(model(x), y)
        ctx.backward(loss)
        ctx.step(opt)
        ctx.log(loss=loss)
    return [b - a for a, b in zip(tops, tops[1:])], arms, window


def live_windows(kind, warmup, cycles, window, port, seed, aa):
    """On: ctx.log every step, the kernel drawing; off: neither (aa: both on). Rank 0 tells the kernel."""
    import socket

    model = ctx.wrap(make_model(kind), gns=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sock = socket.create_connection(("127.0.0.1", port)) if ctx.rank == 0 else None
    tops, cpus, arms = [], [], []
    log = True  # the warmup logs, so that the view builds its widgets before the windows
    try:
        for x, y, arm in in_windows(kind, warmup, cycles, window, seed, tops, arms, cpus):
            if arm is not None:
                log = arm or aa
                if sock is not None:
                    sock.sendall(b"1\\n" if log else b"0\\n")
            loss = F.cross_entropy(model(x), y)
            ctx.backward(loss)
            ctx.step(opt)
            if log:
                ctx.log(loss=loss)
    finally:
        if sock is not None:
            sock.close()
    return [b - a for a, b in zip(tops, tops[1:])], arms, window, [b - a for a, b in zip(cpus, cpus[1:])]


def hand_windows(kind, cycles, window, seed, arm):
    """Cycles of a window of ``arm`` and one of the plain hand loop on a DDP model, in a random order:
    "wrap", the same hand loop on a ctx.wrap'd model (the live view from the optimizer's step), or
    "steps", the wrapped model in one ctx.steps loop, paused between its windows."""
    rng = random.Random(seed)  # the same order on every rank
    model = ctx.wrap(make_model(kind), gns=False)
    # DDP's settings as ctx.wrap's: an explicit bucket_cap_mb drops DDP's small first bucket (one
    # all-reduce a step for the MLP, not two), 10% more steps/s here on its own
    plain = setup(kind, bucket_cap_mb=ctx.config.optimizations.tensor_fusion_threshold)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = plain[2]
    it = ctx.steps(batches, max_steps=(cycles + 2) * window) if arm == "steps" else None

    def featured():
        if it is None:
            return train(model, opt, batches, window)
        for _ in range(window):
            _, (x, y) = next(it)
            ctx.backward(F.cross_entropy(model(x), y))
            ctx.step(opt)

    times, arms = [], []
    for c in range(cycles + 2):  # two cycles of warmup
        for on in rng.sample([True, False], 2):
            t0 = time.perf_counter()
            featured() if on else train(*plain, window)
            if c >= 2:
                times.append(time.perf_counter() - t0)
                arms.append(on)
    assert it is None or next(it, None) is None
    return times, arms, window
'''
