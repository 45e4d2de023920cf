#!/usr/bin/env python3
"""Measures how one abusive client affects everyone else on a peagle-serve binary.

Four probes, each against a fresh server on the demo model (loopback, free port):

  half-open   /health latency while 450 connections sit on partial headers, under
              `ulimit -n 256` as on a small host
  fan-out     one request of 1,500 prompts x n=16, and the latency of 20 ordinary
              requests sent beside it
  big-prompt  peak and final RSS of the server after 8 concurrent 4 MB text prompts
  stops       /health latency while 2 requests carry 150,000 stop strings each, and while
              8 carry 256 stop strings of 60 bytes (within the server's caps)

Usage: scripts/hardening_probe.py --serve target/release/peagle-serve [--only NAME]
Prints one Markdown table row per probe. Developer tool: no network beyond loopback.
"""

import argparse
import concurrent.futures as cf
import json
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary, nofile=None, extra=()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

        def limit():
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--max-body-bytes", str(64 << 20), *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=limit,
        )
        for _ in range(600):
            if self.health(timeout=1)[0] == 200:
                return
            time.sleep(0.1)
        raise RuntimeError("server did not become healthy")

    def health(self, timeout=30):
        start = time.monotonic()
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=timeout) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        except Exception as e:  # noqa: BLE001 - any failure is a data point here
            status = type(e).__name__
        return status, time.monotonic() - start

    def post(self, path, body, timeout=300):
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        start = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            e.read()
            status = e.code
        except Exception as e:  # noqa: BLE001
            status = type(e).__name__
        return status, time.monotonic() - start

    def rss_kb(self, field):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def half_open(binary):
    server = Server(binary, nofile=256)
    socks = []
    for _ in range(450):
        try:
            s = socket.create_connection(("127.0.0.1", server.port), timeout=2)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        except OSError:
            break
    time.sleep(1)
    samples = [server.health(timeout=30) for _ in range(5)]
    for s in socks:
        s.close()
    server.stop()
    ok = sum(1 for status, _ in samples if status == 200)
    worst = max(t for _, t in samples)
    return f"{len(socks)} half-open; /health {ok}/5 answered, slowest {worst * 1000:.0f} ms"


def fan_out(binary):
    server = Server(binary)
    prompts = [f"def f{i}(x):" for i in range(1500)]
    big = {"prompt": prompts, "n": 16, "max_tokens": 4, "temperature": 1.0}
    small = {"prompt": "import os", "max_tokens": 4, "temperature": 0}
    with cf.ThreadPoolExecutor(max_workers=24) as pool:
        fan = pool.submit(server.post, "/v1/completions", big)
        time.sleep(0.5)
        others = [pool.submit(server.post, "/v1/completions", small) for _ in range(20)]
        results = [f.result() for f in others]
        fan_status, fan_time = fan.result()
    server.stop()
    ok = sum(1 for status, _ in results if status == 200)
    latencies = sorted(t for _, t in results)
    return (
        f"fan-out {fan_status} in {fan_time:.1f} s; others {ok}/20 OK, "
        f"median {statistics.median(latencies) * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms"
    )


def big_prompt(binary):
    server = Server(binary)
    base = server.rss_kb("VmRSS")
    prompt = ("x = 1\n" * 700_000)[:4_000_000]
    body = {"prompt": prompt, "max_tokens": 1}
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        statuses = [f.result()[0] for f in [pool.submit(server.post, "/v1/completions", body) for _ in range(8)]]
    time.sleep(2)
    peak, after = server.rss_kb("VmHWM"), server.rss_kb("VmRSS")
    server.stop()
    return (
        f"statuses {sorted(set(map(str, statuses)))}; RSS idle {base / 1024:.0f} MB, "
        f"peak {peak / 1024:.0f} MB, after {after / 1024:.0f} MB"
    )


def stops(binary):
    huge = [f"never-{i}-" + "z" * 20 for i in range(150_000)]
    at_caps = [f"never-{i}-" + "z" * 48 for i in range(256)]
    return "; ".join(
        [f"150k stops: {stops_with(binary, huge, 2, 64)}", f"256 x 60 B stops: {stops_with(binary, at_caps, 8, 256)}"]
    )


def stops_with(binary, stop, requests, max_tokens):
    server = Server(binary)
    body = {"prompt": "def f(x):", "max_tokens": max_tokens, "stop": stop, "temperature": 0, "ignore_eos": True}
    done = threading.Event()
    samples = []

    def poll():
        while not done.is_set():
            samples.append(server.health(timeout=60)[1])
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    with cf.ThreadPoolExecutor(max_workers=requests) as pool:
        futures = [pool.submit(server.post, "/v1/completions", body) for _ in range(requests)]
        statuses = sorted({str(f.result()[0]) for f in futures})
    done.set()
    poller.join()
    server.stop()
    return f"{requests} requests {statuses}, /health max {max(samples) * 1000:.0f} ms over {len(samples)} probes"


PROBES = {"half-open": half_open, "fan-out": fan_out, "big-prompt": big_prompt, "stops": stops}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", required=True, help="the peagle-serve binary")
    parser.add_argument("--only", choices=sorted(PROBES))
    args = parser.parse_args()
    for name, probe in PROBES.items():
        if args.only and name != args.only:
            continue
        print(f"| {name} | {probe(args.serve)} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
