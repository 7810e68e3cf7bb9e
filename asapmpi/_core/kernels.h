/* asapmpi core kernels: plain C so that the compiler vectorizes them.
 *
 * - the fused weighted reduce out = w0*own + sum_i w_i*in_i, blocked so that each block
 *   of `out` stays in L1 while every input streams through once, up to four inputs
 *   folded per pass in registers, vectorized for the widest unit the CPU has;
 * - a lane-parallel Fletcher-64 checksum over mixed words (position sensitive,
 *   vectorizable), computed from the very bytes the reduce sums;
 * - atomic loads and fences for polling words that other ranks write;
 * - the polling backoff (yield, then sleep with exponential growth).
 *
 * Floating point order is fixed: out = w0*own; then out += w_i*in_i for i = 0..n-1,
 * each product rounded before the add (compile with -ffp-contract=off), which is exactly
 * what NumPy computes for `w0*own + w1*in1 + ...`.
 */
#ifndef ASAPMPI_KERNELS_H
#define ASAPMPI_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define ASAP_BLOCK_BYTES 16384
/* copies at least this large bypass the caches (see asap_copy_out) */
#define ASAP_STREAM_MIN_BYTES (8 << 20)
#define ASAP_CKSUM_LANES 4
/* blocks of the checksummed reduce: four copies of one fit in L1 (a multiple of the
 * checksum's 32-byte lane width, so blocks split the checksum where one pass would) */
#define ASAP_CHECKED_BLOCK_BYTES 4096

/* ---------- atomics on words other ranks write ---------- */

static inline int64_t asap_load_i64(const void *p) {
  return __atomic_load_n((const int64_t *)p, __ATOMIC_ACQUIRE);
}

static inline void asap_store_i64(void *p, int64_t v) {
  __atomic_store_n((int64_t *)p, v, __ATOMIC_RELEASE);
}

static inline void asap_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* The compiler may not move memory accesses across this, nor reuse a value loaded
 * before it: what was copied before is read from the copy after. */
static inline void asap_compiler_barrier(void) { __asm__ __volatile__("" ::: "memory"); }

/* ---------- copying an update out for other ranks ---------- */

#if defined(__SSE2__)
/* dst = src with non-temporal stores (dst 16-byte aligned), no fence: the caller fences
 * once after its last piece. */
