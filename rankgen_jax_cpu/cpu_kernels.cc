// Kernels for XLA:CPU, called through the XLA FFI: softmax attention (forward and
// backward), T5 1.1's gated GELU (gelu(gate) * linear) and T5's RMS norm, each both ways,
// and a dense layer's three products (x w, d_y w^T and the weight gradient x^T d_y).
// Every product runs through `gemm_block` with its B operand packed into contiguous panels.
//
// Attention:
// One task per (batch row, head): its [L, L] logits, weights and their gradients live in
// per-thread buffers that stay in L2, where XLA:CPU writes and rereads each [B, H, L, L]
// tensor in memory several times per layer. The matmuls are one register-blocked
// broadcast-FMA kernel (`gemm`), written with GCC vector extensions for the vector width
// -march=native gives (16 lanes with AVX-512, 8 with AVX2, 4 otherwise).
//
// Attention shapes: q, k, v, o, d_out, d_q, d_k, d_v: [B, L, H, K]; position_bias, d_position_bias:
// [H, L, L] (zeros of shape [0] when the model has none); mask_bias: [B, L]; lse: [B, H, L],
// the log of each softmax row's normaliser, saved by the forward pass for the backward one.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// One vector is one register of the widest kind the compiler may use (-march=native); each
// register block of `gemm_block` is sized to the register file. A vector type wider than the
// machine's registers would be split by the compiler and its sums spilled to memory at every
// step: on an AVX2 machine, 16-lane blocks ran ~20x slower than XLA:CPU's own dots.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int kBlockVectors = 4;  // 6 x 4 sums + 4 B vectors + a broadcast: 29 of 32 registers
#elif defined(__AVX__)
constexpr int kLanes = 8;
constexpr int kBlockVectors = 2;  // 6 x 2 sums + 2 + 1: 15 of 16 registers
#else
constexpr int kLanes = 4;  // SSE2, NEON
constexpr int kBlockVectors = 2;
#endif
typedef float vec __attribute__((vector_size(4 * kLanes)));
typedef float vec_unaligned __attribute__((vector_size(4 * kLanes), aligned(4)));
typedef int32_t ivec __attribute__((vector_size(4 * kLanes)));

inline vec load(const float* p) { return *reinterpret_cast<const vec_unaligned*>(p); }
inline void store(float* p, vec x) { *reinterpret_cast<vec_unaligned*>(p) = x; }
inline int64_t round_up(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }
inline vec splat(float s) { return vec{} + s; }

// exp(x) to ~2 ulp: x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-6 polynomial, 2^n in the
// exponent bits. Below -87.3 (masked logits) the result is 0.
inline vec vexp(vec x) {
  const vec lo = x < -87.3f ? splat(-87.3f) : x;  // keeps 2^n a normal float (and -inf finite)
  const vec xc = lo > 88.3f ? splat(88.3f) : lo;
  const vec shifter = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to the nearest integer
  const vec t = xc * 1.44269504088896341f + shifter;
  const vec n = t - shifter;
  const vec r = (xc - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;
  vec p = splat(1.0f / 720.0f);
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
  vec scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const vec y = p * scale;
  return x < -87.3f ? vec{} : y;
}

// C[r, c0 : c0 + kLanes NV] (+)= sum_t A(r, t) * B[t, c0 : c0 + kLanes NV], R rows at a time in
// R x NV vector registers. A(r, t) = a[r * a_rs + t * a_ts]: strides cover A and A^T alike.
// With `accumulate` the sum is added to what C holds once it is complete: a caller that adds
// K in blocks this way sums each block on its own, and the rounding error grows with the
// block length plus the number of blocks rather than with K.
template <int R, int NV>
void gemm_block(int64_t m, int64_t t_len, const float* a, int64_t a_rs, int64_t a_ts,
                const float* b, int64_t ldb, float* c, int64_t ldc, int64_t c0, bool accumulate) {
  int64_t r0 = 0;
  for (; r0 + R <= m; r0 += R) {
    vec acc[R][NV];
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < NV; ++j) acc[i][j] = vec{};
    for (int64_t t = 0; t < t_len; ++t) {
      vec bv[NV];
      for (int j = 0; j < NV; ++j) bv[j] = load(b + t * ldb + c0 + j * kLanes);
      for (int i = 0; i < R; ++i) {
        const float s = a[(r0 + i) * a_rs + t * a_ts];
        for (int j = 0; j < NV; ++j) acc[i][j] += s * bv[j];
      }
    }
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < NV; ++j) {
        float* out = c + (r0 + i) * ldc + c0 + j * kLanes;
        store(out, accumulate ? load(out) + acc[i][j] : acc[i][j]);
      }
  }
  // The rows left over: by the kernel of half as many rows, and so on down to one.
  if constexpr (R > 1)
    if (r0 < m) gemm_block<R / 2, NV>(m - r0, t_len, a + r0 * a_rs, a_rs, a_ts, b, ldb, c + r0 * ldc, ldc, c0, accumulate);
}

// B operands are copied into panels of up to kPanelDepth rows by kPanelCols columns, contiguous, so
// that a panel stays in L1 while `gemm_block` runs it against every row of A. Read in place,
// B's rows are a power-of-two multiple of 64 bytes apart at most of the model's shapes, and
// they fall into a few cache sets and evict each other.
constexpr int64_t kPanelDepth = 128;
constexpr int64_t kPanelCols = kBlockVectors * kLanes;  // one register block wide: 64 with AVX-512, 16 with AVX2

// C[m, c0 : c0 + cols] (+)= A B_panel for a contiguous panel [t_len][cols], cols <= kPanelCols a
// multiple of kLanes, by the register block of that width.
void gemm_panel(int64_t m, int64_t t_len, const float* a, int64_t a_rs, int64_t a_ts, const float* panel, int64_t cols,
                float* c, int64_t ldc, int64_t c0, bool accumulate) {
  // Panels are at most kBlockVectors vectors wide: the wider blocks exist only where they can occur.
  switch (cols / kLanes) {
    case 4:
      if constexpr (kBlockVectors >= 4) gemm_block<6, 4>(m, t_len, a, a_rs, a_ts, panel, cols, c + c0, ldc, 0, accumulate);
      break;
    case 3:
      if constexpr (kBlockVectors >= 3) gemm_block<6, 3>(m, t_len, a, a_rs, a_ts, panel, cols, c + c0, ldc, 0, accumulate);
      break;
    case 2: gemm_block<kBlockVectors == 2 ? 6 : 8, 2>(m, t_len, a, a_rs, a_ts, panel, cols, c + c0, ldc, 0, accumulate); break;
    case 1: gemm_block<12, 1>(m, t_len, a, a_rs, a_ts, panel, cols, c + c0, ldc, 0, accumulate); break;
    default: break;
  }
}

