"""The operations and driver calls a decode step makes, from CUDA emulator traces.

Each trace is the stderr of one peagle-generate run with PEAGLE_EMULATOR_TRACE=1
(scripts/emulated_host_ops.sh). With CUDA graphs, a step is known by the target's graph, the
graph of the most nodes: the operations from one launch of it to the next are one step's.
Without graphs, by the synchronization each step makes once its forward is issued. Prints, for
each trace, a middle step's operations by kind (outside its graphs), the count besides graph
launches, its waits (the copies back and synchronizations that find work issued since the
last, so that the host waits for the GPU to finish it), and its other driver calls
(allocations, frees, events, kernel lookups: host time on a GPU, each).

    host_ops.py [--at-most NAME=OPERATIONS/WAITS[/CALLS] ...] TRACE...

With --at-most, it also fails (exit 1) where the middle step of the trace named NAME (its file
name without .txt) issues more operations besides graph launches, waits more or makes more
driver calls than given, or where no such trace has steps: the limits guard what earlier work
took off a step.
"""

import collections
import os
import re
import sys

ISSUED = "peagle CUDA emulator: issued"
CALLED = "peagle CUDA emulator: called"
GRAPH = re.compile(r"issued graph of (\d+) nodes")
KINDS = [
    ("host to device", "uploads"),
    ("device to host", "copies back"),
    ("device to device", "device copies"),
    ("synchronization", "synchronizations"),
    ("<<<", "kernels"),
]


def step_counts(lines):
    """Each whole step's operations by kind, its waits and its driver calls, in order; empty
    where the trace has fewer than two steps' starts."""
    ours = [line for line in lines if ISSUED in line or CALLED in line]
    issued = [line for line in ours if ISSUED in line]
    nodes = [int(m.group(1)) for line in issued if (m := GRAPH.search(line))]
    marker = f"issued graph of {max(nodes)} nodes" if nodes else "issued stream synchronization"
    kinds = [kind_of(line) for line in ours]
    waits = waits_of(kinds)
    starts = [i for i, line in enumerate(ours) if marker in line]
    steps = []
    for first, end in zip(starts, starts[1:]):
        counts = collections.Counter(kinds[first:end])
        counts["waits"] = sum(waits[first:end])
        steps.append(counts)
    return steps


def waits_of(kinds):
    """Whether each operation makes the host wait for the GPU: a copy back or a synchronization
    with work issued since the last one. One right after another finds the GPU idle; driver
    calls issue no work."""
    waits, pending = [], False
    for kind in kinds:
        blocks = kind in ("copies back", "synchronizations")
        waits.append(blocks and pending)
        if kind != "driver calls":
            pending = not blocks
    return waits


def kind_of(line):
    """The kind of operation an issued line is, or "driver calls"."""
    if CALLED in line:
        return "driver calls"
    if GRAPH.search(line):
        return "graph launches"
    return next((name for marker, name in KINDS if marker in line), "other")


def middle_step(path):
    """The middle step of the trace at `path`: its operations by kind, besides graph launches
    and waits, and its waits; None where it has no step."""
    with open(path) as f:
        steps = step_counts(f.read().splitlines())
    if not steps:
        return None
    middle = steps[len(steps) // 2]
    besides = sum(n for kind, n in middle.items() if kind not in ("graph launches", "waits", "driver calls"))
    return middle, besides, len(steps)


def over_limits(paths, limits):
    """Each limit ("NAME=OPERATIONS/WAITS", or "NAME=OPERATIONS/WAITS/CALLS") that its trace's
    middle step exceeds, or that no trace with steps meets, as a line to print."""
    by_name = {os.path.basename(p).removesuffix(".txt"): p for p in paths}
    over = []
    for limit in limits:
        name, _, most = limit.rpartition("=")
        operations, waits, *calls = (int(n) for n in most.split("/"))
        step = middle_step(by_name[name]) if name in by_name else None
        if step is None:
            over.append(f"{name}: no trace with steps")
            continue
        middle, besides, _ = step
        if besides > operations or middle["waits"] > waits:
            over.append(f"{name}: {besides} operations and {middle['waits']} waits a step, "
                        f"more than {operations} and {waits}")
        if calls and middle["driver calls"] > calls[0]:
            over.append(f"{name}: {middle['driver calls']} driver calls a step, more than {calls[0]}")
    return over


def main(args):
    limits = []
    while args[:1] == ["--at-most"]:
        limits.append(args[1])
        args = args[2:]
    paths = args
    names = ["graph launches"] + [name for _, name in KINDS] + ["other"]
    print("| trace | steps | " + " | ".join(names) + " | besides graph launches | waits for the GPU | driver calls |")
    print("| --- " * (len(names) + 5) + "|")
    for path in paths:
        step = middle_step(path)
        if step is None:
            print(f"| {path} | 0 |" + " |" * (len(names) + 3))
            continue
        middle, besides, count = step
        cells = " | ".join(str(middle[name]) for name in names)
        print(f"| {path} | {count} | {cells} | {besides} | {middle['waits']} | {middle['driver calls']} |")
    over = over_limits(paths, limits)
    for line in over:
        print(f"host operations over their limit: {line}", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
