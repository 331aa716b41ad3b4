// The paged KV cache as the decode attention kernels read it (paged_decode.cpp, decode_dp.cpp,
// decode_tiles.cpp): work items are (request, KV head) pairs; each item's K/V blocks are
// prefetched into L2 ahead of use, the next item's trickled in while the current one computes.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>

namespace modelyard::attention {

constexpr int64_t kPrefetchBytes = 128 * 1024;  // K+V of one item prefetched ahead, at most

// 64-byte lines into L2 (prefetcht1), not L1: the next item's 48 KiB of K/V would evict the
// current one's from a 48 KiB L1, and L2 prefetches keep more misses in flight. Against L1
// prefetches, on the default model's decode step (30 layers x 32 requests x 191 keys, K/V
// from memory): bf16 -11 % with blocks laid out as the engine's (-20 % scattered, +-2 % in
// order), float32 -29 % (-38 %, -20 %).
template <typename T>
inline void prefetch_rows(const T* x, int64_t count) {
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t i = 0; i < count; i += kLine) __builtin_prefetch(x + i, 0, 2);
}

// The paged caches as a decode reads them, for (request, KV head) work items.
template <typename T>
struct PagedKV {
  const T* k;
  const T* v;
  const int64_t* tables;
  const int64_t* lens;
  int64_t nkv, nblocks, bs, hd, nb_max, window;

  PagedKV(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_tables,
          const at::Tensor& seq_lens, int64_t window)
      : k(k_cache.data_ptr<T>()),
        v(v_cache.data_ptr<T>()),
        tables(block_tables.data_ptr<int64_t>()),
        lens(seq_lens.data_ptr<int64_t>()),
        nkv(k_cache.size(0)),
        nblocks(k_cache.size(1)),
        bs(k_cache.size(2)),
        hd(k_cache.size(3)),
        nb_max(block_tables.size(1)),
        window(window) {}

  // keys [first, len) of request r
  std::pair<int64_t, int64_t> key_range(int64_t r) const {
    const int64_t len = lens[r];
    return std::make_pair(window > 0 ? std::max<int64_t>(0, len - window) : 0, len);
  }

  // Whether row r attends row r - 1's keys and the one after them through the same blocks: the
  // next row of one prompt chunk, whose K/V row r - 1 (or the step's K/V store) just brought
  // into cache, so prefetching them again only costs instructions (the bulk of a prompt
  // chunk's attention time went to such prefetches)
  bool continues(int64_t r) const {
    if (r == 0 || lens[r] != lens[r - 1] + 1) return false;
    const int64_t* row = tables + r * nb_max;
    return std::equal(row, row + (lens[r - 1] + bs - 1) / bs, row - nb_max);
  }

  // The last block a loop over row r's keys prefetches the next block up to: none (-1) when
  // the row continues the previous one
  int64_t prefetch_until(int64_t r) const { return continues(r) ? -1 : (lens[r] - 1) / bs; }

  // the cache row of block b of request r's table, for KV head h
  int64_t block_row(int64_t r, int64_t h, int64_t b) const {
    return (h * nblocks + tables[r * nb_max + b]) * bs;
  }

  // Each block is its own 4 KiB run, where hardware prefetchers stop, and one block's compute is
  // far shorter than its fetch: so the next item's K/V blocks (up to kPrefetchBytes) are
  // prefetched while this item computes, and blocks past that budget one block ahead.
  void prefetch_item(int64_t item) const {
    const int64_t r = item / nkv, h = item % nkv;
    if (continues(r)) return;
    const auto [first, len] = key_range(r);
    const int64_t budget = kPrefetchBytes / (2 * bs * hd * int64_t(sizeof(T)));
    const int64_t stop = std::min((len - 1) / bs + 1, first / bs + budget);
    for (int64_t b = first / bs; b < stop; ++b) {
      prefetch_rows(k + block_row(r, h, b) * hd, bs * hd);
      prefetch_rows(v + block_row(r, h, b) * hd, bs * hd);
    }
  }

  // the blocks prefetch_item(item) would fetch: [begin, end), none when the row continues
  std::pair<int64_t, int64_t> item_blocks(int64_t item) const {
    const int64_t r = item / nkv;
    if (continues(r)) return {0, 0};
    const auto [first, len] = key_range(r);
    const int64_t budget = kPrefetchBytes / (2 * bs * hd * int64_t(sizeof(T)));
    return {first / bs, std::min((len - 1) / bs + 1, first / bs + budget)};
  }
};

// The following item's K/V lines (what prefetch_item fetches), issued a few at a time while the
// current item computes: issued at once, they fill the core's miss queue and the item waits
// for the fetch before it computes, so the fetch and the arithmetic do not overlap (figures:
// docs/benchmarks.md, "Figures behind choices").
template <typename T>
struct ItemTrickle {
  const PagedKV<T>* kv = nullptr;
  int64_t r = 0, h = 0, block = 0, stop = 0, line = 0, lines_per_block = 0;