static inline void asap_stream(void *dst, const void *src, size_t n) {
  __m128i *d = (__m128i *)dst;
  const __m128i *s = (const __m128i *)src;
  size_t v = n / 16, i = 0;
  for (; i + 4 <= v; i += 4) {
    __m128i a = _mm_loadu_si128(s + i), b = _mm_loadu_si128(s + i + 1);
    __m128i c = _mm_loadu_si128(s + i + 2), e = _mm_loadu_si128(s + i + 3);
    _mm_stream_si128(d + i, a);
    _mm_stream_si128(d + i + 1, b);
    _mm_stream_si128(d + i + 2, c);
    _mm_stream_si128(d + i + 3, e);
  }
  for (; i < v; i++) _mm_stream_si128(d + i, _mm_loadu_si128(s + i));
  memcpy((char *)dst + 16 * v, (const char *)src + 16 * v, n - 16 * v);
}
#define ASAP_CAN_STREAM(dst, n) ((n) >= ASAP_STREAM_MIN_BYTES && ((uintptr_t)(dst) & 15) == 0)
#else
#define ASAP_CAN_STREAM(dst, n) 0
static inline void asap_stream(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif

/* dst = src, n bytes, for a payload that other ranks (other cores) read next: a large
 * copy streams past the caches (non-temporal stores: no read-for-ownership of dst, no
 * eviction of the writer's working set), a small one stays in cache where the readers
 * find it.  Ends with a store fence: the stores are globally visible before any later
 * store (the footer, the notify). */
static inline void asap_copy_out(void *dst, const void *src, size_t n) {
  if (ASAP_CAN_STREAM(dst, n)) {
    asap_stream(dst, src, n);
#if defined(__SSE2__)
    _mm_sfence();
#endif
    return;
  }
  memcpy(dst, src, n);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}

/* ---------- time and backoff ---------- */

static inline double asap_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sleep `us` microseconds.  Linux lets a sleep overrun by the thread's timer slack, 50 us
 * by default, so a sleep of 1 us takes 50-70 us: slack_ns > 0 sets the slack for this
 * sleep only (restored after it, so the caller's own sleeps keep theirs). */
static inline void asap_sleep_us(long us, long slack_ns) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
#if defined(__linux__) && defined(PR_SET_TIMERSLACK)
  if (slack_ns > 0) {
    long old = (long)prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (old > 0 && old != slack_ns) {
      prctl(PR_SET_TIMERSLACK, (unsigned long)slack_ns, 0, 0, 0);
      nanosleep(&ts, NULL);
      prctl(PR_SET_TIMERSLACK, (unsigned long)old, 0, 0, 0);
      return;
    }
  }
#endif
  nanosleep(&ts, NULL);
}

/* Back off after `polls` unsuccessful polls: yield for the first `yield_polls`, then
 * sleep 1us, 2us, 4us ... up to max_sleep_us, with timer slack slack_ns (0: the
 * thread's own).  Ranks are oversubscribed on small hosts, so a waiter must give its
 * core to the writer it is waiting for; where every rank has its own core, a precise
 * slack keeps a sleep from outlasting the wait (asapmpi.cores). */
static inline void asap_backoff(long polls, long yield_polls, long max_sleep_us,
                                long slack_ns) {
  if (polls < yield_polls) {
    sched_yield();
    return;
  }
  long shift = (polls - yield_polls) / 8;
  long us = shift >= 20 ? max_sleep_us : (1L << shift);
  if (us > max_sleep_us) us = max_sleep_us;
  if (us <= 0) {
    sched_yield();
    return;
  }
  asap_sleep_us(us, slack_ns);
}

/* ---------- checksum ---------- */

typedef struct {
  uint64_t a[ASAP_CKSUM_LANES];
  uint64_t b[ASAP_CKSUM_LANES];
} asap_cksum_t;

static inline void asap_cksum_init(asap_cksum_t *c) { memset(c, 0, sizeof(*c)); }

/* A 64-bit word that may sit at any address (a float32 buffer need not be 8-aligned). */
typedef uint64_t asap_u64_any __attribute__((aligned(1), may_alias));

/* A word as the checksum adds it: xor-shifted, so that its high bits reach its low ones,
 * then multiplied by an odd constant (a bijection).  Sums modulo 2^64 drop the top bits
 * of 2^m equal terms; floating-point words carry their information there (0.0 and 0.5
 * differ in the exponent only), so unmixed, a buffer of zeros and one half 0.5 had the
 * same checksum and a torn read between them passed. */
static inline uint64_t asap_cksum_mix(uint64_t w) {
  return (w ^ (w >> 29)) * 0xbf58476d1ce4e5b9ULL;
}

/* Feed n bytes (n a multiple of 8*ASAP_CKSUM_LANES; p of any alignment). */
static inline void asap_cksum_feed(asap_cksum_t *restrict c, const void *restrict p, size_t n) {
  const asap_u64_any *w = (const asap_u64_any *)p;
  size_t words = n / 8;
  uint64_t a[ASAP_CKSUM_LANES], b[ASAP_CKSUM_LANES];
  for (int l = 0; l < ASAP_CKSUM_LANES; l++) { a[l] = c->a[l]; b[l] = c->b[l]; }
  for (size_t i = 0; i + ASAP_CKSUM_LANES <= words; i += ASAP_CKSUM_LANES) {
    for (int l = 0; l < ASAP_CKSUM_LANES; l++) {
      a[l] += asap_cksum_mix(w[i + l]);
      b[l] += a[l];
    }
  }
  for (int l = 0; l < ASAP_CKSUM_LANES; l++) { c->a[l] = a[l]; c->b[l] = b[l]; }
}

/* Feed the last, possibly short, piece: zero padded to the lane width. */
static inline void asap_cksum_feed_tail(asap_cksum_t *c, const void *p, size_t n) {
  size_t chunk = 8 * ASAP_CKSUM_LANES;
  size_t full = n - n % chunk;
  asap_cksum_feed(c, p, full);
  if (n > full) {
    uint64_t pad[ASAP_CKSUM_LANES] = {0};
    memcpy(pad, (const char *)p + full, n - full);
    asap_cksum_feed(c, pad, chunk);
  }
}

static inline uint64_t asap_cksum_final(const asap_cksum_t *c, size_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
  for (int l = 0; l < ASAP_CKSUM_LANES; l++) {
    h = (h ^ c->a[l]) * 0x100000001b3ULL;
    h = (h ^ c->b[l]) * 0x100000001b3ULL;
  }
  return h ? h : 1; /* 0 means "no checksum" in a footer */
}

static inline uint64_t asap_checksum(const void *p, size_t n) {
  asap_cksum_t c;
  asap_cksum_init(&c);
  asap_cksum_feed_tail(&c, p, n);
  return asap_cksum_final(&c, n);
}

/* ---------- fused weighted reduce ---------- */

/* The widest vector unit the CPU has, chosen at load time (GCC's target_clones: one
 * copy of the reduce per target and an ifunc resolver), so one build runs everywhere
 * and uses AVX-512 or AVX2 where they exist.  The order of operations is the same in
 * every copy (no FMA: -ffp-contract=off), so every copy gives the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(ASAP_NO_CLONES)
#define ASAP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ASAP_CLONES
#endif

/* One pass over m elements folding up to four inputs into d, left to right:
 * d = (((start + w1*x1) + w2*x2) + w3*x3) + w4*x4, where start is w0*own (first pass;
 * 0 when w0 == 0, so a NaN in own does not survive as 0*NaN) or d itself (later
 * passes).  Inputs are folded in registers: d is read and written once per pass, not
 * once per input. */
#define ASAP_FOLD(T, START)                                                              \
  switch (k) {                                                                           \
    case 1:                                                                              \
      for (size_t j = 0; j < m; j++) d[j] = START + w[0] * x[0][j];                      \
      break;                                                                             \
    case 2:                                                                              \
      for (size_t j = 0; j < m; j++) d[j] = (START + w[0] * x[0][j]) + w[1] * x[1][j];   \
      break;                                                                             \
    case 3:                                                                              \
      for (size_t j = 0; j < m; j++)                                                     \
        d[j] = ((START + w[0] * x[0][j]) + w[1] * x[1][j]) + w[2] * x[2][j];             \
      break;                                                                             \
    default:                                                                             \
      for (size_t j = 0; j < m; j++)                                                     \
        d[j] = (((START + w[0] * x[0][j]) + w[1] * x[1][j]) + w[2] * x[2][j]) +          \
               w[3] * x[3][j];                                                           \
  }

#define ASAP_DEFINE_WSUM(NAME, T)                                                        \
  /* always inlined: it is called from two target_clones functions (the block and the \
   * checksummed reduce), and left to itself GCC emitted it once, out of line, for the  \
   * baseline target: the AVX2 reduce then ran scalar code, 12x the instructions. */     \
  static inline __attribute__((always_inline)) void NAME##_fold(                         \
      T *d, const T *own, T w0, int first, const T *const *x, const T *w, int k,         \
      size_t m) {                                                                        \
    if (!first) {                                                                        \
      ASAP_FOLD(T, d[j])                                                                 \
    } else if (w0 == (T)0) {                                                             \
      ASAP_FOLD(T, (T)0)                                                                 \
    } else {                                                                             \
      ASAP_FOLD(T, w0 * own[j])                                                          \
    }                                                                                    \
  }                                                                                      \
  /* the block's result into acc (first fold scales own; no inputs: acc = w0*own) */    \
  ASAP_CLONES static void NAME##_block(T *acc, const T *own, T w0, const T *const *ins, \
                                       const T *ws, int n_in, size_t s, size_t m) {      \
    const T *x[4];                                                                       \
    if (n_in == 0) {                                                                     \
      if (w0 == (T)0) {                                                                  \
        for (size_t j = 0; j < m; j++) acc[j] = (T)0;                                    \
      } else {                                                                           \
        for (size_t j = 0; j < m; j++) acc[j] = w0 * own[j];                             \
      }                                                                                  \
      return;                                                                            \
    }                                                                                    \
    for (int i = 0; i < n_in; i += 4) {                                                  \
      int k = n_in - i < 4 ? n_in - i : 4;                                               \
      for (int q = 0; q < k; q++) x[q] = ins[i + q] + s;                                 \
      NAME##_fold(acc, own, w0, i == 0, x, ws + i, k, m);                                \
    }                                                                                    \
  }                                                                                      \
  /* The checksummed reduce: every input block is copied once into a private buffer   \
   * (a compiler barrier after the copies), then checksummed and summed from that copy,  \
   * so the sum and the checksum see the same bytes.  Reading the slot twice, once to   \
   * sum and once to checksum, would let a payload that becomes visible late (RDMA      \
   * visibility lag, a weakly ordered CPU) be summed old and checksummed new, and pass. \
   * Blocks are smaller here so that four copies stay in L1. */                          \
  ASAP_CLONES static void NAME##_checked(T *out, const T *own, T w0, const T *const *ins, \
                                         const T *ws, int n_in, size_t n,                \
                                         asap_cksum_t *cks) {                            \
    const size_t blk = ASAP_CHECKED_BLOCK_BYTES / sizeof(T);                             \
    T copy[4][ASAP_CHECKED_BLOCK_BYTES / sizeof(T)] __attribute__((aligned(64)));        \
    const T *x[4];                                                                       \
    for (size_t s = 0; s < n; s += blk) {                                                \
      size_t m = n - s < blk ? n - s : blk;                                              \
      for (int i = 0; i < n_in; i += 4) {                                                \
        int k = n_in - i < 4 ? n_in - i : 4;                                             \
        for (int q = 0; q < k; q++) memcpy(copy[q], ins[i + q] + s, m * sizeof(T));      \
        asap_compiler_barrier();                                                         \
        for (int q = 0; q < k; q++) {                                                    \
          if (s + m < n) asap_cksum_feed(&cks[i + q], copy[q], m * sizeof(T));           \
          else asap_cksum_feed_tail(&cks[i + q], copy[q], m * sizeof(T));                \
          x[q] = copy[q];                                                                \
        }                                                                                \
        NAME##_fold(out + s, own + s, w0, i == 0, x, ws + i, k, m);                      \
      }                                                                                  \
    }                                                                                    \
  }                                                                                      \
  /* out = w0*own + sum_i ws[i]*ins[i]; out may equal own; if cks is not NULL the bytes \
   * of every input are checksummed in the same pass (inputs padded to 32 bytes), from  \
   * the very bytes summed (NAME##_checked).  A large out that is not own (a           \
   * double-buffered exchange) is summed block by block in a cache-resident scratch and \
   * streamed out: no read-for-ownership of out, which would add a fourth of the        \
   * traffic to a reduce of two inputs. */                                               \
  static void NAME(T *out, const T *own, T w0, const T *const *ins, const T *ws,         \
                   int n_in, size_t n, asap_cksum_t *cks) {                              \
    const size_t blk = ASAP_BLOCK_BYTES / sizeof(T);                                     \
    T scratch[ASAP_BLOCK_BYTES / sizeof(T)] __attribute__((aligned(64)));                \
    const int stream = out != own && ASAP_CAN_STREAM(out, n * sizeof(T));                \
    if (cks && n_in > 0) {                                                               \
      NAME##_checked(out, own, w0, ins, ws, n_in, n, cks);                               \
      return;                                                                            \
    }                                                                                    \
    for (size_t s = 0; s < n; s += blk) {                                                \
      size_t m = n - s < blk ? n - s : blk;                                              \
      T *acc = stream ? scratch : out + s;                                               \
      NAME##_block(acc, own + s, w0, ins, ws, n_in, s, m);                               \
      if (stream) asap_stream(out + s, scratch, m * sizeof(T));                          \
    }                                                                                    \
    if (stream) asap_fence();                                                            \
  }

