#!/usr/bin/env bash
# `make abi-check`: compares the built shared library with the committed ABI baseline and fails
# on any difference, naming its kind:
#   - a tk_* function removed: incompatible. Undo it; a deliberate break needs a new major
#     version (TK_VERSION_MAJOR, hence a new SONAME) and a new baseline.
#   - an existing function or a type it reaches changed: incompatible unless a reviewer finds
#     otherwise (a field appended to a params struct, whose size field keeps old callers working,
#     is compatible); then the regenerated baseline is committed with the change.
#   - only new tk_* functions: compatible, and the baseline must record them in the same commit
#     (`make abi-baseline`), so that removing them later is caught.
#
#   abi/check.sh BASELINE LIBRARY
set -uo pipefail
baseline=$1 library=$2

command -v abidiff >/dev/null && command -v abidw >/dev/null \
    || { echo "abi-check: abidiff or abidw not found (Debian: apt-get install abigail-tools)" >&2; exit 1; }
[ -f "$baseline" ] || { echo "abi-check: no baseline $baseline (make abi-baseline)" >&2; exit 1; }

# Without debug info (the host objects' -g) abidiff compares symbol names alone and misses
# every type change; its --fail-no-debug-info does not catch that when one side is XML.
corpus=$(abidw --exported-interfaces-only --drop-undefined-syms "$library") || exit 1
exported=$(grep -c '<elf-symbol ' <<<"$corpus")
described=$(grep -c 'elf-symbol-id=' <<<"$corpus")
if [ "$described" -lt "$exported" ]; then
    echo "abi-check: debug info describes $described of the $exported exported symbols of $library;" \
         "the host objects must be compiled with -g" >&2
    exit 1
fi

# The baseline holds only what the exported functions reach, without source locations; the
# library is read the same way. (Passing the header directory here instead would filter out
# every change: types without a location count as private.)
flags=(--exported-interfaces-only --no-show-locs)
report=$(abidiff "${flags[@]}" "$baseline" "$library")
rc=$?
# abidiff's exit status is a bit field: 1 error, 2 usage error, 4 ABI change, 8 incompatible.
if [ $rc -eq 0 ]; then
    echo "abi-check: $library matches $baseline"
    exit 0
fi
echo "$report"
if (( rc & 3 )); then
    echo "abi-check: abidiff failed (exit status $rc)"
elif (( rc & 8 )); then
    echo "abi-check: INCOMPATIBLE: an exported function of $baseline is gone (see above)"
elif abidiff "${flags[@]}" --no-added-syms "$baseline" "$library" >/dev/null; then
    echo "abi-check: compatible additions that $baseline does not record yet:" \
         "run 'make abi-baseline' and commit $baseline with the change"
else
    echo "abi-check: CHANGED: existing functions or the types they use differ (see above): incompatible" \
         "unless review finds otherwise; then run 'make abi-baseline' and commit $baseline with the change"
fi
exit 1
