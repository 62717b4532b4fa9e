#!/usr/bin/env python3
"""The kernel corpus: one JSON line per kernel variant the library ships (docs/corpus.md).

    python3 docs/corpus.py [--out build/corpus.jsonl] [--bench build/bench.jsonl]

Nothing here is a second copy of a fact. The variants are the rows of the `tk_variant` tables in
src/*.c (name, lowest compute capability, arch-specific flag, launcher) and the `tk_op` that
holds each table; the architectures follow from those and the Makefile's default ARCHS; the
math, dtypes and design come from the ```corpus blocks at the end of each card in
docs/kernels/; the line ranges of the kernels and launchers are found in cuda/ on every run;
the performance rows are those of build/bench.jsonl (when present) whose variant matches.
Any variant without a block, block without a variant, or name not found in the sources is an
error, so the corpus cannot drift from the code or the docs.
"""
import argparse
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "docs"))
from bench_tables import family_of  # noqa: E402  (the bench op names' families, one list)


class CorpusError(Exception):
    pass


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


# ------------------------------------------------------------------------------ tables --

# The variant tables name compute capabilities as src/runtime.h's TK_CC_* constants (or numbers).
CC_NAME = re.compile(r"^#define\s+(TK_CC_\w+)\s+(\d+)", re.M)


def compute_capability(token):
    if token.isdigit():
        return int(token)
    names = dict(CC_NAME.findall(read("src/runtime.h")))
    if token not in names:
        raise SystemExit(f"corpus: unknown compute capability {token} in a variant table")
    return int(names[token])


ROW = re.compile(r'\{\s*"(\w+)"\s*,\s*(\w+)\s*,\s*(true|false)\s*,\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\}')
TABLE = re.compile(r"static\s+const\s+tk_variant\s+(\w+)\s*\[\s*\]\s*=\s*\{(.*?)\};", re.S)
OP = re.compile(r'const\s+tk_op\s+\w+\s*=\s*\{\s*"(\w+)"\s*,\s*(\w+)\s*,\s*([^}]*)\}')


def variant_tables():
    """[{op, variant, min_cc, arch_specific, launcher, table: {file, line}}] in table order.
    A table names each variant once (src/runtime.h's tk_op)."""
    variants = []
    seen = set()
    for path in sorted(glob.glob(os.path.join(ROOT, "src", "*.c"))):
        rel = os.path.relpath(path, ROOT)
        text = read(rel)
        tables = {m.group(1): m for m in TABLE.finditer(text)}
        for op in OP.finditer(text):
            op_name, table_name, count = op.group(1), op.group(2), op.group(3).strip()
            if table_name not in tables:
                raise CorpusError(f"{rel}: tk_op {op_name} names a table {table_name} not found")
            table = tables[table_name]
            rows = list(ROW.finditer(table.group(2)))
            if count.isdigit() and int(count) != len(rows):
                raise CorpusError(f"{rel}: {op_name} counts {count} variants, its table has {len(rows)}")
            for row in rows:
                v = {
                    "op": op_name, "variant": row.group(1), "min_cc": compute_capability(row.group(2)),
                    "arch_specific": row.group(3) == "true", "launcher": row.group(5),
                    "table": {"file": rel, "line": line_of(text, table.start(2) + row.start())},
                }
                if (op_name, v["variant"]) in seen:
                    raise CorpusError(f"{rel}:{v['table']['line']}: {op_name} names variant {v['variant']} twice")
                seen.add((op_name, v["variant"]))
                variants.append(v)
    if not variants:
        raise CorpusError("no tk_variant tables found in src/*.c")
    return variants


def default_archs():
    m = re.search(r"^ARCHS\s*\?=\s*(.*)$", read("Makefile"), re.M)
    return m.group(1).split()


