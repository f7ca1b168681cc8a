#!/usr/bin/env python3
"""Requests/s and tokens/s of a running `tandem serve` with 1, 4 and 16 concurrent clients.

Each client sends completions one after another until the level's requests are done; every
answer is checked (status 200, a text, usage). Standard library only.

    python3 bench/serve_bench.py --url http://127.0.0.1:8080 --clients 1,4,16 --requests 32
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request

PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over",
    "In a hole in the ground there lived",
    "It was the best of times, it was",
]


def complete(url, prompt, max_tokens, timeout):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.loads(response.read())
    if not isinstance(answer["choices"][0]["text"], str):
        raise ValueError("answer without text: %r" % answer)
    return answer["usage"]["completion_tokens"]


def run_level(url, clients, requests, max_tokens, timeout):
    lock = threading.Lock()
    next_request = [0]
    tokens = [0]
    latencies = []
    errors = []

    def client():
        while True:
            with lock:
                i = next_request[0]
                if i >= requests:
                    return
                next_request[0] += 1
            t0 = time.perf_counter()
            try:
                n = complete(url, PROMPTS[i % len(PROMPTS)], max_tokens, timeout)
            except Exception as e:  # counted and reported, the level goes on
                with lock:
                    errors.append(repr(e))
                continue
            with lock:
                tokens[0] += n
                latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": len(errors),
        "seconds": wall,
        "requests_per_s": len(latencies) / wall,
        "tokens_per_s": tokens[0] / wall,
        "tokens": tokens[0],
        "median_latency_s": statistics.median(latencies) if latencies else float("nan"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--clients", default="1,4,16", help="comma list of concurrency levels")
    parser.add_argument("--requests", type=int, default=32, help="requests per level")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true", help="one JSON object per level")
    args = parser.parse_args()

    complete(args.url, "warm up", 1, args.timeout)  # first use uploads weights, builds graphs
    if not args.json:
        print("| clients | requests | errors | seconds | requests/s | tokens/s | median latency (s) |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
    for clients in [int(c) for c in args.clients.split(",")]:
        r = run_level(args.url, clients, args.requests, args.max_tokens, args.timeout)
        if args.json:
            print(json.dumps(r))
        else:
            print("| %d | %d | %d | %.2f | %.2f | %.1f | %.2f |" % (
                r["clients"], r["requests"], r["errors"], r["seconds"], r["requests_per_s"],
                r["tokens_per_s"], r["median_latency_s"]))


if __name__ == "__main__":
    main()