// C[m, w] = A[m, t_len] B[t_len, w]; w is a multiple of kLanes, B's rows are ldb apart. B is copied
// panel by panel into `panel` (kPanelDepth x kPanelCols floats); each panel's sum is added to C in turn.
void gemm(int64_t m, int64_t t_len, int64_t w, const float* a, int64_t a_rs, int64_t a_ts, const float* b, int64_t ldb,
          float* c, int64_t ldc, float* panel) {
  for (int64_t c0 = 0; c0 < w; c0 += kPanelCols) {
    const int64_t cols = std::min(kPanelCols, w - c0);
    for (int64_t p = 0; p < t_len; p += kPanelDepth) {
      const int64_t depth = std::min(kPanelDepth, t_len - p);
      for (int64_t t = 0; t < depth; ++t) std::memcpy(panel + t * cols, b + (p + t) * ldb + c0, cols * sizeof(float));
      gemm_panel(m, depth, a + p * a_ts, a_rs, a_ts, panel, cols, c, ldc, c0, p > 0);
    }
  }
}

struct Dims {
  int64_t batch, length, heads, head_dim;
  int64_t lp, kp;  // length and head_dim rounded up to whole vectors
  int64_t row_stride() const { return heads * head_dim; }
};

// Rows of one head's [L, K] slice: a view into the [B, L, H, K] array when K is a whole number
// of vectors (row stride H*K), else a zero-padded copy in scratch (row stride kp).
struct Rows {
  float* data;
  int64_t ld;
  bool copied;
};

Rows head_rows(const Dims& d, const float* x, int64_t b, int64_t h, float* scratch) {
  float* base = const_cast<float*>(x) + b * d.length * d.row_stride() + h * d.head_dim;
  if (d.head_dim == d.kp) return {base, d.row_stride(), false};
  for (int64_t i = 0; i < d.length; ++i) {
    std::memcpy(scratch + i * d.kp, base + i * d.row_stride(), d.head_dim * sizeof(float));
    std::memset(scratch + i * d.kp + d.head_dim, 0, (d.kp - d.head_dim) * sizeof(float));
  }
  return {scratch, d.kp, true};
}

// Where to write one head's [L, K] result: the output itself, or scratch to be copied by put_rows.
Rows output_rows(const Dims& d, float* x, int64_t b, int64_t h, float* scratch) {
  if (d.head_dim == d.kp) return {x + b * d.length * d.row_stride() + h * d.head_dim, d.row_stride(), false};
  return {scratch, d.kp, true};
}

void put_rows(const Dims& d, const Rows& rows, float* x, int64_t b, int64_t h) {
  if (!rows.copied) return;
  for (int64_t i = 0; i < d.length; ++i)
    std::memcpy(x + (b * d.length + i) * d.row_stride() + h * d.head_dim, rows.data + i * d.kp,
                d.head_dim * sizeof(float));
}

// One head's slice transposed, [kp, lp] zero padded, as the B operand of q k^T and d_out v^T:
// in `gemm_panel`'s panels of kPanelCols columns, [kp][kPanelCols] each, the last one narrower if lp
// is not a multiple of kPanelCols.
// Read in blocks of kLanes rows, so that the rows being read stay in L1 while each output row is written.
void gather_transposed(const Dims& d, const float* x, int64_t b, int64_t h, float* out) {
  std::memset(out, 0, d.kp * d.lp * sizeof(float));
  const float* base = x + b * d.length * d.row_stride() + h * d.head_dim;
  for (int64_t i0 = 0; i0 < d.length; i0 += kLanes) {
    const int64_t i1 = std::min(i0 + kLanes, d.length), g0 = i0 / kPanelCols * kPanelCols;
    const int64_t cols = std::min(kPanelCols, d.lp - g0);
    float* panel = out + g0 * d.kp;
    for (int64_t j = 0; j < d.head_dim; ++j)
      for (int64_t i = i0; i < i1; ++i) panel[j * cols + i - g0] = base[i * d.row_stride() + j];
  }
}

// C[m, lp] = A[m, kp] times the panels gather_transposed wrote.
void gemm_transposed_panels(const Dims& d, int64_t m, const float* a, int64_t a_rs, const float* panels, float* c, int64_t ldc) {
  for (int64_t g0 = 0; g0 < d.lp; g0 += kPanelCols)
    gemm_panel(m, d.head_dim, a, a_rs, 1, panels + g0 * d.kp, std::min(kPanelCols, d.lp - g0), c, ldc, g0, false);
}

// logits[i, :] = q_i . k + position_bias[h, i, :] + mask_bias[b, :] in one pass over each row,
// padded columns -inf; row_max[i] = max_j logits[i, j] when row_max is given.
void logits(const Dims& d, const Rows& q, const float* kt_p, const float* position_bias, const float* mask_bias,
            int64_t b, int64_t h, float* s, float* row_max) {
  gemm_transposed_panels(d, d.length, q.data, q.ld, kt_p, s, d.lp);
  const float* mask = mask_bias + b * d.length;
  const int64_t whole = d.length / kLanes * kLanes;
  for (int64_t i = 0; i < d.length; ++i) {
    float* row = s + i * d.lp;
    const float* pos = position_bias ? position_bias + (h * d.length + i) * d.length : nullptr;
    vec mx = splat(-INFINITY);
    for (int64_t j = 0; j < whole; j += kLanes) {
      vec x = load(row + j) + load(mask + j);
      if (pos) x += load(pos + j);
      store(row + j, x);
      mx = x > mx ? x : mx;
    }
    float m = -INFINITY;
    for (int l = 0; l < kLanes; ++l) m = std::max(m, mx[l]);
    for (int64_t j = whole; j < d.length; ++j) {
      row[j] += mask[j] + (pos ? pos[j] : 0.0f);
      m = std::max(m, row[j]);
    }
    for (int64_t j = d.length; j < d.lp; ++j) row[j] = -INFINITY;
    if (row_max) row_max[i] = m;
  }
}

