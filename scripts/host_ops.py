"""The operations a decode step issues outside its CUDA graphs, from CUDA emulator traces.

Each trace is the stderr of one peagle-generate run with PEAGLE_EMULATOR_TRACE=1
(scripts/emulated_host_ops.sh). A step is known by the target's graph, the graph of the most
nodes: the operations from one launch of it to the next are one step's. Prints, for each trace,
a middle step's operations by kind and the count besides graph launches.
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
    """Each whole step's operations by kind, in order; empty where the trace has no graph."""
    issued = [line for line in lines if "peagle CUDA emulator: issued" in line]
    nodes = [int(m.group(1)) for line in issued if (m := GRAPH.search(line))]
    if not nodes:
        return []
    target = f"issued graph of {max(nodes)} nodes"
    starts = [i for i, line in enumerate(issued) if target in line]
    steps = []
    for first, end in zip(starts, starts[1:]):
        counts = collections.Counter()
        counts.update(kind_of(line) for line in issued[first:end])
        steps.append(counts)
    return steps


def kind_of(line):
    """The kind of operation an issued line is."""
    if GRAPH.search(line):
        return "graph launches"
    return next((name for marker, name in KINDS if marker in line), "other")


def main(paths):
    names = ["graph launches"] + [name for _, name in KINDS] + ["other"]
    print("| trace | steps | " + " | ".join(names) + " | besides graph launches |")
    print("| --- " * (len(names) + 3) + "|")
    for path in paths:
        with open(path) as f:
            steps = step_counts(f.read().splitlines())
        if not steps:
            print(f"| {path} | 0 |" + " |" * (len(names) + 1))
            continue
        middle = steps[len(steps) // 2]
        besides = sum(n for kind, n in middle.items() if kind != "graph launches")
        cells = " | ".join(str(middle[name]) for name in names)
        print(f"| {path} | {len(steps)} | {cells} | {besides} |")


if __name__ == "__main__":
    main(sys.argv[1:])
