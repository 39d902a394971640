"""The loss-scale math on a CUDA device, with no host synchronization.

The same quantities as :mod:`ada_loss.loss_scale.gemm` and
:mod:`ada_loss.loss_scale.branch`, computed by CuPy kernels and returned as
0-d float64 CuPy arrays, so that the ⟨α, δ⟩ backward can carry every α and β
on the device and never wait for it (paper §4.3 measured the statistics at
27 % of a GPU step when they synchronize per layer):

* :func:`moments` — one fused pass over a tensor (FP16 or FP32) giving
  E[x²] (squares in float64, summed in float64 in a fixed order: the result
  does not depend on the launch) and max|x| (NaN and Inf propagate);
* :func:`grad_input_gain` — max_j Σ_i |W_ij| of the ``'output'`` bound;
* :func:`gemm_loss_scale` — Algorithm 4 + §3.2.3 (the bound, the power of
  two) and the ``max_accum_scale`` cap, the same floating-point operations
  in the same order as the NumPy path (IEEE double, no contraction);
* :func:`common_scale` — Algorithm 5's common scale where gradients meet;
* :func:`rescale` — ``ratio · x`` for a power-of-two 0-d ``ratio`` (FP16:
  computed in FP32 and rounded once, as the NumPy path does).

E[x²] differs from the NumPy path's float32-accumulated mean by its rounding
only; β, a power of two rounded down, equals it except where the bound lands
within that rounding of a power of two (``tests/loss_scale/test_device.py``
checks equality on the layer shapes of ResNet-50 and SSD512).

Needs CuPy; imported only when arrays are CuPy arrays.
"""
import functools
import math

import cupy
import numpy

from ada_loss.formats import get_format
from ada_loss.formats.quantize import CUDA_ROUND_NEAREST
from ada_loss.loss_scale.gemm import check_bound, erfinv, reference_fan

_THREADS = 256
_MAX_BLOCKS = 1024

