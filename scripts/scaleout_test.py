#!/usr/bin/env python3
"""Drives peagle-serve replicas behind vllm-router with the official `openai` package; run by
scripts/scaleout_test.sh, which starts the replicas and the router. One invocation is one phase:

  routing   groups of requests that share a ~300-token prefix (completions and chat, streamed
            and not). First every group's opening request, then group by group the rest; the
            deltas of each replica's /metrics counters around a group say which replicas served
            it, and the prefix-cache counters what their caches gave. Run under cache_aware and
            under round_robin, it shows what cache-aware routing buys.
  failover  distinct prompts at some concurrency; once a third are done and the victim replica
            has requests running, it gets --signal: KILL (a crash) or TERM (a rolling update).
  summary   reads the phases' JSON results, prints the summary and compares the hit rates.

Each phase writes its result as JSON (--out) and exits non-zero if one of its checks fails.

    python3 scripts/scaleout_test.py routing --router URL/v1 --replica URL... --label cache_aware --out FILE
"""

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

MODEL = "pystdlib-12l"
# Run to max_tokens (vLLM's ignore_eos) so every request costs about the same; small budgets
# keep the test fast on two CPU cores.
EXTRA = {"ignore_eos": True}


def read_metrics(url):
    """Sums of the counters this test uses, over all label sets, from a replica's /metrics."""
    wanted = {
        "peagle:request_success_total": "requests",
        "peagle:prefix_cache_queries_total": "queries",
        "peagle:prefix_cache_hits_total": "hits",
        "peagle:num_requests_running": "running",
        "peagle:num_requests_waiting": "waiting",
    }
    values = dict.fromkeys(wanted.values(), 0.0)
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in wanted:
                values[wanted[name]] += float(line.rsplit(" ", 1)[1])
    return values


def snapshot(replicas):
    return {url: read_metrics(url) for url in replicas}


def delta(before, after, key):
    return {url: after[url][key] - before[url][key] for url in before}


def code_lines(rng, count):
    """Python-looking lines (the demo model learned the standard library) from a seeded RNG."""
    words = ["path", "buffer", "result", "items", "config", "stream", "offset", "header",
             "value", "parser", "record", "handle", "token", "window", "limit", "cursor"]
    lines = []
    for _ in range(count):
        a, b, c = rng.sample(words, 3)
        lines.append(rng.choice([
            f"    {a}_{rng.randrange(100)} = self.{b}.get('{c}', {rng.randrange(1000)})",
            f"    if {a} is not None and len({b}) > {rng.randrange(64)}:",
            f"        return {a}.{b}({c}, {rng.randrange(16)})",
            f"    for {a} in sorted({b}_{rng.randrange(100)}):",
            f"    # {a} {b} {c} {rng.randrange(10000)}",
        ]))
    return "\n".join(lines)


def run_request(client, spec):
    """One request through the router; returns a record of what came back (never raises)."""
    t0 = time.monotonic()
    record = {"started": t0, "id": spec["id"], "stream": spec["stream"], "kind": spec["kind"], "ok": False,
              "tokens": 0, "cached": 0, "opened": False, "error": None}
    try:
        if spec["kind"] == "chat":
            call, fields = client.chat.completions.create, {"messages": spec["messages"]}
        else:
            call, fields = client.completions.create, {"prompt": spec["prompt"]}
        if spec["stream"]:
            fields["stream_options"] = {"include_usage": True}
        response = call(model=MODEL, max_tokens=spec["max_tokens"], temperature=0,
                        stream=spec["stream"], extra_body=EXTRA, **fields)
        finish = None
        if spec["stream"]:
            # The router has answered 200 and is proxying the replica's stream from here on.
            record["opened"] = True
            for chunk in response:
                if chunk.usage and chunk.usage.prompt_tokens_details:
                    record["cached"] = chunk.usage.prompt_tokens_details.cached_tokens or 0
                for choice in chunk.choices:
                    piece = choice.delta.content if spec["kind"] == "chat" else choice.text
                    if piece:
                        record["tokens"] += 1  # a chunk, about a token
                    finish = choice.finish_reason or finish
        else:
            finish = response.choices[0].finish_reason
            record["tokens"] = response.usage.completion_tokens
            details = response.usage.prompt_tokens_details
            record["cached"] = (details.cached_tokens or 0) if details else 0
        # A stream that ends without a finish_reason was cut short: that is a failure too.
        record["ok"] = finish in ("length", "stop")
        if not record["ok"]:
            record["error"] = f"finish_reason={finish!r}"
    except Exception as error:  # noqa: BLE001 - every failure is reported, none is fatal here
        record["error"] = f"{type(error).__name__}: {error}"[:300]
    record["seconds"] = round(time.monotonic() - t0, 3)
    return record