ASAP_DEFINE_WSUM(asap_wsum_f32, float)
ASAP_DEFINE_WSUM(asap_wsum_f64, double)

/* ---------- bfloat16: the reduce accumulates in float32 ---------- */

static inline float asap_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/* round to nearest, ties to even (as torch and ml_dtypes do); a NaN stays a NaN */
static inline uint16_t asap_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* ---------- float16 (IEEE binary16): the reduce accumulates in float32 ---------- */

/* exact: every binary16 value (subnormals, infinities, NaN payloads) is a float32 */
static inline float asap_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {
    /* subnormal: man * 2^-24, normalized */
    int e = -1;
    do { man <<= 1; e++; } while (!(man & 0x400u));
    u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/* round to nearest, ties to even (as torch and NumPy convert); overflow to infinity, a
 * NaN stays a NaN (quiet) */
static inline uint16_t asap_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);    /* rounds past 65504 */
  if (a >= 0x38800000u) {                                      /* normal in binary16 */
    uint32_t r = a - 0x38000000u;                              /* rebias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
  }
  if (a < 0x33000000u) return sign;                            /* below half of 2^-24 */
  /* subnormal: the significand with its hidden bit, shifted to units of 2^-24 */
  uint32_t man = (a & 0x7fffffu) | 0x800000u;
  int shift = 126 - (int)(a >> 23);                            /* 14 .. 24 */
  uint32_t half = 1u << (shift - 1), rest = man & ((1u << shift) - 1u);
  uint32_t q = man >> shift;
  if (rest > half || (rest == half && (q & 1u))) q++;
  return (uint16_t)(sign | q);
}