  ItemTrickle(const PagedKV<T>& cache, int64_t item) : kv(&cache) {
    if (item < 0) return;
    r = item / cache.nkv;
    h = item % cache.nkv;
    std::tie(block, stop) = cache.item_blocks(item);
    lines_per_block = cache.bs * cache.hd * int64_t(sizeof(T)) / 64;
  }

  // lines left to issue
  int64_t left() const { return (stop - block) * 2 * lines_per_block - line; }

  // lines to issue with each block run of an item over keys [first, len), K and V passes alike
  // (0 where there are none, as after the rows of a prompt chunk)
  int64_t per_run(int64_t first, int64_t len) const {
    if (block >= stop) return 0;
    const int64_t bs = kv->bs, runs = 2 * ((len - 1) / bs - first / bs + 1);
    return (left() + runs - 1) / runs;
  }

  void issue(int64_t lines) {
    for (; lines > 0 && block < stop; --lines) {
      const bool is_k = line < lines_per_block;
      const T* base = (is_k ? kv->k : kv->v) + kv->block_row(r, h, block) * kv->hd;
      const int64_t at = is_k ? line : line - lines_per_block;
      __builtin_prefetch(reinterpret_cast<const char*>(base) + at * 64, 0, 2);
      if (++line == 2 * lines_per_block) {
        line = 0;
        ++block;
      }
    }
  }
};

// What a bf16 decode kernel reads and writes: the caches, the query rows (q, rows q_row apart,
// heads contiguous) and a new (D, nh, hd) output
struct Bf16Decode {
  using bf16 = at::BFloat16;
  PagedKV<bf16> kv;
  int64_t d, nh, hd, q_row;
  at::Tensor out;
  const bf16* q;
  bf16* o;
  float scale;

  Bf16Decode(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
             const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale_,
             int64_t window)
      : kv(k_cache, v_cache, block_tables, seq_lens, window),
        d(query.size(0)),
        nh(query.size(1)),
        hd(kv.hd),
        q_row(query.stride(0)),
        out(at::empty({d, nh, hd}, query.options())),
        q(query.data_ptr<bf16>()),
        o(out.data_ptr<bf16>()),
        scale(static_cast<float>(scale_)) {}

  int64_t items() const { return d * kv.nkv; }

  // the first of the g query rows of item (r, h), and of its output rows
  const bf16* query_rows(int64_t r, int64_t h, int64_t g) const {
    return q + r * q_row + h * g * hd;
  }
  bf16* output_rows(int64_t r, int64_t h, int64_t g) const { return o + (r * nh + h * g) * hd; }

  // this item's K/V when it is a thread's first, and the next one's, into L2 ahead of use
  void prefetch(int64_t item, int64_t following, bool opening) const {
    if (opening) kv.prefetch_item(item);
    if (following < items()) kv.prefetch_item(following);
  }
};

// Checks paged_decode_attention's operands (ops.h): dtypes, contiguity and shapes, and that every
// block a request reads is a block of the cache.
inline void check_operands(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& block_tables,
                           const at::Tensor& seq_lens) {
  const auto type = k_cache.scalar_type();
  TORCH_CHECK((type == at::kFloat || type == at::kBFloat16) && q.scalar_type() == type &&
                  v_cache.scalar_type() == type,
              "paged_decode_attention: float32 or bfloat16 q and caches, all of one dtype");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2) &&
                  k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  block_tables.is_contiguous() && seq_lens.is_contiguous(),
              "paged_decode_attention: contiguous tensors only (q: contiguous heads, any row "
              "stride)");
  const int64_t d = q.size(0), nh = q.size(1), hd = q.size(2);
  const int64_t nkv = k_cache.size(0), nblocks = k_cache.size(1), bs = k_cache.size(2);
  const int64_t nb_max = block_tables.size(1);
  TORCH_CHECK(nh % nkv == 0 && nh / nkv <= 64 && k_cache.size(3) == hd && hd % 8 == 0,
              "paged_decode_attention: bad shapes");
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  for (int64_t r = 0; r < d; ++r) {
    TORCH_CHECK(lens[r] >= 1 && lens[r] <= nb_max * bs, "paged_decode_attention: bad seq_len");
    for (int64_t b = 0; b < (lens[r] + bs - 1) / bs; ++b) {
      const int64_t block = tables[r * nb_max + b];
      TORCH_CHECK(block >= 0 && block < nblocks, "paged_decode_attention: bad block id");
    }
  }
}

}  // namespace modelyard::attention