def group_specs(rng, label, group, size, max_tokens):
    """One group: `size` requests sharing a ~300-token prefix, with distinct short tails.
    The phase label and group number open the prefix, so no two groups (and no two phases,
    whose prompts would otherwise find the earlier phase's cache) share more than a few tokens."""
    kind = "chat" if group % 2 else "completion"
    prefix = f"# {label} group {group} {rng.randrange(10**9)}\nclass Loader{group}:\n" + code_lines(rng, 24)
    specs = []
    for i in range(size):
        tail = f"\n    def step_{i}_{rng.randrange(10**6)}(self, {rng.choice(['a', 'b', 'c'])}):\n"
        spec = {"id": f"g{group}r{i}", "kind": kind, "stream": i % 2 == 1, "max_tokens": max_tokens}
        if kind == "chat":
            spec["messages"] = [{"role": "system", "content": prefix},
                                {"role": "user", "content": f"Continue:{tail}"}]
        else:
            spec["prompt"] = prefix + tail
        specs.append(spec)
    return specs


def phase_routing(args, client):
    rng = random.Random(f"{args.seed}-{args.label}")
    groups = [group_specs(rng, args.label, g, args.group_size, args.max_tokens) for g in range(args.groups)]
    start = snapshot(args.replica)
    with ThreadPoolExecutor(args.concurrency) as pool:
        # Stage 1: every group's first request, several at a time. Each puts its group's
        # prefix in one replica's cache; running them together lets a router that picks the
        # least loaded replica for an unseen prefix (cache_aware does) spread them.
        records = list(pool.map(lambda specs: run_request(client, specs[0]), groups))
        # Stage 2: group by group, the other requests together. The counter deltas around a
        # group name the replicas that served it and what their prefix caches gave it.
        placement = []
        for g, specs in enumerate(groups):
            before = snapshot(args.replica)
            got = list(pool.map(lambda s: run_request(client, s), specs[1:]))
            after = snapshot(args.replica)
            served = {url: int(n) for url, n in delta(before, after, "requests").items() if n}
            placement.append({"group": g, "kind": specs[0]["kind"], "served_by": served,
                              "cached": sum(r["cached"] >= args.prefix_hit_tokens for r in got)})
            records += got
    end = snapshot(args.replica)
    result = {
        "phase": "routing", "label": args.label, "records": records, "groups": placement,
        "per_replica": {url: int(n) for url, n in delta(start, end, "requests").items()},
        "queries": sum(delta(start, end, "queries").values()),
        "hits": sum(delta(start, end, "hits").values()),
        "followups": sum(len(specs) - 1 for specs in groups),
        "followups_cached": sum(p["cached"] for p in placement),
    }
    result["hit_rate"] = result["hits"] / result["queries"] if result["queries"] else 0.0
    result["single_replica_groups"] = sum(len(p["served_by"]) == 1 for p in placement)
    print(f"routing {args.label}: per replica {result['per_replica']}, hit rate {result['hit_rate']:.1%}, "
          f"groups on one replica {result['single_replica_groups']}/{len(placement)}, "
          f"follow-ups that found their prefix cached {result['followups_cached']}/{result['followups']}")

    failed = [r for r in records if not r["ok"]]
    checks = [
        (f"all {len(records)} requests succeeded", not failed),
        ("every replica served some", all(n > 0 for n in result["per_replica"].values())),
        (f"the replicas counted {len(records)} requests", sum(result["per_replica"].values()) == len(records)),
    ]
    if args.label == "cache_aware":
        checks.append(("each group's follow-ups went to one replica",
                       result["single_replica_groups"] == len(placement)))
        checks.append(("every follow-up found its group's prefix cached",
                       result["followups_cached"] == result["followups"]))
    return result, checks, failed


def router_counters(url):
    """The router's own retry and circuit-breaker counters, from its Prometheus port."""
    counts = {}
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in ("vllm_router_retries_total", "vllm_router_retries_exhausted_total",
                        "vllm_router_cb_state_transitions_total"):
                counts[name] = counts.get(name, 0) + float(line.rsplit(" ", 1)[1])
    return counts


