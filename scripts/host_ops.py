"""The operations a decode step issues outside its CUDA graphs, from CUDA emulator traces.

Each trace is the stderr of one peagle-generate run with PEAGLE_EMULATOR_TRACE=1
(scripts/emulated_host_ops.sh). A step is known by the target's graph, the graph of the most
nodes: the operations from one launch of it to the next are one step's. Prints, for each trace,
a middle step's operations by kind, the count besides graph launches, and its waits: the copies
back and synchronizations that find work issued since the last, so that the host waits for the
GPU to finish it.
"""

import collections
import re
import sys

GRAPH = re.compile(r"issued graph of (\d+) nodes")
KINDS = [
    ("host to device", "uploads"),
    ("device to host", "copies back"),
    ("device to device", "device copies"),
    ("synchronization", "synchronizations"),
    ("<<<", "kernels"),
]


def step_counts(lines):
    """Each whole step's operations by kind, and its waits, in order; empty where the trace has
    no graph."""
    issued = [line for line in lines if "peagle CUDA emulator: issued" in line]
    nodes = [int(m.group(1)) for line in issued if (m := GRAPH.search(line))]
    if not nodes:
        return []
    kinds = [kind_of(line) for line in issued]
    waits = waits_of(kinds)
    target = f"issued graph of {max(nodes)} nodes"
    starts = [i for i, line in enumerate(issued) if target in line]
    steps = []
    for first, end in zip(starts, starts[1:]):
        counts = collections.Counter(kinds[first:end])
        counts["waits"] = sum(waits[first:end])
        steps.append(counts)
    return steps


def waits_of(kinds):
    """Whether each operation makes the host wait for the GPU: a copy back or a synchronization
    with work issued since the last one. One right after another finds the GPU idle."""
    waits, pending = [], False
    for kind in kinds:
        blocks = kind in ("copies back", "synchronizations")
        waits.append(blocks and pending)
        pending = not blocks
    return waits


def kind_of(line):
    """The kind of operation an issued line is."""
    if GRAPH.search(line):
        return "graph launches"
    return next((name for marker, name in KINDS if marker in line), "other")


def main(paths):
    names = ["graph launches"] + [name for _, name in KINDS] + ["other"]
    print("| trace | steps | " + " | ".join(names) + " | besides graph launches | waits for the GPU |")
    print("| --- " * (len(names) + 4) + "|")
    for path in paths:
        with open(path) as f:
            steps = step_counts(f.read().splitlines())
        if not steps:
            print(f"| {path} | 0 |" + " |" * (len(names) + 2))
            continue
        middle = steps[len(steps) // 2]
        besides = sum(n for kind, n in middle.items() if kind not in ("graph launches", "waits"))
        cells = " | ".join(str(middle[name]) for name in names)
        print(f"| {path} | {len(steps)} | {cells} | {besides} | {middle['waits']} |")


if __name__ == "__main__":
    main(sys.argv[1:])
