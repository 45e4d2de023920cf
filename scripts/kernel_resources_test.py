"""kernel_resources.py over made-up ptxas output: each kernel's registers and spilled bytes per
architecture are read (a device function's own properties are not its caller's but its own,
held to a limit too; architectures sort by number), a kernel that spills past its limit fails
the check, and output that names no kernel fails it too. Run by scripts/test.sh; needs no
toolkit."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kernel_resources  # noqa: E402

PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'fast' for 'sm_90'
ptxas info    : Function properties for fast
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers
ptxas info    : Compiling entry function 'spilling' for 'sm_90'
ptxas info    : Function properties for spilling
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 80 registers, used 0 barriers, 8 bytes cumulative stack size
ptxas info    : Function properties for helper_not_inlined
    24 bytes stack frame, 20 bytes spill stores, 20 bytes spill loads
ptxas info    : Compiling entry function 'spilling' for 'sm_100a'
ptxas info    : Function properties for spilling
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 96 registers, used 0 barriers
"""


def run(*args, text=PTXAS):
    script = os.path.join(HERE, "kernel_resources.py")
    return subprocess.run([sys.executable, script, *args], input=text, capture_output=True, text=True)


def main():
    kernels = kernel_resources.parse(PTXAS)
    assert kernels == {
        "fast": {"sm_90": {"registers": 40, "spills": 0}},
        "spilling": {"sm_90": {"registers": 80, "spills": 16}, "sm_100a": {"registers": 96, "spills": 0}},
        "helper_not_inlined": {"sm_90": {"registers": None, "spills": 40}},
    }, kernels
    table = kernel_resources.table(kernels)
    assert table.startswith("| kernel | sm_90 | sm_100a |"), table
    assert "| spilling | 80 (16 B spilled) | 96 |" in table, table
    assert "| fast | 40 |  |" in table, table
    assert "| helper_not_inlined | - (40 B spilled) |  |" in table, table

    # Without --check, the table only; with it, a spill past its limit (0 unless given) fails.
    assert run().returncode == 0
    over = run("--check")
    assert over.returncode == 1 and "spilling on sm_90: 16 bytes spilled, more than 0" in over.stderr, over
    assert run("--check", "--at-most", "spilling=16").returncode == 1
    assert run("--check", "--at-most", "spilling=16", "--at-most", "helper_not_inlined=40").returncode == 0
    over = run("--check", "--at-most", "spilling=15")
    assert over.returncode == 1 and "more than 15" in over.stderr, over
    empty = run("--check", text="nvcc fatal : something\n")
    assert empty.returncode == 1 and "no kernel in the output" in empty.stderr, empty
    assert run("--limit").returncode == 2
    assert run("--check", "--at-most", "spilling=lots").returncode == 2
    print("kernel_resources_test: ok")


if __name__ == "__main__":
    main()