def phase_failover(args, client):
    rng = random.Random(f"{args.seed}-failover")
    victim = args.kill_url
    specs = []
    for i in range(args.requests):
        kind = "chat" if i % 4 >= 2 else "completion"
        text = f"# failover {i} {rng.randrange(10**9)}\n" + code_lines(rng, 4) + "\n"
        spec = {"id": f"f{i}", "kind": kind, "stream": i % 2 == 1, "max_tokens": args.max_tokens}
        if kind == "chat":
            spec["messages"] = [{"role": "user", "content": text}]
        else:
            spec["prompt"] = text
        specs.append(spec)

    kill = {"at": None, "running_on_victim": None, "on_victim": 0}
    done = []

    def send(spec):
        record = run_request(client, spec)
        done.append(record)
        return record

    def killer():
        # Kill mid-run (a third of the requests done) and only once the victim is working on
        # requests, so that some are in flight on it when it dies.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(done) < len(specs) // 3:
                time.sleep(0.02)
                continue
            try:
                metrics = read_metrics(victim)
            except OSError:
                metrics = {"running": 0, "waiting": 0}
            if metrics["running"] >= args.kill_when_running:
                kill["running_on_victim"] = int(metrics["running"])
                kill["on_victim"] = int(metrics["running"] + metrics["waiting"])
                break
            time.sleep(0.02)
        os.kill(args.kill_pid, getattr(signal, "SIG" + args.signal))
        kill["at"] = time.monotonic()

    t0 = time.monotonic()
    thread = threading.Thread(target=killer)
    thread.start()
    with ThreadPoolExecutor(args.concurrency) as pool:
        records = list(pool.map(send, specs))
    thread.join()
    killed_at = kill["at"] or float("inf")

    # The router retries a request whose replica refused it or failed before answering, the
    # in-flight non-streamed ones included. A stream is proxied as it goes once its replica
    # has answered: when that replica dies the router can only abort the client's connection,
    # so those streams fail loudly (an exception, never a clean but truncated end). An
    # application retries them, which this test does once, and they must then succeed.
    cut = [r for r in records if not r["ok"] and r["stream"] and r["opened"]
           and r["started"] < killed_at and not r["error"].startswith("finish_reason")]
    if args.signal == "TERM":
        # SIGTERM is a rolling update's stop: peagle finishes what it runs (up to
        # --shutdown-timeout) and answers new requests 503, which the router retries
        # elsewhere. Nothing may fail, streams included.
        cut = []
    other = [r for r in records if not r["ok"] and r not in cut]
    by_id = {s["id"]: s for s in specs}
    retried = [run_request(client, by_id[r["id"]]) for r in cut]
    counters = router_counters(args.router_metrics) if args.router_metrics else {}
    result = {
        "phase": "failover", "label": args.label, "signal": args.signal, "records": records,
        "killed_after_s": round(kill["at"] - t0, 2) if kill["at"] else None,
        "running_on_victim_at_kill": kill["running_on_victim"],
        "after_kill": sum(r["started"] >= killed_at for r in records),
        "cut_streams": len(cut), "cut_retried_ok": sum(r["ok"] for r in retried),
        "router_retries": int(counters.get("vllm_router_retries_total", 0)),
    }
    checks = [
        (f"the victim had {kill['running_on_victim']} requests running when signalled", bool(kill["running_on_victim"])),
    ]
    if args.signal == "TERM":
        checks.append((f"all {len(records)} requests succeeded across the drain", not other))
    else:
        checks += [
            (f"no request failed but streams cut mid-way on the victim ({len(other)} others failed)", not other),
            (f"at most as many cut streams ({len(cut)}) as requests on the victim ({kill['on_victim']})",
             len(cut) <= kill["on_victim"]),
            (f"the {len(cut)} cut streams succeeded when the client sent them again", all(r["ok"] for r in retried)),
        ]
    print(f"failover {args.label}: SIG{args.signal} {result['killed_after_s']} s in with {kill['running_on_victim']} "
          f"running on the victim; {sum(r['ok'] for r in records)}/{len(records)} ok at once "
          f"({result['after_kill']} sent after the signal), {len(cut)} streams cut mid-way, "
          f"{result['cut_retried_ok']} of them ok when sent again; router counters {counters}")
    return result, checks, other + [r for r in retried if not r["ok"]]