_SOURCE = r"""
// IEEE binary16 bits -> float, exactly (subnormals, Inf, NaN), in integer
// arithmetic: independent of the compiler's denormal mode.
__device__ __forceinline__ float h2f(unsigned int h) {
    unsigned int s = (h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    unsigned int bits;
    if (e == 31u) {
        bits = s | 0x7f800000u | (m << 13);
    } else if (e != 0u) {
        bits = s | ((e + 112u) << 23) | (m << 13);
    } else if (m == 0u) {
        bits = s;
    } else {                          // a subnormal half is a normal float
        int k = __clz(m) - 21;        // puts the leading 1 at bit 10
        bits = s | ((unsigned int)(113 - k) << 23)
                 | (((m << k) & 1023u) << 13);
    }
    return __int_as_float(bits);
}

__device__ __forceinline__ float load(const float* p, long long i) {
    return p[i];
}

__device__ __forceinline__ float load(const unsigned short* p, long long i) {
    return h2f(p[i]);
}

#define NAN_MAX(a, b) ((((b) > (a)) || ((b) != (b))) ? (b) : (a))

__device__ __forceinline__ void acc(float v, double& s, float& m) {
    s += (double)v * (double)v;
    m = NAN_MAX(m, fabsf(v));
}

// The grid's share of sum x^2 and max|x|, four elements per load where the
// data are aligned (the memory-bound part: wide loads keep it near bandwidth).
__device__ void accumulate(const float* x, long long n, double& s, float& m) {
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long n4 = ((unsigned long long)x & 15ull) == 0ull ? n / 4 : 0;
    const float4* x4 = (const float4*)x;
    for (long long i = tid; i < n4; i += stride) {
        float4 v = x4[i];
        acc(v.x, s, m); acc(v.y, s, m); acc(v.z, s, m); acc(v.w, s, m);
    }
    for (long long i = n4 * 4 + tid; i < n; i += stride) acc(x[i], s, m);
}

__device__ void accumulate(const unsigned short* x, long long n, double& s,
                           float& m) {
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long n4 = ((unsigned long long)x & 7ull) == 0ull ? n / 4 : 0;
    const uint2* x4 = (const uint2*)x;
    for (long long i = tid; i < n4; i += stride) {
        uint2 v = x4[i];
        acc(h2f(v.x & 0xffffu), s, m); acc(h2f(v.x >> 16), s, m);
        acc(h2f(v.y & 0xffffu), s, m); acc(h2f(v.y >> 16), s, m);
    }
    for (long long i = n4 * 4 + tid; i < n; i += stride) acc(h2f(x[i]), s, m);
}

__device__ __forceinline__ double dmax(double a, double b) {
    return (b > a || b != b) ? b : a;     // NaN propagates
}

// Block-wide (sum, sum, max) reduction, result in every thread; 256 threads.
__device__ void block_reduce(double& s, double& c, float& m) {
    __shared__ double ss[256], sc[256];
    __shared__ float sm[256];
    int t = threadIdx.x;
    ss[t] = s; sc[t] = c; sm[t] = m;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (t < k) {
            ss[t] += ss[t + k];
            sc[t] = dmax(sc[t], sc[t + k]);
            sm[t] = NAN_MAX(sm[t], sm[t + k]);
        }
        __syncthreads();
    }
    s = ss[0]; c = sc[0]; m = sm[0];
    __syncthreads();
}

// True (in every thread) in the block that finishes last; the partials of
// all blocks are visible to it. It resets the counter for the next launch.
__device__ bool last_block(unsigned int* counter) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
        if (last) *counter = 0u;
    }
    __syncthreads();
    return last;
}

__device__ __forceinline__ double round_down_pow2(double x) {
    int e;
    frexp(x, &e);
    return ldexp(1.0, e - 1);
}

// Algorithm 4 + section 3.2.3 as ada_loss.loss_scale.gemm.gemm_loss_scale
// (the same double operations in the same order): w = (E[W^2], max|W|,
// gain), g = (E[g^2], max|g|); bound 0 output, 1 product, 2 fan_in.
__device__ double beta_of(const double* w, const double* g, double u_min,
                          double u_max, double sqrt2, double erfinv_t,
                          int bound, double fan_in, double max_scale) {
    double sigma_p = sqrt(w[0] * g[0]);
    if (!(sigma_p > 0.0)) return 1.0;
    double lower = u_min / (sigma_p * sqrt2 * erfinv_t);
    if (!isfinite(lower)) return 1.0;
    double b = lower > 1.0 ? lower : 1.0;
    double peak = bound == 0 ? g[1] * w[2] : w[1] * g[1];
    if (bound == 2) peak *= fan_in;
    if (peak > 0.0) {
        double upper = u_max / peak;
        if (!(isfinite(upper) && upper > 0.0)) return 1.0;
        if (upper < b) b = upper;
    }
    if (max_scale > 0.0 && max_scale < b) b = max_scale;
    return round_down_pow2(b);
}

// (E[x^2], max|x|) in one pass: squares and sums in double, partials summed
// in a fixed order by the last block. Returns true in the last block, where
// out[0..1] is written (by thread 0).
template <typename T>
__device__ bool moments(const T* x, long long n, double* psum, float* pmax,
                        unsigned int* counter, double* out) {
    double s = 0.0, unused = 0.0;
    float m = 0.0f;
    accumulate(x, n, s, m);
    block_reduce(s, unused, m);
    if (threadIdx.x == 0) {
        psum[blockIdx.x] = s;
        pmax[blockIdx.x] = m;
    }
    if (!last_block(counter)) return false;
    s = 0.0;
    m = 0.0f;
    for (int i = threadIdx.x; i < gridDim.x; i += blockDim.x) {
        s += ((volatile double*)psum)[i];
        m = NAN_MAX(m, ((volatile float*)pmax)[i]);
    }
    block_reduce(s, unused, m);
    if (threadIdx.x == 0) {
        out[0] = s / (double)n;
        out[1] = (double)m;
    }
    return true;
}

extern "C" __global__ void moments_f32(const float* x, long long n,
        double* psum, float* pmax, unsigned int* counter, double* out) {
    moments<float>(x, n, psum, pmax, counter, out);
}
extern "C" __global__ void moments_f16(const unsigned short* x, long long n,
        double* psum, float* pmax, unsigned int* counter, double* out) {
    moments<unsigned short>(x, n, psum, pmax, counter, out);
}

// True (in every thread) in the block that is the last of `total` blocks
// counting on `counter` to finish; it resets the counter for the next launch.
__device__ bool last_of(unsigned int* counter, long long total) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1u) == (unsigned int)(total - 1);
        if (last) *counter = 0u;
    }
    __syncthreads();
    return last;
}

// W seen as (A, J, B), J the axis the input-gradient GEMM keeps: column j
// (one block) sums |W| over (a, b) (the 'output' bound's column sums) and
// W^2, max|W| in the same pass; the block that finishes the layer's last
// column writes out = (E[W^2], max|W|, max_j sum_ab |W|). Shared by the
// one-layer and the many-layer kernels, so both give the same bits.
template <typename T>
__device__ void weight_column(const T* w, long long A, long long J,
                              long long B, long long j, double* pcol,
                              double* psq, float* pmax,
                              unsigned int* counter, double* out) {
    double c = 0.0, q = 0.0, unused = 0.0;
    float m = 0.0f;
    for (long long k = threadIdx.x; k < A * B; k += blockDim.x) {
        long long a = k / B, b = k - a * B;
        float v = load(w, (a * J + j) * B + b);
        c += (double)fabsf(v);
        q += (double)v * (double)v;
        m = NAN_MAX(m, fabsf(v));
    }
    float unused_m = 0.0f;
    block_reduce(c, unused, unused_m);
    block_reduce(q, unused, m);
    if (threadIdx.x == 0) {
        pcol[j] = c;
        psq[j] = q;
        pmax[j] = m;
    }
    if (!last_of(counter, J)) return;
    double s = 0.0, g = 0.0;
    m = 0.0f;
    for (long long i = threadIdx.x; i < J; i += blockDim.x) {
        s += ((volatile double*)psq)[i];
        m = NAN_MAX(m, ((volatile float*)pmax)[i]);
        g = dmax(g, ((volatile double*)pcol)[i]);
    }
    block_reduce(s, g, m);
    if (threadIdx.x == 0) {
        out[0] = s / (double)(A * J * B);
        out[1] = (double)m;
        out[2] = g;
    }
}

// One layer: J blocks.
extern "C" __global__ void weight_stats_f32(const float* w, long long A,
        long long J, long long B, double* pcol, double* psq, float* pmax,
        unsigned int* counter, double* out) {
    weight_column<float>(w, A, J, B, blockIdx.x, pcol, psq, pmax, counter,
                         out);
}
extern "C" __global__ void weight_stats_f16(const unsigned short* w,
        long long A, long long J, long long B, double* pcol, double* psq,
        float* pmax, unsigned int* counter, double* out) {
    weight_column<unsigned short>(w, A, J, B, blockIdx.x, pcol, psq, pmax,
                                  counter, out);
}

// L layers in one launch (the weight statistics of a whole model once per
// beta update, instead of one launch per layer): layer l's columns are the
// blocks first[l] .. first[l+1]-1; ptrs[l] its data, dims[3l..3l+2] its
// (A, J, B); its partials at offset first[l] of the scratch, its own counter,
// its result at out[3l..3l+2].
template <typename T>
__device__ void weight_stats_many(const unsigned long long* ptrs,
                                  const long long* dims,
                                  const long long* first, int L,
                                  double* pcol, double* psq, float* pmax,
                                  unsigned int* counters, double* out) {
    long long blk = blockIdx.x;
    int lo = 0, hi = L - 1;           // the layer holding this block
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (first[mid] <= blk) lo = mid; else hi = mid - 1;
    }
    long long off = first[lo];
    weight_column<T>((const T*)ptrs[lo], dims[3 * lo], dims[3 * lo + 1],
                     dims[3 * lo + 2], blk - off, pcol + off, psq + off,
                     pmax + off, counters + lo, out + 3 * lo);
}

extern "C" __global__ void weight_stats_many_f32(
        const unsigned long long* ptrs, const long long* dims,
        const long long* first, int L, double* pcol, double* psq,
        float* pmax, unsigned int* counters, double* out) {
    weight_stats_many<float>(ptrs, dims, first, L, pcol, psq, pmax,
                             counters, out);
}
extern "C" __global__ void weight_stats_many_f16(
        const unsigned long long* ptrs, const long long* dims,
        const long long* first, int L, double* pcol, double* psq,
        float* pmax, unsigned int* counters, double* out) {
    weight_stats_many<unsigned short>(ptrs, dims, first, L, pcol, psq,
                                      pmax, counters, out);
}

// The incoming gradient's moments and, in the last block, beta from the
// weight statistics w: one launch. out = (E[g^2], max|g|, beta).
template <typename T>
__device__ void grad_beta(const T* x, long long n, double* psum,
                          float* pmax, unsigned int* counter,
                          const double* w, double u_min, double u_max,
                          double sqrt2, double erfinv_t, int bound,
                          double fan_in, double max_scale, double* out) {
    if (moments<T>(x, n, psum, pmax, counter, out) && threadIdx.x == 0)
        out[2] = beta_of(w, out, u_min, u_max, sqrt2, erfinv_t, bound,
                         fan_in, max_scale);
}

extern "C" __global__ void grad_beta_f32(const float* x, long long n,
        double* psum, float* pmax, unsigned int* counter, const double* w,
        double u_min, double u_max, double sqrt2, double erfinv_t, int bound,
        double fan_in, double max_scale, double* out) {
    grad_beta<float>(x, n, psum, pmax, counter, w, u_min, u_max, sqrt2,
                     erfinv_t, bound, fan_in, max_scale, out);
}
extern "C" __global__ void grad_beta_f16(const unsigned short* x,
        long long n, double* psum, float* pmax, unsigned int* counter,
        const double* w, double u_min, double u_max, double sqrt2,
        double erfinv_t, int bound, double fan_in, double max_scale,
        double* out) {
    grad_beta<unsigned short>(x, n, psum, pmax, counter, w, u_min, u_max,
                              sqrt2, erfinv_t, bound, fan_in, max_scale,
                              out);
}

extern "C" __global__ void cap_accum(const double* beta, const double* alpha,
                                     double max_accum, double* out) {
    double b = beta[0];
    if (alpha[0] * b > max_accum) b = round_down_pow2(max_accum / alpha[0]);
    out[0] = b;
}

// Algorithm 5 (ada_loss.loss_scale.branch.common_scale) for k <= 8
// gradients: a_i (their scales) and p_i (their peaks max|delta_i|), by
// address (unused slots repeat the first); out = (alpha, alpha / a_0, ..., alpha / a_{k-1}).
__device__ bool fits_all(double alpha, const double* a, const double* p,
                         int k, double u_max) {
    bool fits = true;
    for (int i = 0; i < k; ++i) fits = fits && (alpha / a[i] * p[i] < u_max);
    return fits;
}

extern "C" __global__ void common_scale(
        const double* a0, const double* a1, const double* a2,
        const double* a3, const double* a4, const double* a5,
        const double* a6, const double* a7, const double* p0,
        const double* p1, const double* p2, const double* p3,
        const double* p4, const double* p5, const double* p6,
        const double* p7, int k, double u_max, int max_halvings,
        double* out) {
    const double* ap[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    const double* pp[8] = {p0, p1, p2, p3, p4, p5, p6, p7};
    double a[8], p[8];
    for (int i = 0; i < k; ++i) {
        a[i] = *ap[i];
        p[i] = *pp[i];
    }
    double lo = a[0], hi = a[0];
    for (int i = 1; i < k; ++i) {
        lo = a[i] < lo ? a[i] : lo;
        hi = a[i] > hi ? a[i] : hi;
    }
    double alpha = -1.0;
    if (lo == hi) alpha = hi;
    for (int i = 0; i < k && alpha < 0.0; ++i)
        if (!isfinite(p[i])) alpha = lo;      // overflowed: the step is lost
    if (alpha < 0.0) {
        for (int c = 0; c < k; ++c)
            if (a[c] > alpha && fits_all(a[c], a, p, k, u_max)) alpha = a[c];
    }
    if (alpha < 0.0) {
        alpha = lo;
        for (int h = 0; h < max_halvings; ++h) {
            alpha /= 2.0;
            if (fits_all(alpha, a, p, k, u_max)) break;
        }
    }
    out[0] = alpha;
    for (int i = 0; i < k; ++i) out[1 + i] = alpha / a[i];
}
"""