// The (batch row, head) tasks are cut into ranges: range r holds head r / segments and one
// segment of the batch rows, in order. A sum kept per range therefore does not depend on which
// thread ran it, and the position-bias gradient (summed over the batch) is bitwise reproducible.
struct Split {
  int64_t runners, segments, ranges;
  int64_t head(int64_t r) const { return r / segments; }
  int64_t first_row(int64_t r, int64_t batch) const { return (r % segments) * batch / segments; }
  int64_t end_row(int64_t r, int64_t batch) const { return (r % segments + 1) * batch / segments; }
};

int64_t runner_count(ffi::ThreadPool& pool) { return std::max<int64_t>(1, pool.num_threads() + 1); }

Split split_work(ffi::ThreadPool& pool, int64_t batch, int64_t heads) {
  const int64_t runners = runner_count(pool);
  const int64_t segments = std::min(batch, (2 * runners + heads - 1) / heads);  // >= 2 ranges per runner
  return {runners, segments, heads * segments};
}

// fn(range, slot) for every range in [0, ranges), on the caller and on XLA's intra-op thread
// pool (the threads that would otherwise spin idle beside this call); slot < runners names the
// runner's scratch space. Runners claim ranges from a shared counter, so the call completes
// even when no pool thread ever becomes free.
template <typename F>
void parallel_for(ffi::ThreadPool& pool, int64_t runners, int64_t ranges, F fn) {
  struct State {
    std::atomic<int64_t> next_range{0}, done{0}, slots{0};
  };
  auto state = std::make_shared<State>();
  // A runner that starts late finds no range left and returns without touching the caller's stack.
  auto run = [state, ranges, &fn]() {
    int64_t slot = -1;
    for (int64_t r = state->next_range.fetch_add(1); r < ranges; r = state->next_range.fetch_add(1)) {
      if (slot < 0) slot = state->slots.fetch_add(1);
      fn(r, slot);
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t r = 1; r < runners; ++r) pool.Schedule([run]() { run(); });
  run();
  while (state->done.load(std::memory_order_acquire) < ranges) std::this_thread::yield();
}

// Scratch memory that outlives a call, one set per calling thread (the runners of a call share
// their caller's). A fresh allocation of this size per call would be mmapped by glibc and faulted
// in (and zeroed by the kernel) again on every call. Contents are left from the last use.
float* reusable_buffer(int slot, int64_t floats) {
  thread_local std::vector<float> buffers[4];
  std::vector<float>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}

Dims dims_of(const ffi::Buffer<ffi::F32>& q) {
  auto shape = q.dimensions();
  Dims d{shape[0], shape[1], shape[2], shape[3], 0, 0};
  d.lp = round_up(d.length);
  d.kp = round_up(d.head_dim);
  return d;
}

inline float horizontal_sum(vec x) {
  float total = 0.0f;
  for (int l = 0; l < kLanes; ++l) total += x[l];
  return total;
}

ffi::Error AttentionForward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                            ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> position_bias,
                            ffi::Buffer<ffi::F32> mask_bias, ffi::ResultBuffer<ffi::F32> out,
                            ffi::ResultBuffer<ffi::F32> lse) {
  const Dims d = dims_of(q);
  const float* pos = position_bias.element_count() ? position_bias.typed_data() : nullptr;
  const int64_t panel = d.length * d.kp;
  const int64_t per_runner = panel * 3 + d.kp * d.lp + d.length * d.lp + 2 * d.length + kPanelDepth * kPanelCols;
  const Split split = split_work(pool, d.batch, d.heads);
  float* work = reusable_buffer(0, per_runner * split.runners);
  parallel_for(pool, split.runners, split.ranges, [&](int64_t range, int64_t slot) {
    float* q_p = work + slot * per_runner;
    float* v_p = q_p + panel;
    float* o_p = v_p + panel;
    float* kt_p = o_p + panel;
    float* s = kt_p + d.kp * d.lp;
    float* row_max = s + d.length * d.lp;
    float* row_sum = row_max + d.length;
    float* b_panel = row_sum + d.length;
    const int64_t h = split.head(range);
    for (int64_t b = split.first_row(range, d.batch); b < split.end_row(range, d.batch); ++b) {
      const Rows q_rows = head_rows(d, q.typed_data(), b, h, q_p);
      const Rows v_rows = head_rows(d, v.typed_data(), b, h, v_p);
      gather_transposed(d, k.typed_data(), b, h, kt_p);
      logits(d, q_rows, kt_p, pos, mask_bias.typed_data(), b, h, s, row_max);
      float* lse_row = lse->typed_data() + (b * d.heads + h) * d.length;
      for (int64_t i = 0; i < d.length; ++i) {
        float* row = s + i * d.lp;
        vec sum{};
        for (int64_t j = 0; j < d.lp; j += kLanes) {
          const vec e = vexp(load(row + j) - row_max[i]);
          store(row + j, e);
          sum += e;
        }
        row_sum[i] = horizontal_sum(sum);
        lse_row[i] = row_max[i] + std::log(row_sum[i]);
      }
      // out = (exp(logits - max) v) / row sums: the division touches [L, K], not [L, L].
      const Rows o_rows = output_rows(d, out->typed_data(), b, h, o_p);
      gemm(d.length, d.length, d.kp, s, d.lp, 1, v_rows.data, v_rows.ld, o_rows.data, o_rows.ld, b_panel);
      for (int64_t i = 0; i < d.length; ++i) {
        const float inv = 1.0f / row_sum[i];
        for (int64_t c = 0; c < d.head_dim; ++c) o_rows.data[i * o_rows.ld + c] *= inv;
      }
      put_rows(d, o_rows, out->typed_data(), b, h);
    }
  });
  return ffi::Error::Success();
}