def phase_summary(args):
    phases = []
    for path in args.results:
        with open(path) as f:
            phases.append(json.load(f))
    routing = {p["label"]: p for p in phases if p["phase"] == "routing"}
    print("=== scale-out summary ===")
    for label, p in routing.items():
        streamed = sum(r["stream"] for r in p["records"])
        print(f"{label}: {len(p['records'])} requests ({streamed} streamed), "
              f"{sum(r['ok'] for r in p['records'])} ok")
        dist = ", ".join(f"{url.rsplit(':', 1)[1]}={n}" for url, n in p["per_replica"].items())
        print(f"  per replica (port=requests): {dist}")
        print(f"  groups whose follow-ups all went to one replica: {p['single_replica_groups']}/{len(p['groups'])}; "
              f"follow-ups that found their prefix cached: {p['followups_cached']}/{p['followups']}")
        print(f"  prefix cache: {int(p['hits'])}/{int(p['queries'])} prompt tokens hit = {p['hit_rate']:.1%}")
    for p in phases:
        if p["phase"] == "failover":
            ok = sum(r["ok"] for r in p["records"])
            print(f"failover ({p['label']}): one replica got SIG{p['signal']} {p['killed_after_s']} s into "
                  f"{len(p['records'])} requests, with {p['running_on_victim_at_kill']} running on it")
            line = (f"  {ok}/{len(p['records'])} ok at once ({p['after_kill']} sent after the signal; "
                    f"the router retried {p['router_retries']} times)")
            if p["signal"] == "KILL":
                line += (f"; streams already flowing from the killed replica, cut with a connection error: "
                         f"{p['cut_streams']}, ok when the client sent them again: {p['cut_retried_ok']}")
            print(line)
    checks = []
    if "cache_aware" in routing and "round_robin" in routing:
        ca, rr = routing["cache_aware"]["hit_rate"], routing["round_robin"]["hit_rate"]
        print(f"hit rate cache_aware {ca:.1%} vs round_robin {rr:.1%}")
        checks.append((f"cache_aware's hit rate beats round_robin's by {args.min_gain * 100:.0f} points or more",
                       ca >= rr + args.min_gain))
    return None, checks, []


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["routing", "failover", "summary"])
    parser.add_argument("--router", help="the router's /v1 URL")
    parser.add_argument("--replica", action="append", default=[], help="a replica's base URL (repeat)")
    parser.add_argument("--label", default="", help="the router policy, for the report")
    parser.add_argument("--out", help="write the phase's result here as JSON")
    parser.add_argument("--seed", default="peagle")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--groups", type=int, default=12)
    parser.add_argument("--group-size", type=int, default=5)
    parser.add_argument("--prefix-hit-tokens", type=int, default=256,
                        help="a follow-up with this many cached prompt tokens found its group's prefix")
    parser.add_argument("--requests", type=int, default=36, help="failover: how many requests")
    parser.add_argument("--kill-pid", type=int, help="failover: the victim replica's process id")
    parser.add_argument("--kill-url", help="failover: the victim replica's base URL")
    parser.add_argument("--kill-when-running", type=int, default=2)
    parser.add_argument("--signal", choices=["KILL", "TERM"], default="KILL",
                        help="failover: KILL (a crash) or TERM (a rolling update's graceful stop)")
    parser.add_argument("--router-metrics", help="failover: the router's Prometheus URL, for its retry counts")
    parser.add_argument("--min-gain", type=float, default=0.15)
    parser.add_argument("results", nargs="*", help="summary: the phases' JSON files")
    args = parser.parse_args()

    if args.phase == "summary":
        result, checks, failed = phase_summary(args)
    else:
        # max_retries=0: a failure the router lets through must reach this test, not be
        # papered over by the client's own retries.
        client = OpenAI(base_url=args.router, api_key="EMPTY", max_retries=0, timeout=60)
        phase = phase_routing if args.phase == "routing" else phase_failover
        result, checks, failed = phase(args, client)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    for record in failed:
        print(f"  failed request {record['id']} (stream={record['stream']}, {record['tokens']} tokens "
              f"before failing): {record['error']}")
    bad = 0
    for name, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {' '.join(filter(None, [args.phase, args.label]))}: {name}")
        bad += not ok
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
