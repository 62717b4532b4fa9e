#!/usr/bin/env bash
# Writes the files that a git ref changes against HEAD (the library's and the tests' sources) into
# a directory, at their repository paths: a candidate for benchmarks/ab_builds.sh, which lays it
# over the tree on the GPU machine (where there is no git history).
#
#   benchmarks/ab_overlay.sh REF DIR        e.g. benchmarks/ab_overlay.sh wip/bwd-step DIR
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,6p' "$0"; exit 2; }
ref=$1 dir=$2
paths=(Makefile include src cuda tests)
if git diff --name-only --diff-filter=DR HEAD "$ref" -- "${paths[@]}" | grep -q .; then
    echo "$ref deletes or renames files against HEAD; an overlay only adds and replaces" >&2
    exit 1
fi
mkdir -p "$dir"
git diff --name-only --diff-filter=AM HEAD "$ref" -- "${paths[@]}" | while read -r f; do
    mkdir -p "$dir/$(dirname "$f")"
    git show "$ref:$f" >"$dir/$f"
    echo "$f"
done