ffi::Error AttentionBackward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                             ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> position_bias,
                             ffi::Buffer<ffi::F32> mask_bias, ffi::Buffer<ffi::F32> out, ffi::Buffer<ffi::F32> lse,
                             ffi::Buffer<ffi::F32> d_out, ffi::ResultBuffer<ffi::F32> d_q,
                             ffi::ResultBuffer<ffi::F32> d_k, ffi::ResultBuffer<ffi::F32> d_v,
                             ffi::ResultBuffer<ffi::F32> d_position_bias) {
  const Dims d = dims_of(q);
  const bool with_pos = position_bias.element_count() > 0;
  const float* pos = with_pos ? position_bias.typed_data() : nullptr;
  const int64_t panel = d.length * d.kp, square = d.length * d.lp, square_size = d.length * d.length;
  const int64_t per_runner = panel * 7 + d.kp * d.lp * 2 + square * 2 + kPanelDepth * kPanelCols;
  const Split split = split_work(pool, d.batch, d.heads);
  float* work = reusable_buffer(0, per_runner * split.runners);
  // One [L, L] sum over its batch rows per range; the ranges of a head are added in order.
  const int64_t bias_floats = with_pos ? split.ranges * square_size : 0;
  float* bias_grads = reusable_buffer(1, bias_floats);
  std::fill(bias_grads, bias_grads + bias_floats, 0.0f);
  parallel_for(pool, split.runners, split.ranges, [&](int64_t range, int64_t slot) {
    float* q_p = work + slot * per_runner;
    float* k_p = q_p + panel;
    float* o_p = k_p + panel;
    float* do_p = o_p + panel;
    float* dq_p = do_p + panel;
    float* dk_p = dq_p + panel;
    float* dv_p = dk_p + panel;
    float* kt_p = dv_p + panel;
    float* vt_p = kt_p + d.kp * d.lp;
    float* p = vt_p + d.kp * d.lp;
    float* ds = p + square;
    float* b_panel = ds + square;
    const int64_t h = split.head(range);
    for (int64_t b = split.first_row(range, d.batch); b < split.end_row(range, d.batch); ++b) {
      const Rows q_rows = head_rows(d, q.typed_data(), b, h, q_p);
      const Rows k_rows = head_rows(d, k.typed_data(), b, h, k_p);
      const Rows o_rows = head_rows(d, out.typed_data(), b, h, o_p);
      const Rows do_rows = head_rows(d, d_out.typed_data(), b, h, do_p);
      gather_transposed(d, k.typed_data(), b, h, kt_p);
      gather_transposed(d, v.typed_data(), b, h, vt_p);
      logits(d, q_rows, kt_p, pos, mask_bias.typed_data(), b, h, p, nullptr);
      // d_weights = d_out v^T
      gemm_transposed_panels(d, d.length, do_rows.data, do_rows.ld, vt_p, ds, d.lp);
      const float* lse_row = lse.typed_data() + (b * d.heads + h) * d.length;
      float* bias_acc = with_pos ? bias_grads + range * square_size : nullptr;
      for (int64_t i = 0; i < d.length; ++i) {
        // sum_j weights_ij d_weights_ij = d_out_i . out_i
        float dot = 0.0f;
        for (int64_t c = 0; c < d.head_dim; ++c) dot += do_rows.data[i * do_rows.ld + c] * o_rows.data[i * o_rows.ld + c];
        float* p_row = p + i * d.lp;
        float* ds_row = ds + i * d.lp;
        for (int64_t j = 0; j < d.lp; j += kLanes) {
          const vec weights = vexp(load(p_row + j) - lse_row[i]);
          store(p_row + j, weights);
          store(ds_row + j, weights * (load(ds_row + j) - dot));
        }
        if (bias_acc) {
          float* acc_row = bias_acc + i * d.length;
          for (int64_t j = 0; j < d.length; ++j) acc_row[j] += ds_row[j];
        }
      }
      const Rows dq_rows = output_rows(d, d_q->typed_data(), b, h, dq_p);
      gemm(d.length, d.length, d.kp, ds, d.lp, 1, k_rows.data, k_rows.ld, dq_rows.data, dq_rows.ld, b_panel);
      put_rows(d, dq_rows, d_q->typed_data(), b, h);
      const Rows dk_rows = output_rows(d, d_k->typed_data(), b, h, dk_p);  // ds^T q
      gemm(d.length, d.length, d.kp, ds, 1, d.lp, q_rows.data, q_rows.ld, dk_rows.data, dk_rows.ld, b_panel);
      put_rows(d, dk_rows, d_k->typed_data(), b, h);
      const Rows dv_rows = output_rows(d, d_v->typed_data(), b, h, dv_p);  // weights^T d_out
      gemm(d.length, d.length, d.kp, p, 1, d.lp, do_rows.data, do_rows.ld, dv_rows.data, dv_rows.ld, b_panel);
      put_rows(d, dv_rows, d_v->typed_data(), b, h);
    }
  });
  if (with_pos) {
    float* dst = d_position_bias->typed_data();
    std::memset(dst, 0, d.heads * square_size * sizeof(float));
    for (int64_t r = 0; r < split.ranges; ++r) {
      float* head_dst = dst + split.head(r) * square_size;
      const float* src = bias_grads + r * square_size;
      for (int64_t i = 0; i < square_size; ++i) head_dst[i] += src[i];
    }
  }
  return ffi::Error::Success();
}

// Gated GELU, tanh form (T5 1.1, HF "gelu_new"): h = gelu(gate) * linear with
// gelu(x) = x / 2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). Written with
// s = (1 + tanh(u)) / 2 = 1 / (1 + exp(-2u)), which has no cancellation where tanh(u) is
// near -1: gelu(x) = x s and gelu'(x) = s + 2 x s (1 - s) du/dx. One pass over the elements
// each way; the backward pass recomputes s instead of storing it.
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;
constexpr int64_t kGeluChunk = 64 * 1024;  // elements per range: a few hundred KB per array

inline vec gelu_sigmoid(vec x) {
  const vec minus_two_u = -2.0f * kGeluScale * (x + kGeluCubic * x * x * x);
  const vec clamped = minus_two_u > 80.0f ? splat(80.0f) : (minus_two_u < -80.0f ? splat(-80.0f) : minus_two_u);
  return splat(1.0f) / (vexp(clamped) + 1.0f);
}