# The fit of a gradient into its stored format by a power of two
# (ada_loss.loss_scale.fit.fit_ratio), decided on the rounded value as the
# host decides it: the candidate product in double, rounded to float32, then
# to the format by the same integer rounding as quantize's CuPy kernel.
_FIT_SOURCE = r"""
__device__ unsigned int round_to_format(
        unsigned int b, int shift, unsigned int emin_bits, int qe,
        unsigned int max_bits, unsigned int over_bits) {
    unsigned int y;
""" + CUDA_ROUND_NEAREST + r"""
    return y;
}

struct Rounder {
    int shift, qe, saturates;
    unsigned int emin_bits, max_bits, over_bits;
};

// overflows(value, fmt): the value rounds to Inf/NaN, or to u_max in a
// format that saturates (ada_loss.loss_scale.fit.overflows)
__device__ bool overflows(double v, const Rounder& f) {
    unsigned int r = round_to_format(
        __float_as_uint(__double2float_rn(v)), f.shift, f.emin_bits, f.qe,
        f.max_bits, f.over_bits) & 0x7fffffffu;
    return r >= 0x7f800000u || (f.saturates && r >= f.max_bits);
}

// out = the largest power of two 2^-k (k >= 0) with peak * scale * 2^-k not
// overflowing; 1 where peak * scale does not overflow or is not finite
extern "C" __global__ void fit_ratio(
        const double* peak, const double* scale, double u_max, int shift,
        unsigned int emin_bits, int qe, unsigned int max_bits,
        unsigned int over_bits, int saturates, double* out) {
    Rounder f = {shift, qe, saturates, emin_bits, max_bits, over_bits};
    double p = peak[0] * scale[0];
    double ratio = 1.0;
    if (isfinite(p) && overflows(p, f)) {
        int e;
        frexp(p / u_max, &e);
        ratio = fmin(1.0, ldexp(1.0, -(e - 1)));
        // two halvings at most (fit_ratio's docstring); the bound is a guard
        for (int i = 0; i < 64 && overflows(p * ratio, f); ++i)
            ratio /= 2.0;
    }
    out[0] = ratio;
}

// alpha_{N+1} from the loss gradient (ada_loss.adaptive.ada_loss_scaled:
// init_scale='auto', Eq. 1 by ada_loss.loss_scale.gemm.loss_gradient_scale;
// 'amax', its peak in the top binade by ada_loss.loss_scale.fit
// .top_binade_scale), from the k GEMMs that received it: m = k rows
// (E[g^2], max|g|) of the gradient as carried at scales a, n their sizes.
// The old value stays where the loss was not finite or nothing was seen.
extern "C" __global__ void loss_gradient_alpha(
        const double* m, const long long* n, const double* a, int k,
        const bool* loss_finite, const double* old, int amax, double u_min,
        double sqrt2, double erfinv_t, double u_max, int shift,
        unsigned int emin_bits, int qe, unsigned int max_bits,
        unsigned int over_bits, int saturates, double max_loss_scale,
        double max_accum, double* out) {
    long long count = 0;
    double total = 0.0, peak = 0.0;
    for (int j = 0; j < k; ++j) {
        if (n[j] == 0) continue;
        double inv = 1.0 / a[j];                     // a power of two
        total += m[2 * j] * (double)n[j] * inv * inv;
        double p = m[2 * j + 1] * inv;
        if (p > peak) peak = p;                      // as Python's max
        count += n[j];
    }
    if (!loss_finite[0] || count == 0) {
        out[0] = old[0];
        return;
    }
    double alpha;
    if (amax) {
        Rounder f = {shift, qe, saturates, emin_bits, max_bits, over_bits};
        if (!(peak > 0.0 && isfinite(peak))) {
            alpha = 1.0;
        } else {
            int e;
            frexp(u_max / peak, &e);
            alpha = ldexp(1.0, e - 1);
            if (!overflows(peak * alpha * 2.0, f)) alpha *= 2.0;
            while (alpha > 1.401298464324817e-45 && overflows(peak * alpha, f))
                alpha /= 2.0;
        }
    } else {
        double second = total / (double)count;
        if (!(second > 0.0 && isfinite(second) && isfinite(peak))) {
            alpha = 1.0;
        } else {
            double lower = u_min / (sqrt(second) * sqrt2 * erfinv_t);
            double x = lower > 1.0 ? lower : 1.0;
            double upper = u_max / peak;
            alpha = round_down_pow2(upper < x ? upper : x);
        }
    }
    if (max_loss_scale < alpha) alpha = max_loss_scale;
    if (max_accum > 0.0 && alpha > max_accum) alpha = round_down_pow2(max_accum);
    out[0] = alpha;
}

// the backoff of a skipped step (ada_loss.adaptive.ada_loss_scaled
// ._backed_off): beta * 2^-k, but where alpha * that falls below min_scale
// min(beta, 2^ceil(log2(min_scale / alpha)))
extern "C" __global__ void backed_off(const double* beta, const double* alpha,
                                      int k, double min_scale, double* out) {
    double b = beta[0], a = alpha[0];
    double lowered = b * ldexp(1.0, -k);
    if (a * lowered >= min_scale) {
        out[0] = lowered;
    } else {
        int e;
        double m = frexp(min_scale / a, &e);    // = m * 2^e, m in [0.5, 1)
        out[0] = fmin(b, ldexp(1.0, m == 0.5 ? e - 1 : e));
    }
}
"""


