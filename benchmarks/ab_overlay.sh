#!/usr/bin/env bash
# Writes the library and test sources that a candidate changes into a directory, at their
# repository paths: a candidate for benchmarks/ab_builds.sh, which lays it over the tree on the GPU
# machine (where there is no git history). The candidate is REF's changes since it left HEAD's
# history, or since BASE when given as BASE..REF (a candidate already reachable from HEAD, e.g.
# through a merge that kept it without taking it). A file that HEAD changed too since then would
# lose HEAD's change in the overlay, so that stops it: rebase the candidate first.
#
#   benchmarks/ab_overlay.sh REF DIR            e.g. benchmarks/ab_overlay.sh wip/bwd-step DIR
#   benchmarks/ab_overlay.sh BASE..REF DIR      e.g. benchmarks/ab_overlay.sh a935553..ac5f3f9 DIR
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,10p' "$0"; exit 2; }
case $1 in
*..*) base=${1%%..*} ref=${1##*..} ;;
*) ref=$1 base=$(git merge-base HEAD "$1") ;;
esac
dir=$2
paths=(Makefile include src cuda tests)
if git diff --name-only --diff-filter=DR "$base" "$ref" -- "${paths[@]}" | grep -q .; then
    echo "$ref deletes or renames files; an overlay only adds and replaces" >&2
    exit 1
fi
changed=$(git diff --name-only "$base" "$ref" -- "${paths[@]}")
[ -n "$changed" ] || { echo "$base..$ref changes no library or test source" >&2; exit 1; }
both=$(comm -12 <(echo "$changed" | sort) <(git diff --name-only "$base" HEAD -- "${paths[@]}" | sort))
if [ -n "$both" ]; then
    echo "HEAD changed these files too since $base; rebase $ref onto HEAD first:" >&2
    echo "$both" >&2
    exit 1
fi
mkdir -p "$dir"
for f in $changed; do
    mkdir -p "$dir/$(dirname "$f")"
    git show "$ref:$f" >"$dir/$f"
    echo "$f"
done