inline float gelu_sigmoid(float x) {
  const float minus_two_u = std::clamp(-2.0f * kGeluScale * (x + kGeluCubic * x * x * x), -80.0f, 80.0f);
  return 1.0f / (std::exp(minus_two_u) + 1.0f);
}

// d gelu / dx from x and s = gelu_sigmoid(x).
template <typename T>
inline T gelu_slope(T x, T s) {
  return s + 2.0f * x * s * (1.0f - s) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

// fn(begin, end) over [0, n) in chunks, on the caller and XLA's pool; scalar tail included.
template <typename F>
void parallel_elements(ffi::ThreadPool& pool, int64_t n, F fn) {
  const int64_t ranges = (n + kGeluChunk - 1) / kGeluChunk;
  parallel_for(pool, std::min(runner_count(pool), ranges), ranges, [&](int64_t range, int64_t) {
    fn(range * kGeluChunk, std::min(n, (range + 1) * kGeluChunk));
  });
}

// h = gelu(g) * l over elements [begin, end).
void gated_gelu_span(const float* g, const float* l, float* h, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    const vec x = load(g + i);
    store(h + i, x * gelu_sigmoid(x) * load(l + i));
  }
  for (; i < end; ++i) h[i] = g[i] * gelu_sigmoid(g[i]) * l[i];
}

// dg, dl of h = gelu(g) * l over elements [begin, end); dh holds elements begin..end (dh[0] is element begin).
void gated_gelu_grad_span(const float* g, const float* l, const float* dh, float* dg, float* dl, int64_t begin,
                          int64_t end) {
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    const vec x = load(g + i);
    const vec s = gelu_sigmoid(x);
    const vec d = load(dh + i - begin);
    store(dg + i, d * load(l + i) * gelu_slope(x, s));
    store(dl + i, d * x * s);
  }
  for (; i < end; ++i) {
    const float s = gelu_sigmoid(g[i]);
    dg[i] = dh[i - begin] * l[i] * gelu_slope(g[i], s);
    dl[i] = dh[i - begin] * g[i] * s;
  }
}

ffi::Error GatedGeluForward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> gate, ffi::Buffer<ffi::F32> linear,
                            ffi::ResultBuffer<ffi::F32> out) {
  parallel_elements(pool, gate.element_count(), [&](int64_t begin, int64_t end) {
    gated_gelu_span(gate.typed_data(), linear.typed_data(), out->typed_data(), begin, end);
  });
  return ffi::Error::Success();
}

ffi::Error GatedGeluBackward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> gate, ffi::Buffer<ffi::F32> linear,
                             ffi::Buffer<ffi::F32> d_out, ffi::ResultBuffer<ffi::F32> d_gate,
                             ffi::ResultBuffer<ffi::F32> d_linear) {
  parallel_elements(pool, gate.element_count(), [&](int64_t begin, int64_t end) {
    gated_gelu_grad_span(gate.typed_data(), linear.typed_data(), d_out.typed_data() + begin, d_gate->typed_data(),
                         d_linear->typed_data(), begin, end);
  });
  return ffi::Error::Success();
}

// T5's RMS norm, y = x r scale with r = 1 / sqrt(mean(x^2) + eps) per row of D features
// (float32, as the model computes it). x, y, d_x, d_y: [T, D]; scale, d_scale: [D];
// inv_rms: [T], r saved by the forward pass; eps: a [1] buffer. With g = scale d_y:
//   d_x = r g - x r^3 (g . x) / D,   d_scale = sum over rows of d_y x r.
// XLA:CPU splits the row reduction into a reduce-window and a reduce and makes several
// passes over [T, D]; here each row is read once forward and once backward. Rows go in
// fixed ranges whose d_scale partial sums are added in range order: reproducible bits.
constexpr int64_t kNormChunk = 32 * 1024;  // elements per range

inline int64_t norm_rows_per_range(int64_t features) { return std::max<int64_t>(1, kNormChunk / std::max<int64_t>(features, 1)); }

// sum of a[i] * b[i] over n floats (vector lanes, then the scalar tail).
inline float dot_row(const float* a, const float* b, int64_t n) {
  vec acc{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc += load(a + i) * load(b + i);
  float total = horizontal_sum(acc);
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

ffi::Error RmsNormForward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> scale,
                          ffi::Buffer<ffi::F32> eps, ffi::ResultBuffer<ffi::F32> y,
                          ffi::ResultBuffer<ffi::F32> inv_rms) {
  const int64_t features = scale.element_count();
  const int64_t rows = features ? x.element_count() / features : 0;
  const int64_t per_range = norm_rows_per_range(features);
  const int64_t ranges = (rows + per_range - 1) / per_range;
  const float epsilon = eps.typed_data()[0];
  const float* s = scale.typed_data();
  parallel_for(pool, std::min(runner_count(pool), ranges), ranges, [&](int64_t range, int64_t) {
    for (int64_t t = range * per_range; t < std::min(rows, (range + 1) * per_range); ++t) {
      const float* xr = x.typed_data() + t * features;
      float* yr = y->typed_data() + t * features;
      const float r = 1.0f / std::sqrt(dot_row(xr, xr, features) / features + epsilon);
      inv_rms->typed_data()[t] = r;
      int64_t i = 0;
      for (; i + kLanes <= features; i += kLanes) store(yr + i, load(xr + i) * r * load(s + i));
      for (; i < features; ++i) yr[i] = xr[i] * r * s[i];
    }
  });
  return ffi::Error::Success();
}

ffi::Error RmsNormBackward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> scale,
                           ffi::Buffer<ffi::F32> inv_rms, ffi::Buffer<ffi::F32> d_y,
                           ffi::ResultBuffer<ffi::F32> d_x, ffi::ResultBuffer<ffi::F32> d_scale) {
  const int64_t features = scale.element_count();
  const int64_t rows = features ? x.element_count() / features : 0;
  const int64_t per_range = norm_rows_per_range(features);
  const int64_t ranges = (rows + per_range - 1) / per_range;
  const float* s = scale.typed_data();
  std::vector<float> partial(ranges * features, 0.0f);
  parallel_for(pool, std::min(runner_count(pool), ranges), ranges, [&](int64_t range, int64_t) {
    float* ds = partial.data() + range * features;
    for (int64_t t = range * per_range; t < std::min(rows, (range + 1) * per_range); ++t) {
      const float* xr = x.typed_data() + t * features;
      const float* dyr = d_y.typed_data() + t * features;
      float* dxr = d_x->typed_data() + t * features;
      const float r = inv_rms.typed_data()[t];
      vec acc{};
      int64_t i = 0;
      for (; i + kLanes <= features; i += kLanes) acc += load(s + i) * load(dyr + i) * load(xr + i);
      float g_dot_x = horizontal_sum(acc);
      for (; i < features; ++i) g_dot_x += s[i] * dyr[i] * xr[i];
      const float coef = r * r * r * g_dot_x / features;
      for (i = 0; i + kLanes <= features; i += kLanes) {
        const vec xv = load(xr + i), dyv = load(dyr + i);
        store(dxr + i, r * load(s + i) * dyv - coef * xv);
        store(ds + i, load(ds + i) + dyv * xv * r);
      }
      for (; i < features; ++i) {
        dxr[i] = r * s[i] * dyr[i] - coef * xr[i];
        ds[i] += dyr[i] * xr[i] * r;
      }
    }
  });
  float* ds = d_scale->typed_data();
  std::fill(ds, ds + features, 0.0f);
  for (int64_t range = 0; range < ranges; ++range)
    for (int64_t i = 0; i < features; ++i) ds[i] += partial[range * features + i];
  return ffi::Error::Success();
}