class _Workspace(object):
    """Per device: the compiled kernels (``--fmad=false``: no fused
    multiply-add, so the double arithmetic matches the host's operation by
    operation), the counter the blocks of a launch count themselves on (the
    last resets it) and scratch space for partial results. Launches on one
    stream run in order, so one workspace per device serves them all."""

    def __init__(self):
        module = cupy.RawModule(code=_SOURCE + _FIT_SOURCE,
                                options=('--std=c++14', '--fmad=false'))
        self.kernels = {}
        for name in ('moments_f32', 'moments_f16', 'weight_stats_f32',
                     'weight_stats_f16', 'weight_stats_many_f32',
                     'weight_stats_many_f16', 'grad_beta_f32',
                     'grad_beta_f16', 'cap_accum', 'common_scale',
                     'fit_ratio', 'backed_off', 'loss_gradient_alpha'):
            self.kernels[name] = module.get_function(name)
        self.counter = cupy.zeros(1, dtype=cupy.uint32)
        self._scratch = {}
        self._counters = cupy.zeros(0, dtype=cupy.uint32)
        self._tables = {}

    def counters(self, n):
        """At least ``n`` zero counters (each launch's last block resets
        its own)."""
        if self._counters.size < n:
            self._counters = cupy.zeros(max(n, 2 * self._counters.size),
                                        dtype=cupy.uint32)
        return self._counters

    def table(self, values):
        """``values`` (a tuple of int64s) as a device array, kept: a model's
        layer table is the same step after step, so it crosses to the device
        once (CuPy stages the copy through pinned memory: no wait)."""
        t = self._tables.get(values)
        if t is None:
            if len(self._tables) > 64:      # weights moved (new arrays)
                self._tables.clear()
            t = self._tables[values] = cupy.asarray(
                numpy.array(values, dtype=numpy.int64))
        return t

    def scratch(self, n):
        """(float64[n], float64[n], float32[n]) reused by every launch."""
        if n not in self._scratch:
            self._scratch[n] = (cupy.empty(n, cupy.float64),
                                cupy.empty(n, cupy.float64),
                                cupy.empty(n, cupy.float32))
        return self._scratch[n]


