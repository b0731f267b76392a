#!/usr/bin/env python3
"""Same-run A/B of two anyshape builds on model modules: latency and outputs per case.

    scripts/ab-latency.py --a OLD_BIN OLD_MODULE --b NEW_BIN NEW_MODULE \
        --cases models/full/bert_base.ts.s{1,7,37,128,255,512,600}.npz [--rounds 3 --seconds 1]

For every case the two builds take turns (A, B, A, B, ...) for --rounds rounds, each
round one `anyshape run --module M --inputs CASE --seconds S` process; a round reports
its minimum latency. The table gives, per case, the minimum over rounds for each build,
their ratio (B / A: below 1 is B faster), and each build's largest relative error
against the outputs recorded in the case (the run's own check).
"""

import argparse
import re
import subprocess
import sys

LATENCY = re.compile(r"min latency ([0-9.]+) ms")
ERROR = re.compile(r"max relative error ([0-9.e+-]+|NaN|inf)")


def run(binary, module, case, seconds):
    done = subprocess.run(
        [binary, "run", "--module", module, "--inputs", case, "--seconds", str(seconds)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"{binary} on {case} failed:\n{done.stderr}")
    latency = float(LATENCY.search(done.stdout).group(1))
    errors = [float(e) for e in ERROR.findall(done.stdout)]
    return latency, max(errors) if errors else None


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", nargs=2, metavar=("BIN", "MODULE"), required=True)
    ap.add_argument("--b", nargs=2, metavar=("BIN", "MODULE"), required=True)
    ap.add_argument("--cases", nargs="+", required=True, help=".npz inputs with recorded outputs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()

    print(f"CPU: {cpu_name()}; A = {args.a[0]} {args.a[1]}; B = {args.b[0]} {args.b[1]}")
    print(f"{args.rounds} interleaved rounds per case, {args.seconds} s each; minima over rounds")
    print(f"{'case':<40} {'A ms':>10} {'B ms':>10} {'B/A':>6} {'A error':>9} {'B error':>9}")
    ratios = []
    for case in args.cases:
        a, b = [], []
        for _ in range(args.rounds):
            a.append(run(*args.a, case, args.seconds))
            b.append(run(*args.b, case, args.seconds))
        la, lb = min(x[0] for x in a), min(x[0] for x in b)
        ratios.append(lb / la)
        fmt = lambda e: "-" if e is None else f"{e:.2e}"
        print(f"{case:<40} {la:>10.3f} {lb:>10.3f} {lb / la:>6.3f} {fmt(a[0][1]):>9} {fmt(b[0][1]):>9}")
    geo = 1.0
    for r in ratios:
        geo *= r
    print(f"geometric mean B/A: {geo ** (1 / len(ratios)):.3f}")


if __name__ == "__main__":
    main()
