"""host_ops.py over made-up CUDA emulator traces: a step runs from one launch of the graph of
the most nodes to the next (from one synchronization to the next in a trace without graphs),
its operations are counted by kind, its copies back and synchronizations that find work issued
since the last are its waits, and its other driver calls are counted apart; a step over a
limit fails. Run by scripts/test.sh; needs no GPU."""

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import host_ops  # noqa: E402

PREFIX = "peagle CUDA emulator: "
STEP = [
    "issued copy of 392 bytes, host to device",
    "issued graph of 10 nodes",
    "called cuMemAllocAsync",
    "issued linear_bf16<<<(1, 16, 1), (256, 1, 1)>>>",
    "issued stream synchronization",
    "called cuMemFreeAsync",
    "issued copy of 32 bytes, device to host",
    "issued copy of 32 bytes, host to device",
    "issued graph of 4 nodes",
    "issued copy of 28 bytes, device to host",
]


def main():
    # Capture-time lines and the prompt's first step come before the steps that repeat.
    lines = [PREFIX + "captured gather_rows_bf16<<<(8, 1, 1), (256, 1, 1)>>>", "prompt output"]
    lines += [PREFIX + line for line in STEP * 3]
    steps = host_ops.step_counts(lines)
    assert len(steps) == 2, steps
    # The copy back right after the synchronization finds the GPU idle: two waits a step.
    want = {"graph launches": 2, "uploads": 2, "copies back": 2, "synchronizations": 1, "kernels": 1, "waits": 2,
            "driver calls": 2}
    for step in steps:
        assert dict(step) == want, step
    assert host_ops.step_counts([PREFIX + "issued stream synchronization"]) == []
    # Without graphs, from one synchronization to the next; a driver call between the
    # synchronization and the copy back issues no work, so the copy finds the GPU idle.
    eager = [PREFIX + line for line in ["issued stream synchronization", "called cuMemFreeAsync",
                                        "issued copy of 32 bytes, device to host", "called cuEventCreate"] * 3]
    assert [dict(step) for step in host_ops.step_counts(eager)] == [
        {"synchronizations": 1, "copies back": 1, "driver calls": 2, "waits": 0}] * 2

    with tempfile.TemporaryDirectory() as out:
        path = os.path.join(out, "trace.txt")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        table = subprocess.run([sys.executable, os.path.join(HERE, "host_ops.py"), path],
                               check=True, capture_output=True, text=True).stdout
        row = table.splitlines()[2]
        assert row == f"| {path} | 2 | 2 | 2 | 2 | 0 | 1 | 1 | 0 | 6 | 2 | 2 |", table

        # Limits: met at 6 operations and 2 waits, exceeded by one fewer of either, and a
        # limit whose trace is missing fails too.
        assert host_ops.over_limits([path], ["trace=6/2"]) == []
        assert host_ops.over_limits([path], ["trace=5/2"]) == [
            "trace: 6 operations and 2 waits a step, more than 5 and 2"]
        assert len(host_ops.over_limits([path], ["trace=6/1"])) == 1
        assert host_ops.over_limits([path], ["other=9/9"]) == ["other: no trace with steps"]
        assert host_ops.over_limits([path], ["trace=6/2/2"]) == []
        assert host_ops.over_limits([path], ["trace=6/2/1"]) == ["trace: 2 driver calls a step, more than 1"]
        run = subprocess.run([sys.executable, os.path.join(HERE, "host_ops.py"), "--at-most", "trace=5/2", path],
                             capture_output=True, text=True)
        assert run.returncode == 1 and "more than 5 and 2" in run.stderr, run
    print("host_ops_test: ok")


if __name__ == "__main__":
    main()