/* out = h(w0*own + sum_i ws[i]*ins[i]) for a 16-bit float type h: each element
 * accumulated in float32 left to right ((w0*own + w1*x1) + w2*x2 ...: every product
 * rounded to float32 before its add, as the float32 reduce), rounded once at the end;
 * out may equal own (a block of own is read before the same block of out is written).
 * wide, when not NULL, gets the float32 sums before that rounding (float32 master
 * weights take the mix from there: rounding it to 16 bits first loses, on average, what
 * the replicas' masters disagree by below one unit in the last place).
 * With cks, every input block is copied once, checksummed and summed from the copy, as
 * the float reduces do. */
#define ASAP_DEFINE_WSUM16(NAME, TO_F32, FROM_F32)                                        \
  ASAP_CLONES static void NAME(uint16_t *out, const uint16_t *own, float w0,              \
                               const uint16_t *const *ins, const float *ws, int n_in,     \
                               size_t n, asap_cksum_t *cks, float *wide) {                \
    enum { BLK = ASAP_CHECKED_BLOCK_BYTES / sizeof(uint16_t) };                           \
    float acc[BLK] __attribute__((aligned(64)));                                          \
    uint16_t copy[BLK] __attribute__((aligned(64)));                                      \
    for (size_t s = 0; s < n; s += BLK) {                                                 \
      size_t m = n - s < BLK ? n - s : BLK;                                               \
      if (w0 == 0.0f) {                                                                   \
        for (size_t j = 0; j < m; j++) acc[j] = 0.0f;                                     \
      } else {                                                                            \
        for (size_t j = 0; j < m; j++) acc[j] = w0 * TO_F32(own[s + j]);                  \
      }                                                                                   \
      for (int i = 0; i < n_in; i++) {                                                    \
        const uint16_t *x = ins[i] + s;                                                   \
        if (cks) {                                                                        \
          memcpy(copy, x, m * sizeof(uint16_t));                                          \
          asap_compiler_barrier();                                                        \
          if (s + m < n) asap_cksum_feed(&cks[i], copy, m * sizeof(uint16_t));            \
          else asap_cksum_feed_tail(&cks[i], copy, m * sizeof(uint16_t));                 \
          x = copy;                                                                       \
        }                                                                                 \
        const float w = ws[i];                                                            \
        for (size_t j = 0; j < m; j++) acc[j] = acc[j] + w * TO_F32(x[j]);                \
      }                                                                                   \
      for (size_t j = 0; j < m; j++) out[s + j] = FROM_F32(acc[j]);                       \
      if (wide) memcpy(wide + s, acc, m * sizeof(float));                                 \
    }                                                                                     \
  }

ASAP_DEFINE_WSUM16(asap_wsum_bf16, asap_bf16_to_f32, asap_f32_to_bf16)
ASAP_DEFINE_WSUM16(asap_wsum_f16, asap_f16_to_f32, asap_f32_to_f16)

#endif /* ASAPMPI_KERNELS_H */