// The dense layers' products with a [K, N] weight: y = x w (forward) and d_x = d_y w^T
// (backward), a[T, K] times the weight or its transpose, T the tokens. The weight is packed
// once per call into panels of kPanelDepth x kPanelCols columns (contiguous, zero padded), each of
// which stays in L1 while `gemm_block` runs it against the rows of one task: a's rows are
// read in place, six at a time, so only the small operand is copied. Tasks are blocks of
// kMatmulRows rows; each output row is summed by one task in a fixed order (K in blocks of
// kPanelDepth, each block's sum added to the row), so the bits do not depend on the threads.
constexpr int64_t kMatmulRows = 96;

// Rows [p, p + depth) and column group g (kPanelCols wide) of b [k, n] (or of w^T when `transposed`,
// w being [n, k]) -> out [depth][kPanelCols], zero padded past column n.
void pack_panel(const float* b, int64_t k, int64_t n, int64_t p, int64_t depth, int64_t g, bool transposed, float* out) {
  const int64_t c0 = g * kPanelCols, cols = std::min(kPanelCols, n - c0);
  for (int64_t t = 0; t < depth; ++t) {
    float* row = out + t * kPanelCols;
    if (transposed)
      for (int64_t j = 0; j < cols; ++j) row[j] = b[(c0 + j) * k + p + t];
    else
      std::memcpy(row, b + (p + t) * n + c0, cols * sizeof(float));
    std::fill(row + cols, row + kPanelCols, 0.0f);
  }
}

struct PackedWeight {
  int64_t k, n, n_padded;
  float* panels;  // block p (rows p..p+depth of K), column group g: [depth][kPanelCols] at p * n_padded + g * depth * kPanelCols

  // w is [k, n], or [n, k] holding the transpose when `transposed`; packed into reusable_buffer(slot).
  PackedWeight(ffi::ThreadPool& pool, const float* w, int64_t k_, int64_t n_, bool transposed, int slot = 0)
      : k(k_), n(n_), n_padded((n_ + kPanelCols - 1) / kPanelCols * kPanelCols),
        panels(reusable_buffer(slot, k_ * n_padded)) {
    const int64_t groups = n_padded / kPanelCols, blocks = (k + kPanelDepth - 1) / kPanelDepth;
    parallel_for(pool, std::min(runner_count(pool), blocks * groups), blocks * groups, [&](int64_t task, int64_t) {
      const int64_t p = (task / groups) * kPanelDepth, g = task % groups;
      pack_panel(w, k, n, p, std::min(kPanelDepth, k - p), g, transposed, panel(p, g));
    });
  }
  float* panel(int64_t p, int64_t g) { return panels + p * n_padded + g * std::min(kPanelDepth, k - p) * kPanelCols; }
};

// c[rows, n] = a[rows, k] (row stride k) times the packed weight; `edge` holds rows x kPanelCols floats.
void matmul_rows(int64_t rows, const float* a, PackedWeight& w, float* c, float* edge) {
  for (int64_t p = 0; p < w.k; p += kPanelDepth) {
    const int64_t depth = std::min(kPanelDepth, w.k - p);
    for (int64_t c0 = 0; c0 < w.n; c0 += kPanelCols) {
      const float* panel = w.panel(p, c0 / kPanelCols);
      if (c0 + kPanelCols <= w.n)
        gemm_panel(rows, depth, a + p, w.k, 1, panel, kPanelCols, c, w.n, c0, p > 0);
      else  // the last, partial column group: summed in `edge`, copied out after the last block
        gemm_panel(rows, depth, a + p, w.k, 1, panel, kPanelCols, edge, kPanelCols, 0, p > 0);
    }
  }
  const int64_t c0 = w.n / kPanelCols * kPanelCols;
  if (c0 < w.n)
    for (int64_t r = 0; r < rows; ++r) std::memcpy(c + r * w.n + c0, edge + r * kPanelCols, (w.n - c0) * sizeof(float));
}

ffi::Error Matmul(ffi::ThreadPool& pool, const ffi::Buffer<ffi::F32>& a, const ffi::Buffer<ffi::F32>& w,
                  ffi::ResultBuffer<ffi::F32>& c, bool transposed) {
  auto w_shape = w.dimensions();
  const int64_t k = transposed ? w_shape[1] : w_shape[0], n = transposed ? w_shape[0] : w_shape[1];
  const int64_t tokens = k == 0 ? 0 : a.element_count() / k;
  float* out = c->typed_data();
  if (k == 0) std::fill(out, out + c->element_count(), 0.0f);
  if (tokens == 0 || k == 0 || n == 0) return ffi::Error::Success();
  PackedWeight packed(pool, w.typed_data(), k, n, transposed);
  const int64_t tasks = (tokens + kMatmulRows - 1) / kMatmulRows, runners = std::min(runner_count(pool), tasks);
  float* edge = reusable_buffer(1, runners * kMatmulRows * kPanelCols);
  parallel_for(pool, runners, tasks, [&](int64_t task, int64_t slot) {
    const int64_t r0 = task * kMatmulRows, rows = std::min(kMatmulRows, tokens - r0);
    matmul_rows(rows, a.typed_data() + r0 * k, packed, out + r0 * n, edge + slot * kMatmulRows * kPanelCols);
  });
  return ffi::Error::Success();
}

