#include "roofline/cpu_kernels.h"

#include <algorithm>

// The helpers below pass wide vectors by value, which -Wpsabi flags when the default target
// lacks AVX; they are always inlined into functions of the right target, so no ABI is involved.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace gpuckpt {

namespace {

// GCC/Clang vector extensions: arithmetic on them is lowered with the ISA of the function it is
// inlined into, so one body below becomes SSE2, AVX2+FMA or AVX-512 code. a*b+c contracts to an
// FMA where the ISA has one (GCC's default -ffp-contract=fast for C++, Clang's "on").
template <int W>
struct Vec {
  typedef float F __attribute__((vector_size(W)));
  typedef double D __attribute__((vector_size(W)));
  static constexpr int kFloats = W / 4;
  static constexpr int kDoubles = W / 8;
};

template <class T>
[[gnu::always_inline]] inline T load(const void* p) {
  T v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
[[gnu::always_inline]] inline void store(void* p, const T& v) {
  __builtin_memcpy(p, &v, sizeof v);
}

template <int W, int kChains>
[[gnu::always_inline]] inline void fma_peak_body(float* out, long iters) {
  using F = typename Vec<W>::F;
  F acc[kChains];
#pragma GCC unroll 32
  for (int j = 0; j < kChains; ++j) acc[j] = load<F>(out + j * Vec<W>::kFloats);
  // m < 1 and a > 0 keep every chain bounded and away from denormals, whatever `iters` is.
  const F m = F{} + 0.9999999f;
  const F a = F{} + 1e-7f;
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 32
    for (int j = 0; j < kChains; ++j) acc[j] = acc[j] * m + a;
  }
#pragma GCC unroll 32
  for (int j = 0; j < kChains; ++j) store(out + j * Vec<W>::kFloats, acc[j]);
}

template <int W>
[[gnu::always_inline]] inline void copy_body(double* a, const double* b, std::size_t n) {
  using D = typename Vec<W>::D;
  for (std::size_t i = 0; i < n; i += Vec<W>::kDoubles) store(a + i, load<D>(b + i));
}

template <int W>
[[gnu::always_inline]] inline void triad_body(double* a, const double* b, const double* c, double s,
                                              std::size_t n) {
  using D = typename Vec<W>::D;
  const D sv = s - D{};
  for (std::size_t i = 0; i < n; i += Vec<W>::kDoubles)
    store(a + i, load<D>(b + i) + sv * load<D>(c + i));
}

template <int W>
[[gnu::always_inline]] inline double read_body(const double* a, std::size_t n) {
  using D = typename Vec<W>::D;
  constexpr std::size_t k = Vec<W>::kDoubles;
  D s0{}, s1{}, s2{}, s3{};  // independent sums: the loop is bound by loads, not add latency
  std::size_t i = 0;
  for (; i + 4 * k <= n; i += 4 * k) {
    s0 += load<D>(a + i);
    s1 += load<D>(a + i + k);
    s2 += load<D>(a + i + 2 * k);
    s3 += load<D>(a + i + 3 * k);
  }
  for (; i < n; i += k) s0 += load<D>(a + i);
  const D s = (s0 + s1) + (s2 + s3);
  double r = 0;
  for (std::size_t j = 0; j < k; ++j) r += s[j];
  return r;
}

template <int W>
[[gnu::always_inline]] inline float fma_stream_body(const float* x, std::size_t n) {
  using F = typename Vec<W>::F;
  constexpr int kChains = 8;  // x 2 FMAs each = 16 FMAs per element
  F acc[kChains];
#pragma GCC unroll 8
  for (int j = 0; j < kChains; ++j) acc[j] = F{} + 1e-3f * static_cast<float>(j + 1);
  const F c = F{} + 1e-3f;
  for (std::size_t i = 0; i < n; i += Vec<W>::kFloats) {
    const F v = load<F>(x + i);
#pragma GCC unroll 8
    for (int j = 0; j < kChains; ++j) acc[j] = acc[j] * v + c;
#pragma GCC unroll 8
    for (int j = 0; j < kChains; ++j) acc[j] = acc[j] * v + c;
  }
  F s{};
#pragma GCC unroll 8
  for (int j = 0; j < kChains; ++j) s += acc[j];
  float r = 0;
  for (int j = 0; j < Vec<W>::kFloats; ++j) r += s[j];
  return r;
}

// Register-blocked SGEMM: a 4 x (2 vectors) block of C in registers, k blocked so that the
// panel of B being used stays in L1/L2 while every row block of the thread streams past it.
template <int W>
[[gnu::always_inline]] inline void sgemm_body(const float* a, const float* b, float* c, int n,
                                              int row_begin, int row_end) {
  using F = typename Vec<W>::F;
  constexpr int L = Vec<W>::kFloats;
  constexpr int kMr = 4, kNr = 2 * L, kKc = 256;
  for (int kb = 0; kb < n; kb += kKc) {
    const int ke = std::min(n, kb + kKc);
    for (int j = 0; j < n; j += kNr) {
      for (int i = row_begin; i < row_end; i += kMr) {
        F acc[kMr][2];
#pragma GCC unroll 4
        for (int r = 0; r < kMr; ++r) {
          acc[r][0] = load<F>(c + (i + r) * n + j);
          acc[r][1] = load<F>(c + (i + r) * n + j + L);
        }
        for (int k = kb; k < ke; ++k) {
          const F b0 = load<F>(b + k * n + j);
          const F b1 = load<F>(b + k * n + j + L);
#pragma GCC unroll 4
          for (int r = 0; r < kMr; ++r) {
            const F av = a[(i + r) * n + k] - F{};  // broadcast (x - 0 folds away; 0 + x does not)
            acc[r][0] = av * b0 + acc[r][0];
            acc[r][1] = av * b1 + acc[r][1];
          }
        }
#pragma GCC unroll 4
        for (int r = 0; r < kMr; ++r) {
          store(c + (i + r) * n + j, acc[r][0]);
          store(c + (i + r) * n + j + L, acc[r][1]);
        }
      }
    }
  }
}

// One set of kernels per instruction set: the same bodies, compiled for `ATTR`.
#define GPUCKPT_CPU_KERNEL_SET(NS, ATTR, ISA, W, CHAINS)                                  \
  namespace NS {                                                                          \
  ATTR void fma_peak(float* out, long iters) {                                            \
    fma_peak_body<W, CHAINS>(out, iters);                                                 \
  }                                                                                       \
  ATTR void copy(double* a, const double* b, std::size_t n) {                             \
    copy_body<W>(a, b, n);                                                                \
  }                                                                                       \
  ATTR void triad(double* a, const double* b, const double* c, double s, std::size_t n) { \
    triad_body<W>(a, b, c, s, n);                                                         \
  }                                                                                       \
  ATTR double read(const double* a, std::size_t n) {                                      \
    return read_body<W>(a, n);                                                            \
  }                                                                                       \
  ATTR float fma_stream(const float* x, std::size_t n) {                                  \
    return fma_stream_body<W>(x, n);                                                      \
  }                                                                                       \
  ATTR void sgemm_rows(const float* a, const float* b, float* c, int n, int r0, int r1) { \
    sgemm_body<W>(a, b, c, n, r0, r1);                                                    \
  }                                                                                       \
  const CpuKernels table{ISA,   W,    fma_peak,   CHAINS*(W / 4) * 2, copy,               \
                         triad, read, fma_stream, sgemm_rows};                            \
  }

// Chains per ISA: enough independent FMAs to cover latency x pipes, few enough to stay in the
// register file (16 vector registers before AVX-512, 32 with it).
GPUCKPT_CPU_KERNEL_SET(baseline, , Isa::kBaseline, 16, 12)
#if defined(__x86_64__) || defined(__i386__)
GPUCKPT_CPU_KERNEL_SET(avx2, __attribute__((target("avx2,fma"))), Isa::kAvx2Fma, 32, 12)
GPUCKPT_CPU_KERNEL_SET(avx512, __attribute__((target("avx512f"))), Isa::kAvx512, 64, 16)
#endif

}  // namespace

Isa best_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // libgcc also checks that the OS saves the wider registers (XCR0), not just CPUID.
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2Fma;
#endif
  return Isa::kBaseline;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512f";
    case Isa::kAvx2Fma:
      return "avx2+fma";
    case Isa::kBaseline:
      break;
  }
#if defined(__x86_64__) || defined(__i386__)
  return "sse2";
#else
  return "baseline";
#endif
}

const CpuKernels& cpu_kernels(Isa isa) {
  isa = std::min(isa, best_isa());  // never hand out code this CPU cannot run
#if defined(__x86_64__) || defined(__i386__)
  if (isa == Isa::kAvx512) return avx512::table;
  if (isa == Isa::kAvx2Fma) return avx2::table;
#else
  (void)isa;
#endif
  return baseline::table;
}

}  // namespace gpuckpt
