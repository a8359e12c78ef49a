// CPU roofline kernels, compiled once per instruction set (function target attributes) and
// chosen at run time with __builtin_cpu_supports, so one binary runs on any x86-64 and still
// reaches AVX2+FMA or AVX-512 peaks where the CPU has them.
#pragma once

#include <cstddef>

namespace gpuckpt {

enum class Isa { kBaseline, kAvx2Fma, kAvx512 };  // ordered: each includes the previous

Isa best_isa();  // the widest this CPU (and OS) supports
const char* isa_name(Isa isa);

// Array pointers are 64-byte aligned and element counts multiples of 64 bytes' worth: the
// kernels process whole vectors only.
struct CpuKernels {
  Isa isa;
  int vector_bytes;
  // Register-resident independent FMA chains (mul+add on the baseline ISA); `out` receives the
  // accumulators so the work cannot be optimised away. FLOPs per iteration: peak_flops_per_iter.
  void (*fma_peak)(float* out, long iters);
  int peak_flops_per_iter;
  void (*copy)(double* a, const double* b, std::size_t n);  // a = b
  void (*triad)(double* a, const double* b, const double* c, double s,
                std::size_t n);                    // a = b + s c
  double (*read)(const double* a, std::size_t n);  // sum a
  // 16 FMAs per element loaded: 32 FLOP per 4 bytes (8 FLOP/byte). Returns a checksum.
  float (*fma_stream)(const float* x, std::size_t n);
  // C[rows] += A[rows] * B for row-major n x n matrices; n a multiple of 64, rows of 4.
  void (*sgemm_rows)(const float* a, const float* b, float* c, int n, int row_begin, int row_end);
};

// The kernels for `isa`, or for best_isa() if this CPU lacks `isa` (check the table's .isa).
const CpuKernels& cpu_kernels(Isa isa);

}  // namespace gpuckpt