def architectures(min_cc, arch_specific, archs):
    """The targets of the default build whose code runs this variant."""
    out = []
    for arch in archs:
        ptx = arch.startswith("compute_")
        digits = re.match(r"\d+", arch[len("compute_"):] if ptx else arch).group(0)
        cc = int(digits) * 10
        specific = arch.endswith("a")
        if arch_specific:
            if specific and not ptx and cc == min_cc:
                out.append("sm_" + arch)
        elif cc >= min_cc:
            out.append(arch if ptx else "sm_" + arch)
    return out


# ------------------------------------------------------------------------------- cards --

BLOCK = re.compile(r"^```corpus[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
LIST_KEYS = ("kernel",)


def card_blocks():
    """(op, variant or None) -> fields, from every card's ```corpus blocks. A block without a
    variant holds what all of its op's variants share; `kernel` may repeat; `op` may name
    several ops, comma-separated, that run the same kernels (a forward op and its "_bwd")."""
    blocks = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "kernels", "*.md"))):
        rel = os.path.relpath(path, ROOT)
        text = read(rel)
        for m in BLOCK.finditer(text):
            where = f"{rel}:{line_of(text, m.start())}"
            fields, key = {}, None
            for line in m.group(1).splitlines():
                if line[:1].isspace() and key and line.strip():
                    fields[key][-1] += " " + line.strip()
                    continue
                k, sep, value = line.partition(":")
                if not sep or not k.strip():
                    raise CorpusError(f"{where}: expected 'key: value', got {line!r}")
                key = k.strip()
                fields.setdefault(key, []).append(value.strip())
            for k, values in fields.items():
                if k not in LIST_KEYS and len(values) > 1:
                    raise CorpusError(f"{where}: key {k} given twice")
            if "op" not in fields:
                raise CorpusError(f"{where}: block without an op")
            for op in (name.strip() for name in fields["op"][0].split(",")):
                ident = (op, fields["variant"][0] if "variant" in fields else None)
                if ident in blocks:
                    raise CorpusError(f"{where}: a second block for {ident}")
                blocks[ident] = {"where": where, **fields}
    return blocks


# ----------------------------------------------------------------------------- sources --

def code_only(text):
    """text with comments, strings and character literals blanked (same length, same lines)."""
    out, i, n = list(text), 0, len(text)
    while i < n:
        two = text[i:i + 2]
        if two in ("//", "/*"):
            end = text.find("\n", i) if two == "//" else text.find("*/", i + 2) + 2
            end = n if end <= 1 or end == -1 else end
        elif text[i] in "\"'":
            end = i + 1
            while end < n and text[end] != text[i]:
                end += 2 if text[end] == "\\" else 1
            end += 1
        else:
            i += 1
            continue
        for j in range(i, min(end, n)):
            if out[j] != "\n":
                out[j] = " "
        i = end
    return "".join(out)


