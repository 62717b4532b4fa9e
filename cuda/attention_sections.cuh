/* The work order in L2-sized sections that the Hopper forward (attention_sm90.cu: a work tile per
 * query tile of a (batch, query head)) and the backward (attention_bwd.cuh: a CTA per key tile of
 * a (batch, key/value head)) share. A grid of `places` tiles in each of `units` (batch, head)
 * pairs, heads fastest, runs section after section: the units are cut in order into sections of
 * `section` (the last may be short), and within a section the places run slowest and the
 * section's units fastest. The CTAs resident at one time then work on the units of one section
 * (two where one ends and the next begins), whose shared data (the forward's K / V, the
 * backward's Q, dO and dQ accumulator) stays in L2 while they do. Section = units is the units
 * fastest over the whole grid, section = 1 the places fastest. */
#ifndef TK_ATTENTION_SECTIONS_CUH
#define TK_ATTENTION_SECTIONS_CUH

#include <stdint.h>

namespace {

/* Work item `item` of such a grid: its unit and its place (0 first). */
struct attn_section_item {
    unsigned unit, place;
};

__device__ __forceinline__ attn_section_item attn_section_walk(unsigned item, unsigned units, unsigned section,
                                                               unsigned places) {
    const unsigned section_items = section * places;       /* a full section's */
    const unsigned first = item / section_items * section; /* the section's first unit */
    const unsigned size = min(section, units - first);     /* the last one may be short */
    const unsigned in_section = item % section_items;
    return {first + in_section % size, in_section / size};
}

/* The section size, in units whose shared data take unit_bytes each: at most as many as
 * `budget` bytes hold (at least one: `most`), and at least `least`. Of the sizes from half of
 * most (and from least, and at most ATTN_SECTION_TRIES below most) up to most, the one whose
 * last section is the fullest (a divisor of units fills it; the larger size on a tie): a short
 * last section starts its longest work when the machine is draining (the forward's 128 pairs in
 * sections of 25 left 3 to the end of the grid). Where most < least no size fits both: one
 * section of every unit. Host work on every launch, so bounded: the search stops at the first
 * size whose last section is full, which no smaller size beats, and after ATTN_SECTION_TRIES
 * sizes, a bound that only a `most` past 128 reaches (tiny pairs, e.g. a few keys each, make it
 * tens of thousands: an unbounded search then took that many divisions per launch). */
constexpr int64_t ATTN_SECTION_TRIES = 64;

inline int64_t attn_section_size(int64_t units, int64_t unit_bytes, int64_t budget, int64_t least) {
    int64_t most = budget / unit_bytes > 1 ? budget / unit_bytes : 1;
    most = most < units ? most : units;
    if (most < least)
        return units;
    int64_t size = most, fill = units % most ? units % most : most; /* of size */
    for (int64_t k = most - 1; fill < size && 2 * k >= most && k >= least && most - k <= ATTN_SECTION_TRIES; k--) {
        const int64_t f = units % k ? units % k : k;
        if (f * size > fill * k)
            size = k, fill = f;
    }
    return size;
}

} // namespace

#endif