_workspaces = {}


def _workspace():
    dev = cupy.cuda.runtime.getDevice()
    ws = _workspaces.get(dev)
    if ws is None:
        ws = _workspaces[dev] = _Workspace()
    return ws


def _kernel(name):
    return _workspace().kernels[name]


def _flat(a):
    """(contiguous data, kernel suffix): float16 as its bits, else float32."""
    if a.dtype == cupy.float16:
        return cupy.ascontiguousarray(a).view(cupy.uint16), 'f16'
    return cupy.ascontiguousarray(a, dtype=cupy.float32), 'f32'


def _blocks(n):
    return max(1, min(_MAX_BLOCKS, (n + _THREADS - 1) // _THREADS))


def is_device_array(a):
    return isinstance(a, cupy.ndarray)


def scalar(value):
    """A 0-d float64 device array holding ``value`` (a Python number or a
    0-d array, left on the device)."""
    if isinstance(value, cupy.ndarray):
        return value.astype(cupy.float64, copy=False).reshape(())
    return cupy.full((), value, dtype=cupy.float64)


def moments(a):
    """(E[a²], max|a|) of a CuPy array as a length-2 float64 device array,
    from one pass over ``a`` (float16 or float32; others are cast to float32
    first) in one launch. An empty array gives (0, 0)."""
    out = cupy.empty(2, dtype=cupy.float64)
    n = a.size
    if n == 0:
        out[...] = 0
        return out
    x, suffix = _flat(a)
    ws = _workspace()
    psum, _, pmax = ws.scratch(_MAX_BLOCKS)
    ws.kernels['moments_' + suffix]((_blocks(n),), (_THREADS,), (
        x, cupy.int64(n), psum, pmax, ws.counter, out))
    return out


def max_abs(a):
    """max|a| as a 0-d float64 device array (NaN propagates; 0 if empty)."""
    return moments(a)[1]


def weight_statistics(W, axes):
    """(E[W²], max|W|, max_j Σ_i |W_ij|) of a GEMM's weights in one launch,
    a length-3 float64 device array; ``axes``: the axes of W the
    input-gradient GEMM contracts (all but one, see
    :func:`ada_loss.loss_scale.gemm.grad_input_gain`)."""
    out = cupy.empty(3, dtype=cupy.float64)
    if W.size == 0:
        out[...] = 0
        return out
    A, J, B = _column_view(W, axes)
    x, suffix = _flat(W)
    ws = _workspace()
    pcol, psq, pmax = ws.scratch(max(J, _MAX_BLOCKS))
    ws.kernels['weight_stats_' + suffix]((J,), (_THREADS,), (
        x, cupy.int64(A), cupy.int64(J), cupy.int64(B), pcol, psq, pmax,
        ws.counter, out))
    return out


def _column_view(W, axes):
    """(A, J, B) of W seen with J the one axis ``axes`` leave (None: all
    axes but the second, as :func:`gemm_loss_scale`)."""
    if axes is None:
        axes = tuple(i for i in range(W.ndim) if i != 1)
    keep = [i for i in range(W.ndim) if i not in axes]
    if len(keep) != 1:
        raise ValueError('axes must leave exactly one axis of W, got {} for '
                         'shape {}'.format(axes, W.shape))
    k = keep[0]
    return (int(math.prod(W.shape[:k])), int(W.shape[k]),
            int(math.prod(W.shape[k + 1:])))


def weight_statistics_many(weights):
    """:func:`weight_statistics` of many GEMMs' weights in one launch per
    storage dtype (float16 / float32), bit for bit the same values.

    Args:
        weights: a sequence of ``(W, axes)`` (``axes`` None: all but the
            second, as :func:`gemm_loss_scale`).

    Returns:
        A list of length-3 float64 device arrays (rows of one array), in
        the order of ``weights``.
    """
    weights = list(weights)
    out = cupy.zeros((len(weights), 3), dtype=cupy.float64)
    groups = {}
    keep = []         # the contiguous copies, alive until their launch
    for i, (W, axes) in enumerate(weights):
        if W.size == 0:
            continue
        x, suffix = _flat(W)
        keep.append(x)
        groups.setdefault(suffix, []).append((i, x, _column_view(W, axes)))
    ws = _workspace()
    for suffix, layers in groups.items():
        L = len(layers)
        first = [0]
        dims = []
        for _, _, (A, J, B) in layers:
            dims += [A, J, B]
            first.append(first[-1] + J)
        table = ws.table(tuple(x.data.ptr for _, x, _ in layers)
                         + tuple(dims) + tuple(first))
        rows = [i for i, _, _ in layers]
        # results in launch order; scattered to the callers' order below
        res = out if rows == list(range(len(weights))) else \
            cupy.empty((L, 3), dtype=cupy.float64)
        pcol, psq, pmax = ws.scratch(max(first[-1], _MAX_BLOCKS))
        ws.kernels['weight_stats_many_' + suffix]((first[-1],), (_THREADS,), (
            table[:L], table[L:4 * L], table[4 * L:], cupy.int32(L), pcol,
            psq, pmax, ws.counters(L), res))
        if res is not out:
            out[cupy.asarray(numpy.array(rows))] = res
    del keep
    return [out[i] for i in range(len(weights))]


def grad_input_gain(W, axes):
    """max_j Σ_i |W_ij| over ``axes`` (see
    :func:`ada_loss.loss_scale.gemm.grad_input_gain`), a 0-d float64 device
    array, accumulated in float64."""
    return weight_statistics(W, axes)[2]


_BOUND_CODES = {'output': 0, 'product': 1, 'fan_in': 2}


@functools.lru_cache(maxsize=256)
def _constants(fmt, t_uf, bound, max_scale):
    if not 0 < t_uf < 1:
        raise ValueError('t_uf must be in (0, 1), got {!r}'.format(t_uf))
    check_bound(bound)
    if bound not in _BOUND_CODES:
        # no untested GPU kernel: compute such a bound on the host
        raise NotImplementedError(
            'the overflow bound {!r} has no device (CuPy) kernel; the device '
            'path supports: {}'.format(bound, ', '.join(_BOUND_CODES)))
    f = get_format(fmt)
    return (float(f.u_min), float(f.u_max), math.sqrt(2.0),
            float(erfinv(t_uf)), cupy.int32(_BOUND_CODES[bound]),
            float(max_scale or 0.0))


def gemm_loss_scale(W, g, t_uf=1e-3, fmt='float16', bound='product',
                    axes=None, max_scale=None, w_stats=None):
    """β of one GEMM on the device (a 0-d float64 array), as
    :func:`ada_loss.loss_scale.gemm.gemm_loss_scale`, in two launches: the
    weight statistics (:func:`weight_statistics`, skipped when ``w_stats``
    is given) and the gradient's moments with β.

    Args:
        axes: the axes of W the input-gradient GEMM contracts (for the
            ``'output'`` bound's gain; default: all but the second).
    """
    u_min, u_max, sqrt2, erf, code, cap = _constants(
        fmt if isinstance(fmt, str) else fmt.name, t_uf, bound, max_scale)
    if w_stats is None:
        w_stats = weight_statistics(
            W, axes if axes is not None else
            tuple(i for i in range(W.ndim) if i != 1))
    out = cupy.empty(3, dtype=cupy.float64)
    n = g.size
    if n == 0:
        out[...] = 1.0      # σ_p = 0: β = 1
        return out[2]
    x, suffix = _flat(g)
    ws = _workspace()
    psum, _, pmax = ws.scratch(_MAX_BLOCKS)
    fan_in = float(reference_fan(W))
    ws.kernels['grad_beta_' + suffix]((_blocks(n),), (_THREADS,), (
        x, cupy.int64(n), psum, pmax, ws.counter, w_stats, u_min, u_max,
        sqrt2, erf, code, fan_in, cap, out))
    return out[2]


def cap_accum(beta, alpha, max_accum_scale):
    """β lowered so that α·β ≤ ``max_accum_scale`` (a power of two)."""
    if max_accum_scale is None:
        return beta
    out = cupy.empty((), dtype=cupy.float64)
    _kernel('cap_accum')((1,), (1,), (scalar(beta), scalar(alpha),
                                      float(max_accum_scale), out))
    return out


def common_scale(scales, peaks, u_max, max_halvings=64):
    """Algorithm 5 on the device: ``scales`` and ``peaks`` are lists of (at
    most 8) 0-d float64 device arrays or numbers, α_k and max|δ_k|; returns
    ``(α, ratios)``: a 0-d array and the list of 0-d arrays α/α_k, from one
    launch (the operands are passed by address: no copy)."""
    k = len(scales)
    if not 1 <= k <= 8:
        raise ValueError('common_scale on the device takes 1 to 8 '
                         'gradients, got {}'.format(k))
    a = [scalar(v) for v in scales]
    p = [scalar(v) for v in peaks]
    a += [a[0]] * (8 - k)
    p += [p[0]] * (8 - k)
    out = cupy.empty(k + 1, dtype=cupy.float64)
    _kernel('common_scale')((1,), (1,), tuple(a) + tuple(p) + (
        cupy.int32(k), float(u_max), cupy.int32(max_halvings), out))
    return out[0], [out[1 + i] for i in range(k)]


def fit_ratio(peak, fmt, scale=1.0):
    """:func:`ada_loss.loss_scale.fit.fit_ratio` of ``peak · scale`` on the
    device, as a 0-d float64 device array, in one single-thread launch and
    no synchronization: the largest power of two 2^-k (k ≥ 0) such that
    ``2^-k · peak · scale`` does not overflow ``fmt`` when rounded; 1 where
    it does not overflow or is not finite (nothing a power of two could
    fit). ``peak`` (e.g. :func:`max_abs`) and ``scale`` are 0-d device
    arrays or numbers; ``fmt`` a format name or FloatFormat."""
    f = get_format(fmt)
    out = cupy.empty((), dtype=cupy.float64)
    shift, emin_bits, qe, max_bits, over_bits = f._rounder.cuda_constants()
    _kernel('fit_ratio')((1,), (1,), (
        scalar(peak), scalar(scale), float(f.u_max), cupy.int32(shift),
        cupy.uint32(emin_bits), cupy.int32(qe), cupy.uint32(max_bits),
        cupy.uint32(over_bits), cupy.int32(bool(f.saturates)), out))
    return out


def backed_off(beta, k, alpha, min_scale):
    """β·2^-k as :func:`ada_loss.adaptive.ada_loss_scaled._backed_off`
    lowers it (with its floor ``min_scale`` on α·β), on the device: a 0-d
    float64 device array; ``beta`` and ``alpha`` 0-d device arrays or
    numbers."""
    out = cupy.empty((), dtype=cupy.float64)
    _kernel('backed_off')((1,), (1,), (scalar(beta), scalar(alpha),
                                       cupy.int32(k), float(min_scale), out))
    return out


def loss_gradient_alpha(parts, loss, old, rule, fmt, t_uf, max_loss_scale,
                        max_accum_scale=None):
    """α_{N+1} from the loss gradient on the device (``init_scale='auto'``
    or ``'amax'`` of :class:`ada_loss.AdaLossScaled`), a 0-d float64 device
    array: ``parts`` a list of (the gradient a GEMM received from the loss,
    as carried; its scale α) — their unscaled E[g²] and max|g| combined as
    the host combines them; ``old`` is kept where ``loss`` is not finite or
    ``parts`` is empty. ``rule``: ``'auto'`` (Eq. 1) or ``'amax'`` (the top
    binade); capped at ``max_loss_scale`` and ``max_accum_scale``."""
    f = get_format(fmt)
    out = cupy.empty((), dtype=cupy.float64)
    k = len(parts)
    if k:
        m = cupy.stack([moments(g) for g, _ in parts])
        a = cupy.stack([scalar(alpha) for _, alpha in parts])
        n = _workspace().table(tuple(int(g.size) for g, _ in parts))
    else:
        m = a = cupy.zeros(2, dtype=cupy.float64)
        n = _workspace().table((0,))
    finite = cupy.isfinite(loss).all()
    shift, emin_bits, qe, max_bits, over_bits = f._rounder.cuda_constants()
    _kernel('loss_gradient_alpha')((1,), (1,), (
        m, n, a, cupy.int32(k), finite, scalar(old),
        cupy.int32(rule == 'amax'), float(f.u_min), math.sqrt(2.0),
        float(erfinv(t_uf)), float(f.u_max), cupy.int32(shift),
        cupy.uint32(emin_bits), cupy.int32(qe), cupy.uint32(max_bits),
        cupy.uint32(over_bits), cupy.int32(bool(f.saturates)),
        float(max_loss_scale), float(max_accum_scale or 0.0), out))
    return out


# The product in FP64, rounded once to float (then to T, exact unless T is
# float16, where the float result is already exact or far below FP16's
# range): exact for every power of two r a double holds, as the host's
# scaled() — a (float)r would be inf for r >= 2^128 and 0 for r < 2^-149,
# while the overflow decision (fit_ratio) judges r · max|x| as a double.
_rescale_f = cupy.ElementwiseKernel(
    'T x, float64 r', 'T y', 'y = (T)(float)((double)(float)x * r)',
    'ada_loss_rescale_f')
_rescale_d = cupy.ElementwiseKernel(
    'T x, float64 r', 'T y', 'y = x * r', 'ada_loss_rescale_d')
# (r0·x0 rounded to T) + (r1·x1 rounded to T), rounded to T: exactly the
# two rescalings followed by Chainer's F.add, in one pass.
_rescale_add = cupy.ElementwiseKernel(
    'T x0, float64 r0, T x1, float64 r1', 'T y',
    'y = (T)((float)(T)(float)((double)(float)x0 * r0)'
    ' + (float)(T)(float)((double)(float)x1 * r1))',
    'ada_loss_rescale_add')


def rescale(x, ratio):
    """``ratio · x`` for a power-of-two 0-d device ``ratio``: float16 and
    float32 arrays are multiplied in FP32 and rounded once (exact up to
    underflow/overflow of the result), float64 in FP64."""
    ratio = scalar(ratio)
    if x.dtype in (cupy.float16, cupy.float32):
        return _rescale_f(x, ratio)
    return _rescale_d(x, ratio)


def rescale_add(x0, r0, x1, r1):
    """``rescale(x0, r0) + rescale(x1, r1)`` (float16/float32, the sum
    rounded as ``F.add`` rounds it) in one pass."""
    return _rescale_add(x0, scalar(r0), x1, scalar(r1))


def to_floats(values):
    """Python floats of a list of numbers and 0-d device arrays, with one
    device-to-host transfer for all of the device ones."""
    values = list(values)
    idx = [i for i, v in enumerate(values) if isinstance(v, cupy.ndarray)]
    if idx:
        host = cupy.stack([scalar(values[i]) for i in idx]).get()
        for i, v in zip(idx, host):
            values[i] = float(v)
    return [float(v) for v in values]