def definition(path, name, kernel):
    """(first line, last line) of the definition of function `name` in path: from the start of
    its declaration (its template line included) to the closing brace of its body. With
    kernel=True the declaration must be __global__."""
    text = read(path)
    code = code_only(text)
    for m in re.finditer(r"\b" + re.escape(name) + r"\s*\(", code):
        start = max(code.rfind(c, 0, m.start()) for c in ";{}")
        head = code[start + 1:m.start()]
        directive = head.rfind("#")
        if directive != -1:  # a preprocessor line between: the declaration starts after it
            start += 1 + head.index("\n", directive)
            head = code[start + 1:m.start()]
        body = code.find("{", m.end())
        semi = code.find(";", m.end())
        if body == -1 or (semi != -1 and semi < body):
            continue  # a declaration or a call
        if kernel and "__global__" not in head:
            continue
        if not kernel and "__global__" in head:
            continue
        depth, i = 0, body
        while i < len(code):
            if code[i] == "{":
                depth += 1
            elif code[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        first = start + 1 + (len(head) - len(head.lstrip()))
        return line_of(text, first), line_of(text, i)
    what = "__global__ function" if kernel else "function definition"
    raise CorpusError(f"{path}: no {what} named {name}")


def find_launcher(name):
    for path in sorted(glob.glob(os.path.join(ROOT, "cuda", "*.cu"))):
        rel = os.path.relpath(path, ROOT)
        if re.search(r"\b" + re.escape(name) + r"\s*\(", read(rel)):
            try:
                return rel, definition(rel, name, kernel=False)
            except CorpusError:
                continue
    raise CorpusError(f"launcher {name} is not defined in cuda/*.cu")


# ----------------------------------------------------------------------------- records --

def bench_rows(path):
    rows = []
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise CorpusError(f"{path}:{n}: {e}")
    return rows


def op_of(bench_op):
    """The runtime op of a bench op: its family, "<family>_bwd" for a backward row ("rmsnorm bwd")."""
    return family_of(bench_op) + ("_bwd" if "bwd" in bench_op.split()[1:] else "")


def performance(rows, op, variant):
    return [{k: row.get(k) for k in ("op", "shape", "dtype", "ms", "gbps", "tflops", "baseline",
                                     "baseline_ms", "ratio")}
            for row in rows if op_of(row.get("op", "")) == op and row.get("variant") == variant]


def records(bench_path):
    variants = variant_tables()
    blocks = card_blocks()
    archs = default_archs()
    rows = bench_rows(bench_path)
    known = {(v["op"], v["variant"]) for v in variants} | {(v["op"], None) for v in variants}
    for ident, block in blocks.items():
        if ident not in known:
            raise CorpusError(f"{block['where']}: {ident} is not a variant in src/*.c's tables")
    out = []
    for v in variants:
        ident = (v["op"], v["variant"])
        if ident not in blocks:
            raise CorpusError(f"no ```corpus block for op {v['op']} variant {v['variant']} in docs/kernels/")
        fields = {**blocks.get((v["op"], None), {}), **blocks[ident]}
        for key in ("math", "latex", "design", "dtypes", "kernel", "launcher"):
            if key not in fields:
                raise CorpusError(f"{fields['where']}: {ident} has no {key}")
        if fields["launcher"][0] != v["launcher"]:
            raise CorpusError(f"{fields['where']}: launcher {fields['launcher'][0]} but the table in "
                              f"{v['table']['file']} says {v['launcher']}")
        launcher_file, launcher_lines = find_launcher(v["launcher"])
        kernels = []
        for entry in fields["kernel"]:
            parts = entry.split()
            if len(parts) != 2:
                raise CorpusError(f"{fields['where']}: kernel should be 'cuda/file name', got {entry!r}")
            first, last = definition(parts[0], parts[1], kernel=True)
            kernels.append({"name": parts[1], "file": parts[0], "lines": [first, last]})
        out.append({
            "op": v["op"],
            "variant": v["variant"],
            "dtypes": fields["dtypes"][0],
            "min_cc": v["min_cc"],
            "arch_specific": v["arch_specific"],
            "architectures": architectures(v["min_cc"], v["arch_specific"], archs),
            "math": fields["math"][0],
            "latex": fields["latex"][0],
            "design": fields["design"][0],
            "kernels": kernels,
            "launcher": {"name": v["launcher"], "file": launcher_file, "lines": list(launcher_lines)},
            "table": v["table"],
            "card": fields["where"].split(":")[0],
            "performance": performance(rows, v["op"], v["variant"]),
        })
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "corpus.jsonl"))
    parser.add_argument("--bench", default=os.path.join(ROOT, "build", "bench.jsonl"),
                        help="tkbench JSON lines; skipped when absent")
    args = parser.parse_args()
    try:
        recs = records(args.bench)
    except CorpusError as e:
        sys.exit(f"corpus: {e}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for rec in recs:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    timed = sum(1 for r in recs if r["performance"])
    print(f"{args.out}: {len(recs)} variants, {timed} with measured performance")


if __name__ == "__main__":
    main()
