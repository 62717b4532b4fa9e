#!/usr/bin/env python3
"""Markdown tables, one per family, from the JSON lines that `make bench` writes.

    python3 docs/bench_tables.py [build/bench.jsonl] [--only gemm,norm]

Each line of the file is one row of tkbench (benchmarks/bench_harness.cu, bench_report):
op, shape, dtype, variant, ms, gbps, tflops, baseline, baseline_ms, ratio. A row timed against
several baselines (the GEMM rows) is written once, with one ratio column per baseline; the
cuBLAS and cuBLASLt baselines of a shape share a column, since the op name says which epilogue
cuBLASLt ran. The output is what docs/performance.md's tables are made of.
"""
import argparse
import json
import sys

# Family of an op, by the op name's first word, in the order of `make bench`.
FAMILIES = [
    ("activation", ("gelu_erf", "gelu_tanh", "quick_gelu", "silu", "relu", "relu2")),
    ("glu", ("swiglu", "geglu_tanh", "geglu_erf", "reglu", "swiglu_clamped")),
    ("norm", ("rmsnorm", "layernorm", "add+rmsnorm", "add+layernorm")),
    ("softmax", ("softmax", "log_softmax")),
    ("rope", ("rope",)),
    ("attention", ("attention",)),
    ("attention_kvcache", ("attention_kvcache",)),
    ("gemm", ("gemm", "gemm+bias", "gemm+bias+gelu")),
]


def family_of(op):
    first = op.split()[0]
    for family, names in FAMILIES:
        if first in names:
            return family
    return "other"


def ratio_column(baseline):
    return "cuBLAS" if baseline.startswith("cuBLASLt") else baseline


def tables(rows, only):
    by_family = {}
    for row in rows:
        by_family.setdefault(family_of(row["op"]), []).append(row)
    order = [f for f, _ in FAMILIES] + ["other"]
    out = []
    for family in order:
        if family not in by_family or (only and family not in only):
            continue
        fam_rows = by_family[family]
        columns, merged = [], {}
        for row in fam_rows:
            key = (row["op"], row["shape"], row["dtype"], row["variant"])
            entry = merged.setdefault(key, {"row": row, "ratios": {}})
            if row.get("baseline") and row.get("ratio", 0) > 0:
                column = ratio_column(row["baseline"])
                if column not in columns:
                    columns.append(column)
                entry["ratios"][column] = row["ratio"]
        compute = any(r.get("tflops", 0) > 0 for r in fam_rows)
        rate = "TFLOP/s" if compute else "GB/s"
        header = ["op", "shape", "dtype", "variant", "ms", rate] + ["vs " + c for c in columns]
        out.append("### " + family + "\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("| " + " | ".join(["---"] * 4 + ["---:"] * (len(header) - 4)) + " |")
        for entry in merged.values():
            row = entry["row"]
            value = row.get("tflops", 0) if compute else row.get("gbps", 0)
            cells = [row["op"], row["shape"], row["dtype"], row["variant"] or "-",
                     "%.4f" % row["ms"], "%.1f" % value]
            cells += ["%.2fx" % entry["ratios"][c] if c in entry["ratios"] else "" for c in columns]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl", nargs="?", default="build/bench.jsonl")
    parser.add_argument("--only", help="comma-separated families: " + ", ".join(f for f, _ in FAMILIES))
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    try:
        with open(args.jsonl) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        sys.exit("%s: %s (run `make bench` on a GPU machine first)" % (args.jsonl, e.strerror))
    if not rows:
        sys.exit(args.jsonl + ": no rows")
    print(tables(rows, only))


if __name__ == "__main__":
    main()