// T5 1.1's gated-GELU MLP input side, y = gelu(x w0) * (x w1), with both products and the GELU
// in one pass: a task computes its rows of gate = x w0 and linear = x w1 (as `Matmul` does, the
// same bits) and applies the GELU to them while they are still in L2, instead of a separate
// pass re-reading both from memory. gate and linear are outputs too: the backward pass needs them.
ffi::Error GatedGeluDense(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w0,
                          ffi::Buffer<ffi::F32> w1, ffi::ResultBuffer<ffi::F32> gate,
                          ffi::ResultBuffer<ffi::F32> linear, ffi::ResultBuffer<ffi::F32> out) {
  const int64_t k = w0.dimensions()[0], n = w0.dimensions()[1];
  const int64_t tokens = k == 0 ? 0 : x.element_count() / k;
  if (k == 0)
    for (auto* result : {&gate, &linear, &out}) std::fill((*result)->typed_data(), (*result)->typed_data() + (*result)->element_count(), 0.0f);
  if (tokens == 0 || k == 0 || n == 0) return ffi::Error::Success();
  PackedWeight packed_w0(pool, w0.typed_data(), k, n, false, 0), packed_w1(pool, w1.typed_data(), k, n, false, 2);
  const int64_t tasks = (tokens + kMatmulRows - 1) / kMatmulRows, runners = std::min(runner_count(pool), tasks);
  float* edge = reusable_buffer(1, runners * kMatmulRows * kPanelCols);
  parallel_for(pool, runners, tasks, [&](int64_t task, int64_t slot) {
    const int64_t r0 = task * kMatmulRows, rows = std::min(kMatmulRows, tokens - r0);
    const float* a = x.typed_data() + r0 * k;
    float* g = gate->typed_data() + r0 * n;
    float* l = linear->typed_data() + r0 * n;
    matmul_rows(rows, a, packed_w0, g, edge + slot * kMatmulRows * kPanelCols);
    matmul_rows(rows, a, packed_w1, l, edge + slot * kMatmulRows * kPanelCols);
    gated_gelu_span(g, l, out->typed_data() + r0 * n, 0, rows * n);
  });
  return ffi::Error::Success();
}

// Its backward pass up to the products with w0 and w1: d_h = d_y wo^T (wo [F, E], d_y [T, E])
// one task's rows at a time into scratch that stays in L2, then the GELU's backward pass over
// those rows. d_h never goes to memory; d_gate and d_linear have the bits of `Matmul` then
// GatedGeluBackward.
ffi::Error GatedGeluDenseBackward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> d_y, ffi::Buffer<ffi::F32> wo,
                                  ffi::Buffer<ffi::F32> gate, ffi::Buffer<ffi::F32> linear,
                                  ffi::ResultBuffer<ffi::F32> d_gate, ffi::ResultBuffer<ffi::F32> d_linear) {
  const int64_t f = wo.dimensions()[0], e = wo.dimensions()[1];
  if (f == 0 || e == 0) {  // nothing to compute, or d_h = 0
    for (auto* result : {&d_gate, &d_linear})
      std::fill((*result)->typed_data(), (*result)->typed_data() + (*result)->element_count(), 0.0f);
    return ffi::Error::Success();
  }
  const int64_t tokens = gate.element_count() / f;
  if (tokens == 0) return ffi::Error::Success();
  PackedWeight packed(pool, wo.typed_data(), e, f, true, 0);
  const int64_t tasks = (tokens + kMatmulRows - 1) / kMatmulRows, runners = std::min(runner_count(pool), tasks);
  float* scratch = reusable_buffer(1, runners * kMatmulRows * (kPanelCols + f));
  parallel_for(pool, runners, tasks, [&](int64_t task, int64_t slot) {
    const int64_t r0 = task * kMatmulRows, rows = std::min(kMatmulRows, tokens - r0);
    float* edge = scratch + slot * kMatmulRows * (kPanelCols + f);
    float* d_h_rows = edge + kMatmulRows * kPanelCols;
    matmul_rows(rows, d_y.typed_data() + r0 * e, packed, d_h_rows, edge);
    gated_gelu_grad_span(gate.typed_data(), linear.typed_data(), d_h_rows, d_gate->typed_data(), d_linear->typed_data(),
                         r0 * f, (r0 + rows) * f);
  });
  return ffi::Error::Success();
}

ffi::Error MatmulWeight(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> c) {
  return Matmul(pool, a, w, c, false);
}

ffi::Error MatmulWeightTransposed(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> w,
                                  ffi::ResultBuffer<ffi::F32> c) {
  return Matmul(pool, a, w, c, true);
}

// The weight gradient of a dense layer y = x w: d_w[M, N] = x[T, M]^T d_y[T, N], T the
// tokens. The tokens are cut into splits (enough for two per runner, at least
// kWgradMinSplit rows each); a task sums its split into a whole [M, N] partial, walking it
// in blocks of kPanelDepth tokens. Both operands of a block are packed: x^T into strips of
// six d_w rows ([depth][6] each, read by `gemm_block`'s six broadcasts), d_y into kPanelCols-column
// panels. Read in place, x's rows (M floats apart) would fall into a few cache sets. Partials
// are added in split order: the summation order depends only on the shapes and the pool's
// size, so the bits are reproducible.
constexpr int64_t kWgradMinSplit = 1024;
constexpr int64_t kStripRows = 6;

struct WeightGradientPlan {
  const float* x;
  const float* d_y;
  float* d_w;
  int64_t m, n, k, m_padded, n_padded, splits;
  float* partial;  // [splits - 1, m, n]: split 0 is summed in d_w itself

