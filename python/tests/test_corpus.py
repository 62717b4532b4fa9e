"""`make corpus` (docs/corpus.py): host-only, no GPU and no library needed.

Every variant in the runtime's tables (read here with a separate, simpler pattern than the
script's) has exactly one record, every record's kernel and launcher line ranges exist and hold
the function they name, the file is valid JSON lines, benchmark rows land on their variant, and
a variant whose card block is missing fails the run."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join("docs", "corpus.py")
FIELDS = {"op", "variant", "dtypes", "min_cc", "arch_specific", "architectures", "math", "latex",
          "design", "kernels", "launcher", "table", "card", "performance"}


def run_corpus(root, out, bench=None):
    args = [sys.executable, os.path.join(root, SCRIPT), "--out", str(out)]
    if bench:
        args += ["--bench", str(bench)]
    return subprocess.run(args, capture_output=True, text=True)


def shipped_variants():
    """(op, variant) of every row of every tk_variant table in src/*.c."""
    found = set()
    for path in glob.glob(os.path.join(REPO, "src", "*.c")):
        text = open(path, encoding="utf-8").read()
        for op, table in re.findall(r'tk_op\s+\w+\s*=\s*\{\s*"(\w+)"\s*,\s*(\w+)', text):
            body = text[text.index(table + "[]"):]
            body = body[:body.index("};")]
            found |= {(op, name) for name in re.findall(r'\{\s*"(\w+)"', body)}
    return found


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    bench = tmp / "bench.jsonl"
    rows = [
        {"op": "swiglu", "shape": "16384x14336", "dtype": "bf16", "variant": "vec16", "ms": 0.5,
         "gbps": 2800.0, "tflops": 0.0, "baseline": "copy", "baseline_ms": 0.48, "ratio": 0.96},
        {"op": "add+rmsnorm", "shape": "16384x4096", "dtype": "bf16", "variant": "vec16", "ms": 0.2,
         "gbps": 2700.0, "tflops": 0.0, "baseline": "copy", "baseline_ms": 0.18, "ratio": 0.9},
        {"op": "rmsnorm bwd", "shape": "16384x4096", "dtype": "bf16", "variant": "vec16", "ms": 0.4,
         "gbps": 2500.0, "tflops": 0.0, "baseline": "copy", "baseline_ms": 0.32, "ratio": 0.8},
    ]
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp / "corpus.jsonl"
    result = run_corpus(REPO, out, bench)
    assert result.returncode == 0, result.stderr
    lines = out.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_valid_json_lines_with_every_field(corpus):
    for rec in corpus:
        assert set(rec) == FIELDS, rec["op"] + "/" + rec["variant"]
        for key in ("math", "latex", "design", "dtypes"):
            assert rec[key].strip(), f"{rec['op']}/{rec['variant']}: empty {key}"
        assert rec["architectures"], f"{rec['op']}/{rec['variant']}: built for no target"


def test_every_shipped_variant_has_one_record(corpus):
    idents = [(rec["op"], rec["variant"]) for rec in corpus]
    assert len(idents) == len(set(idents))
    assert set(idents) == shipped_variants()


def function_in_range(path, first, last, name, kernel):
    lines = open(os.path.join(REPO, path), encoding="utf-8").read().splitlines()
    assert 1 <= first <= last <= len(lines), f"{path}:{first}-{last} past the end ({len(lines)} lines)"
    span = "\n".join(lines[first - 1:last])
    assert re.search(r"\b" + re.escape(name) + r"\s*\(", span), f"{path}:{first}-{last} lacks {name}"
    assert ("__global__" in span) == kernel, f"{path}:{first}-{last}: __global__ {'missing' if kernel else 'present'}"
    assert lines[last - 1].rstrip().endswith("}"), f"{path}:{last} does not close {name}"


def test_source_ranges_hold_what_they_name(corpus):
    for rec in corpus:
        assert rec["kernels"]
        for k in rec["kernels"]:
            function_in_range(k["file"], k["lines"][0], k["lines"][1], k["name"], kernel=True)
        launcher = rec["launcher"]
        function_in_range(launcher["file"], launcher["lines"][0], launcher["lines"][1],
                          launcher["name"], kernel=False)
        table = open(os.path.join(REPO, rec["table"]["file"]), encoding="utf-8").read().splitlines()
        row = table[rec["table"]["line"] - 1]
        assert f'"{rec["variant"]}"' in row and launcher["name"] in row


def test_architectures_follow_the_table(corpus):
    by = {(r["op"], r["variant"]): r for r in corpus}
    assert by[("gemm", "wgmma_128x256")]["architectures"] == ["sm_90a"]
    assert "sm_80" not in by[("softmax", "vec16_pipelined")]["architectures"]
    assert "sm_80" not in by[("softmax_bwd", "vec16_pipelined")]["architectures"]
    assert "sm_80" in by[("gemm", "mma_128x128")]["architectures"]


def test_bench_rows_land_on_their_variant(corpus):
    by = {(r["op"], r["variant"]): r for r in corpus}
    assert [p["ratio"] for p in by[("glu", "vec16")]["performance"]] == [0.96]
    assert [p["ratio"] for p in by[("norm", "vec16")]["performance"]] == [0.9]
    assert [p["ratio"] for p in by[("norm_bwd", "vec16")]["performance"]] == [0.8]
    assert by[("activation", "vec16")]["performance"] == []
    assert by[("glu", "scalar")]["performance"] == []


def test_a_variant_without_a_card_block_fails(tmp_path):
    for part in ("src", "cuda", "docs"):
        shutil.copytree(os.path.join(REPO, part), tmp_path / part)
    shutil.copy(os.path.join(REPO, "Makefile"), tmp_path / "Makefile")
    card = tmp_path / "docs" / "kernels" / "rope.md"
    text = card.read_text(encoding="utf-8")
    block = re.search(r"```corpus\nop: rope, rope_bwd\nvariant: scalar\n.*?```\n", text, re.S)
    assert block
    card.write_text(text.replace(block.group(0), ""), encoding="utf-8")
    result = run_corpus(str(tmp_path), tmp_path / "out.jsonl")
    assert result.returncode != 0
    assert "rope" in result.stderr and "scalar" in result.stderr
