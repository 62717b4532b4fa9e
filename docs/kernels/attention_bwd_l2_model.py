"""A model of the Hopper attention backward's HBM traffic under causal, for the grid order and the
walk (docs/kernels/attention_bwd.md, "Grid order" and "Deterministic dQ").

CTAs of (pair, key tile n) take tickets in sections of `section` (batch, key/value head) pairs,
the key tiles slowest within a section; SLOTS CTAs run at once, each doing one step per time unit
(a slot takes the next ticket when its CTA ends). Key tile n of 128 keys visits the query tiles
of 64 rows from 2n to the last, of each of the group's heads, in the walk's order. A step touches
its query tile's Q / dO (32 KiB at head dim 128) and its dQ accumulator tile (32 KiB, dirty) in an
LRU cache of `l2` such items; a miss reads an item, a dirty eviction writes one. With --det key
tile n does (head, tile) only a time unit after key tile n - 1 has (the turns).

  python3 attention_bwd_l2_model.py WALK SECTION [--det] [--pairs 32] [--tiles 64] [--l2 1280]
  WALK: tiles_asc (the atomic kernel's), heads_desc (the deterministic kernel's), tiles_desc,
  heads_asc.

It reproduces the direction of the measured traffic (Nsight Compute, H100, B4 Hq32/Hkv8 S4096
D128: the atomic kernel 1.52-1.62x fewer DRAM bytes than the heads-fastest walks; the model
1.21-1.29x), not its size.
"""
import argparse
from collections import OrderedDict

GROUP, SLOTS = 4, 132


def walk(order, n, tiles):
    first, count = 2 * n, tiles - 2 * n
    for it in range(count * GROUP):
        if order == "tiles_asc":
            yield it // count, first + it % count
        elif order == "tiles_desc":
            yield it // count, tiles - 1 - it % count
        elif order == "heads_asc":
            yield it % GROUP, first + it // GROUP
        else:  # heads_desc
            yield it % GROUP, tiles - 1 - it // GROUP


def run(order, section, det, pairs, tiles, l2_items):
    key_tiles = tiles // 2
    tickets = [(first + i, n) for first in range(0, pairs, section)
               for n in range(key_tiles) for i in range(min(section, pairs - first))]
    slots = [None] * SLOTS  # [pair, n, steps, next step]
    done, cache = {}, OrderedDict()
    reads = writes = idle = t = nxt = 0

    def touch(key, dirty):
        nonlocal reads, writes
        if key in cache:
            cache.move_to_end(key)
            cache[key] |= dirty
            return
        reads += 1
        cache[key] = dirty
        if len(cache) > l2_items:
            writes += cache.popitem(last=False)[1]

    while True:
        busy = False
        for s in range(SLOTS):
            if slots[s] is None or slots[s][3] == len(slots[s][2]):
                if nxt == len(tickets):
                    slots[s] = None
                    continue
                p, n = tickets[nxt]
                nxt += 1
                slots[s] = [p, n, list(walk(order, n, tiles)), 0]
            busy = True
            p, n, steps, i = slots[s]
            h, m = steps[i]
            if det and n > 0 and done.get((p, n - 1, h, m), t) >= t:
                idle += 1
                continue
            slots[s][3] += 1
            done[(p, n, h, m)] = t
            touch(("q", p, h, m), 0)
            touch(("dq", p, h, m), 1)
        if not busy:
            return reads, writes, t, idle
        t += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("walk", choices=["tiles_asc", "tiles_desc", "heads_asc", "heads_desc"])
    ap.add_argument("section", type=int)
    ap.add_argument("--det", action="store_true")
    ap.add_argument("--pairs", type=int, default=32)
    ap.add_argument("--tiles", type=int, default=64, help="query tiles of 64 rows (seqlen / 64)")
    ap.add_argument("--l2", type=int, default=1280, help="cache items of 32 KiB (1280: 40 MiB)")
    a = ap.parse_args()
    reads, writes, t, idle = run(a.walk, a.section, a.det, a.pairs, a.tiles, a.l2)
    print(f"{a.walk} section {a.section}{' det' if a.det else ''}: HBM {(reads + writes) * 32 / 1024:.0f} MiB "
          f"(reads {reads}, writebacks {writes}), time {t} steps, idle slot-steps {idle}")


if __name__ == "__main__":
    main()
