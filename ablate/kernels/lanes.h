/* Dropout draws as a function of where they are used: entry i of a call whose key is k is kept
   when lane(k, i) >= threshold. lane(k, i) is 16-bit lane i mod 4 (in memory order) of
   splitmix64's output for counter floor(i / 4) (Steele, Lea & Flood 2014): four lanes per 64-bit
   draw. A kernel computes the lanes of the entries it is about to use, so no mask is drawn,
   stored or read, and a backward pass regenerates the forward's. ablate.components.keep_lanes
   computes the same lanes with torch ops. */
#include <stdint.h>
#include <string.h>

/* Entries whose lanes one fill_lanes call computes (a multiple of 4). */
#define LANE_BLOCK 1024

static inline uint64_t splitmix64(uint64_t key, uint64_t counter) {
    uint64_t z = key + (counter + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* lanes[j] = lane(key, i0 + j) for j < n <= LANE_BLOCK. One draw per four entries, in a loop
   the compiler vectorises; the lanes are then the draws' bytes read as int16 (memcpy: no
   aliasing of uint64 storage through an int16 pointer). */
static inline void fill_lanes(uint64_t key, int64_t i0, int64_t n, int16_t *lanes) {
    uint64_t draws[LANE_BLOCK / 4 + 2];
    int16_t all[LANE_BLOCK + 8];
    const int64_t skip = i0 & 3, count = (skip + n + 3) >> 2;
    const uint64_t first = (uint64_t)(i0 >> 2);
    for (int64_t g = 0; g < count; g++) draws[g] = splitmix64(key, first + (uint64_t)g);
    memcpy(all, draws, (size_t)count * sizeof(uint64_t));
    memcpy(lanes, all + skip, (size_t)n * sizeof(int16_t));
}

/* The lanes of entries [start, min(end, start + LANE_BLOCK)); returns how many. */
static inline int64_t next_lanes(uint64_t key, int64_t start, int64_t end, int16_t *lanes) {
    const int64_t n = end - start < LANE_BLOCK ? end - start : LANE_BLOCK;
    fill_lanes(key, start, n, lanes);
    return n;
}