  WeightGradientPlan(const float* x_, const float* d_y_, float* d_w_, int64_t m_, int64_t n_, int64_t k_, int64_t runners)
      : x(x_), d_y(d_y_), d_w(d_w_), m(m_), n(n_), k(k_),
        m_padded((m_ + kStripRows - 1) / kStripRows * kStripRows), n_padded((n_ + kPanelCols - 1) / kPanelCols * kPanelCols) {
    splits = std::max<int64_t>(1, std::min(2 * runners, k / kWgradMinSplit));
    partial = reusable_buffer(0, (splits - 1) * m * n);
  }
  int64_t scratch_floats() const { return kPanelDepth * (n_padded + m_padded) + m * kPanelCols; }

  void run_split(int64_t split, float* scratch) {
    float* panels = scratch;
    float* strips = panels + kPanelDepth * n_padded;
    float* edge = strips + kPanelDepth * m_padded;  // the partial last column group, [m][kPanelCols]
    float* out = split == 0 ? d_w : partial + (split - 1) * m * n;
    const int64_t k_begin = split * k / splits, k_end = (split + 1) * k / splits, groups = n_padded / kPanelCols;
    if (k_begin == k_end) std::fill(out, out + m * n, 0.0f);
    for (int64_t p = k_begin; p < k_end; p += kPanelDepth) {
      const int64_t depth = std::min(kPanelDepth, k_end - p);
      const int64_t whole = m / kStripRows * kStripRows;
      for (int64_t t = 0; t < depth; ++t) {
        const float* row = x + (p + t) * m;
        for (int64_t r0 = 0; r0 < whole; r0 += kStripRows)
          std::memcpy(strips + r0 * depth + t * kStripRows, row + r0, kStripRows * sizeof(float));
        if (whole < m) {
          float* dst = strips + whole * depth + t * kStripRows;
          for (int64_t i = 0; i < kStripRows; ++i) dst[i] = whole + i < m ? row[whole + i] : 0.0f;
        }
      }
      for (int64_t g = 0; g < groups; ++g) {
        float* panel = panels + g * depth * kPanelCols;
        pack_panel(d_y, k, n, p, depth, g, false, panel);
        const bool full = (g + 1) * kPanelCols <= n;
        float* c = full ? out + g * kPanelCols : edge;
        const int64_t ldc = full ? n : kPanelCols;
        for (int64_t r0 = 0; r0 < m; r0 += kStripRows)
          gemm_panel(std::min(kStripRows, m - r0), depth, strips + r0 * depth, 1, kStripRows, panel, kPanelCols,
                     c + r0 * ldc, ldc, 0, p > k_begin);
      }
    }
    const int64_t c0 = n / kPanelCols * kPanelCols;
    if (c0 < n && k_begin < k_end)
      for (int64_t r = 0; r < m; ++r) std::memcpy(out + r * n + c0, edge + r * kPanelCols, (n - c0) * sizeof(float));
  }

  // d_w[begin:end] (flat) += the other splits' partial sums, in split order.
  void add_splits(int64_t begin, int64_t end) {
    const int64_t total = m * n;
    for (int64_t sp = 1; sp < splits; ++sp)
      for (int64_t i = begin; i < end; ++i) d_w[i] += partial[(sp - 1) * total + i];
  }
};

ffi::Error WeightGradient(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> d_y,
                          ffi::ResultBuffer<ffi::F32> d_w) {
  auto dw_shape = d_w->dimensions();
  const int64_t m = dw_shape[0], n = dw_shape[1];
  if (m == 0 || n == 0) return ffi::Error::Success();
  const int64_t runners = runner_count(pool);
  WeightGradientPlan plan(x.typed_data(), d_y.typed_data(), d_w->typed_data(), m, n, x.element_count() / m, runners);
  const int64_t active = std::min(runners, plan.splits);
  float* scratch = reusable_buffer(1, plan.scratch_floats() * active);
  parallel_for(pool, active, plan.splits, [&](int64_t split, int64_t slot) {
    plan.run_split(split, scratch + slot * plan.scratch_floats());
  });
  if (plan.splits > 1) {
    const int64_t total = m * n, chunks = std::min(runners, (total + kLanes - 1) / kLanes);
    parallel_for(pool, chunks, chunks, [&](int64_t chunk, int64_t) {
      plan.add_splits(chunk * total / chunks, (chunk + 1) * total / chunks);
    });
  }
  return ffi::Error::Success();
}

}  // namespace

// The handlers' bindings are inferred from their signatures; the thread pool needs saying.
template <>
struct xla::ffi::CtxBinding<xla::ffi::ThreadPool> {
  using Ctx = xla::ffi::ThreadPool;
};

// Floats per vector in this build, which must match the machine's widest registers (tests check).
extern "C" int RankgenVectorLanes() { return kLanes; }

XLA_FFI_DEFINE_HANDLER_SYMBOL(RankgenAttentionForward, AttentionForward);
XLA_FFI_DEFINE_HANDLER_SYMBOL(RankgenAttentionBackward, AttentionBackward);
XLA_FFI_DEFINE_HANDLER_SYMBOL(RankgenGatedGeluForward, GatedGeluForward);
XLA_FFI_DEFINE_HANDLER_SYMBOL(RankgenGatedGeluBackward, GatedGeluBackward);
XLA_FFI_DEFINE_HANDLER_SYMBOL(RankgenRmsNormForward, RmsNormForward);
XLA_FFI_DEFINE_HANDLER_SYMBOL(RankgenRmsNormBackward, RmsNormBackward);
XLA_FFI_DEFINE_HANDLER_SYMBOL(RankgenWeightGradient, WeightGradient);
XLA_FFI_DEFINE_HANDLER_SYMBOL(RankgenMatmul, MatmulWeight);
XLA_FFI_DEFINE_HANDLER_SYMBOL(RankgenMatmulTransposed, MatmulWeightTransposed);
XLA_FFI_DEFINE_HANDLER_SYMBOL(RankgenGatedGeluDense, GatedGeluDense);
XLA_FFI_DEFINE_HANDLER_SYMBOL(RankgenGatedGeluDenseBackward, GatedGeluDenseBackward);
