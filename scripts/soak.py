#!/usr/bin/env python3
"""Soak driver for a running peagle-serve: N clients stream completions for M minutes; a share
of them hang up mid-stream. Every 10 s it samples the server's RSS and KV blocks in use; at the
end it waits for the server to settle and reports requests completed and abandoned, RSS over
time, and the KV blocks and requests still held (all should be 0). Exits non-zero if anything
is still held, or if a request failed with anything but the client's own hang-up.

Run through scripts/soak.sh, which starts the server.
"""

import argparse
import http.client
import json
import random
import re
import sys
import threading
import time


def metric(host, port, name):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    match = re.search(rf"^{re.escape(name)}{{[^}}]*}} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Totals:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {"completed": 0, "hung_up": 0, "failed": 0}
        self.failures = []

    def add(self, kind, detail=None):
        with self.lock:
            self.counts[kind] += 1
            if detail and len(self.failures) < 10:
                self.failures.append(detail)


def client(host, port, deadline, hang_up_share, rng, totals):
    while time.monotonic() < deadline:
        body = {
            "prompt": rng.choice(["def f(x):", "import os\n", "class Node:", "for i in range("]),
            "max_tokens": rng.randint(8, 128),
            "temperature": rng.choice([0, 0.7, 1.0]),
            "stream": True,
            "ignore_eos": True,
        }
        hang_up_after = rng.randint(1, 20) if rng.random() < hang_up_share else None
        conn = http.client.HTTPConnection(host, port, timeout=120)
        try:
            conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                totals.add("failed", f"status {response.status}: {response.read()[:200]!r}")
                continue
            chunks = 0
            while True:
                line = response.fp.readline()
                if not line or line.strip() == b"data: [DONE]":
                    break
                chunks += line.startswith(b"data: ")
                if hang_up_after is not None and chunks >= hang_up_after:
                    break
            finished = hang_up_after is None or chunks < hang_up_after
            totals.add("completed" if finished else "hung_up")
        except OSError as e:
            totals.add("failed", repr(e))
        finally:
            conn.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True, help="the server's process id, for its RSS")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--hang-up-share", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    totals = Totals()
    deadline = time.monotonic() + args.minutes * 60
    threads = [
        threading.Thread(
            target=client,
            args=(args.host, args.port, deadline, args.hang_up_share, random.Random(args.seed + i), totals),
        )
        for i in range(args.clients)
    ]
    for t in threads:
        t.start()
    start = time.monotonic()
    print("| t (s) | RSS (MB) | KV blocks used | requests done |")
    print("|---:|---:|---:|---:|")
    while any(t.is_alive() for t in threads):
        used = metric(args.host, args.port, "peagle:kv_blocks_used")
        done = sum(totals.counts.values())
        print(f"| {time.monotonic() - start:.0f} | {rss_mb(args.pid):.0f} | {used:.0f} | {done} |", flush=True)
        for t in threads:
            t.join(timeout=10 / len(threads))
    settle = time.monotonic() + 30
    held = {}
    while time.monotonic() < settle:
        held = {
            name: metric(args.host, args.port, f"peagle:{name}")
            for name in ("kv_blocks_used", "num_requests_running", "num_requests_waiting")
        }
        if not any(held.values()):
            break
        time.sleep(0.5)
    print(f"\n{args.clients} clients, {args.minutes} min, {args.hang_up_share:.0%} hang up mid-stream")
    print(f"requests: {totals.counts}")
    print(f"held at the end: {held}; RSS {rss_mb(args.pid):.0f} MB")
    for failure in totals.failures:
        print(f"failure: {failure}")
    return 1 if any(held.values()) or totals.counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
