"""What each CUDA kernel costs in registers and spills, from ptxas's verbose output.

Reads ptxas -v's output over kernels/*.cu's PTX (scripts/kernel_resources.sh) on stdin,
and prints a table: for each kernel, its registers and the bytes it spills (stores and loads
together) on each architecture. A spill is a round trip to local memory where a register would
do: on the GPU it costs loads on the kernel's path, and without a GPU at hand this count is the
one sign of it.

    kernel_resources.py [--at-most KERNEL=BYTES ...] [--check] < PTXAS_OUTPUT

With --check it fails (exit 1) where a kernel spills more bytes on some architecture than its
limit, 0 unless --at-most gives one, or where the output names no kernel at all (the
compilation failed). The limits guard what earlier work kept out of the registers' way.
"""

import re
import sys

ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\w+)'")
PROPERTIES = re.compile(r"Function properties for (\w+)")
ARCH = re.compile(r"sm_(\d+)")
SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
REGISTERS = re.compile(r"Used (\d+) registers")


def parse(text):
    """{kernel: {arch: {"registers": n, "spills": bytes}}} from ptxas's verbose output. A
    device function that was not inlined has properties of its own, which are not its
    caller's: its spills are listed under its own name, held to a limit as a kernel's are, and
    its registers (which ptxas counts only for entries) are None."""
    kernels, current, name, arch, properties_of = {}, None, None, None, None
    for line in text.splitlines():
        if m := ENTRY.search(line):
            name, arch = m.group(1), m.group(2)
            current = kernels.setdefault(name, {}).setdefault(arch, {"registers": 0, "spills": 0})
        elif m := PROPERTIES.search(line):
            properties_of = m.group(1)
        elif current is not None and (m := SPILLS.search(line)):
            spills = int(m.group(1)) + int(m.group(2))
            if properties_of == name:
                current["spills"] = spills
            else:
                kernels.setdefault(properties_of, {})[arch] = {"registers": None, "spills": spills}
        elif current is not None and (m := REGISTERS.search(line)):
            current["registers"] = int(m.group(1))
    return kernels


def over_limits(kernels, limits):
    """Each kernel that spills past its limit (`limits`: {kernel: bytes}, 0 where absent) on
    some architecture, as a line to print; one line too where no kernel was compiled."""
    if not kernels:
        return ["no kernel in the output: did the compilation fail?"]
    over = []
    for name, archs in sorted(kernels.items()):
        most = limits.get(name, 0)
        for arch, cost in sorted(archs.items()):
            if cost["spills"] > most:
                over.append(f"{name} on {arch}: {cost['spills']} bytes spilled, more than {most}")
    return over


def table(kernels):
    """The Markdown table: a row a kernel, registers (and spilled bytes where any) by arch."""
    archs = sorted({arch for by_arch in kernels.values() for arch in by_arch}, key=lambda a: (int(ARCH.match(a).group(1)), a))
    lines = ["| kernel | " + " | ".join(archs) + " |", "| --- " + "| ---: " * len(archs) + "|"]
    for name, by_arch in sorted(kernels.items()):
        cells = []
        for arch in archs:
            cost = by_arch.get(arch)
            if cost is None:
                cells.append("")
            else:
                registers = "-" if cost["registers"] is None else cost["registers"]
                spills = f" ({cost['spills']} B spilled)" if cost["spills"] else ""
                cells.append(f"{registers}{spills}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(args, text):
    limits, check = {}, False
    while args:
        if args[0] == "--check":
            check, args = True, args[1:]
        elif args[0] == "--at-most" and len(args) > 1 and re.fullmatch(r"\w+=\d+", args[1]):
            name, _, most = args[1].rpartition("=")
            limits[name] = int(most)
            args = args[2:]
        else:
            print(f"bad argument {args[0]!r}: expected --at-most KERNEL=BYTES or --check", file=sys.stderr)
            return 2
    kernels = parse(text)
    print(table(kernels))
    over = over_limits(kernels, limits) if check else []
    for line in over:
        print(f"kernel spills over their limit: {line}", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], sys.stdin.read()))
