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

from ada_loss.formats import get_format
from ada_loss.loss_scale.gemm import check_bound, erfinv

_THREADS = 256
_MAX_BLOCKS = 1024

_SOURCE = r'''
#define NAN_MAX(a, b) ((((b) > (a)) || ((b) != (b))) ? (b) : (a))

__device__ __forceinline__ float load(const float* p, long long i) {
    return p[i];
}

// IEEE binary16 bits -> float, exactly (subnormals, Inf, NaN).
__device__ __forceinline__ float load(const unsigned short* p, long long i) {
    unsigned int h = p[i];
    unsigned int e = (h >> 10) & 31u, m = h & 1023u;
    float v;
    if (e == 0u) v = ldexpf((float)m, -24);
    else if (e == 31u) v = m ? __int_as_float(0x7fc00000) : __int_as_float(0x7f800000);
    else v = ldexpf((float)(m | 1024u), (int)e - 25);
    return (h & 0x8000u) ? -v : v;
}

template <typename T>
__device__ void partial(const T* x, long long n, double* psum, float* pmax) {
    __shared__ double ss[256];
    __shared__ float sm[256];
    double s = 0.0;
    float m = 0.0f;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        float v = load(x, i);
        s += (double)v * (double)v;
        float a = fabsf(v);
        m = NAN_MAX(m, a);
    }
    int t = threadIdx.x;
    ss[t] = s;
    sm[t] = m;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (t < k) {
            ss[t] += ss[t + k];
            sm[t] = NAN_MAX(sm[t], sm[t + k]);
        }
        __syncthreads();
    }
    if (t == 0) {
        psum[blockIdx.x] = ss[0];
        pmax[blockIdx.x] = sm[0];
    }
}

extern "C" __global__ void partial_f32(const float* x, long long n,
                                       double* psum, float* pmax) {
    partial<float>(x, n, psum, pmax);
}

extern "C" __global__ void partial_f16(const unsigned short* x, long long n,
                                       double* psum, float* pmax) {
    partial<unsigned short>(x, n, psum, pmax);
}

// One block: the partials in a fixed order -> E[x^2], max|x| (float64).
extern "C" __global__ void finish(const double* psum, const float* pmax,
                                  int nb, long long n, double* out) {
    __shared__ double ss[256];
    __shared__ float sm[256];
    int t = threadIdx.x;
    double s = 0.0;
    float m = 0.0f;
    for (int i = t; i < nb; i += blockDim.x) {
        s += psum[i];
        m = NAN_MAX(m, pmax[i]);
    }
    ss[t] = s;
    sm[t] = m;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (t < k) {
            ss[t] += ss[t + k];
            sm[t] = NAN_MAX(sm[t], sm[t + k]);
        }
        __syncthreads();
    }
    if (t == 0) {
        out[0] = ss[0] / (double)n;
        out[1] = (double)sm[0];
    }
}

__device__ __forceinline__ double round_down_pow2(double x) {
    int e;
    frexp(x, &e);
    return ldexp(1.0, e - 1);
}

// Algorithm 4 + section 3.2.3 + the max_accum_scale cap, as
// ada_loss.loss_scale.gemm.gemm_loss_scale and AdaLossScaled._cap_accum.
// bound: 0 output, 1 product, 2 fan_in.
extern "C" __global__ void beta(const double* w, const double* g,
                                const double* gain, const double* alpha,
                                double u_min, double u_max, double sqrt2,
                                double erfinv_t, int bound, double fan_in,
                                double max_scale, double max_accum,
                                double* out) {
    double b;
    double sigma_p = sqrt(w[0] * g[0]);
    if (!(sigma_p > 0.0)) {
        b = 1.0;
    } else {
        double lower = u_min / (sigma_p * sqrt2 * erfinv_t);
        if (!isfinite(lower)) {
            b = 1.0;
        } else {
            b = lower > 1.0 ? lower : 1.0;
            double peak = bound == 0 ? g[1] * gain[0] : w[1] * g[1];
            if (bound == 2) peak *= fan_in;
            bool done = false;
            if (peak > 0.0) {
                double upper = u_max / peak;
                if (!(isfinite(upper) && upper > 0.0)) {
                    b = 1.0;
                    done = true;
                } else if (upper < b) {
                    b = upper;
                }
            }
            if (!done) {
                if (max_scale > 0.0 && max_scale < b) b = max_scale;
                b = round_down_pow2(b);
            }
        }
    }
    if (max_accum > 0.0 && alpha[0] * b > max_accum)
        b = round_down_pow2(max_accum / alpha[0]);
    out[0] = b;
}

extern "C" __global__ void cap_accum(const double* beta, const double* alpha,
                                     double max_accum, double* out) {
    double b = beta[0];
    if (alpha[0] * b > max_accum) b = round_down_pow2(max_accum / alpha[0]);
    out[0] = b;
}

// Algorithm 5 (ada_loss.loss_scale.branch.common_scale) for k gradients
// with scales a[i] and peaks p[i] = max|delta_i|.
__device__ bool fits_all(double alpha, const double* a, const double* p,
                         int k, double u_max) {
    bool fits = true;
    for (int i = 0; i < k; ++i) fits = fits && (alpha / a[i] * p[i] < u_max);
    return fits;
}

extern "C" __global__ void common_scale(const double* a, const double* p,
                                        int k, double u_max,
                                        int max_halvings, double* out) {
    double lo = a[0], hi = a[0];
    for (int i = 1; i < k; ++i) {
        lo = a[i] < lo ? a[i] : lo;
        hi = a[i] > hi ? a[i] : hi;
    }
    if (lo == hi) { out[0] = hi; return; }
    for (int i = 0; i < k; ++i) {
        if (!isfinite(p[i])) { out[0] = lo; return; }
    }
    double best = -1.0;
    for (int c = 0; c < k; ++c) {
        if (a[c] > best && fits_all(a[c], a, p, k, u_max)) best = a[c];
    }
    if (best > 0.0) { out[0] = best; return; }
    double alpha = lo;
    for (int h = 0; h < max_halvings; ++h) {
        alpha /= 2.0;
        if (fits_all(alpha, a, p, k, u_max)) break;
    }
    out[0] = alpha;
}
'''


@functools.lru_cache(maxsize=None)
def _module(device_id):
    # One compiled module per device; --fmad=false: no fused multiply-add,
    # so the double arithmetic matches the host's operation by operation.
    return cupy.RawModule(code=_SOURCE, options=('--std=c++14',
                                                 '--fmad=false'))


def _kernel(name):
    return _module(cupy.cuda.Device().id).get_function(name)


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
    first). An empty array gives (0, 0)."""
    out = cupy.empty(2, dtype=cupy.float64)
    n = a.size
    if n == 0:
        out[...] = 0
        return out
    if a.dtype == cupy.float16:
        x, name = cupy.ascontiguousarray(a).view(cupy.uint16), 'partial_f16'
    else:
        x = cupy.ascontiguousarray(a, dtype=cupy.float32)
        name = 'partial_f32'
    blocks = min(_MAX_BLOCKS, (n + _THREADS - 1) // _THREADS)
    psum = cupy.empty(blocks, dtype=cupy.float64)
    pmax = cupy.empty(blocks, dtype=cupy.float32)
    _kernel(name)((blocks,), (_THREADS,), (x, cupy.int64(n), psum, pmax))
    _kernel('finish')((1,), (_THREADS,),
                      (psum, pmax, cupy.int32(blocks), cupy.int64(n), out))
    return out


def max_abs(a):
    """max|a| as a 0-d float64 device array (NaN propagates; 0 if empty)."""
    return moments(a)[1]


def grad_input_gain(W, axes):
    """max_j Σ_i |W_ij| over ``axes`` (see
    :func:`ada_loss.loss_scale.gemm.grad_input_gain`), a 0-d float64 device
    array, accumulated in float64."""
    if W.size == 0:
        return cupy.zeros((), dtype=cupy.float64)
    return cupy.abs(W.astype(cupy.float64)).sum(axis=axes).max()


_BOUND_CODES = {'output': 0, 'product': 1, 'fan_in': 2}


def gemm_loss_scale(W, g, t_uf=1e-3, fmt='float16', bound='product',
                    gain=None, max_scale=None, alpha=None,
                    max_accum_scale=None, w_moments=None):
    """β of one GEMM on the device (0-d float64), as
    :func:`ada_loss.loss_scale.gemm.gemm_loss_scale` followed by the
    ``max_accum_scale`` cap of α·β (when given, with the layer's α).

    Args:
        gain: 0-d device array or number (``bound='output'``).
        w_moments: :func:`moments` of W, if already computed this update.
    """
    if not 0 < t_uf < 1:
        raise ValueError('t_uf must be in (0, 1), got {!r}'.format(t_uf))
    check_bound(bound)
    if bound == 'output' and gain is None:
        raise ValueError("bound='output' needs the GEMM's gain")
    f = get_format(fmt)
    wm = moments(W) if w_moments is None else w_moments
    gm = moments(g)
    gain = scalar(0.0 if gain is None else gain)
    alpha = scalar(1.0 if alpha is None else alpha)
    out = cupy.empty((), dtype=cupy.float64)
    _kernel('beta')((1,), (1,), (
        wm, gm, gain, alpha, f.u_min, f.u_max, math.sqrt(2.0),
        erfinv(t_uf), cupy.int32(_BOUND_CODES[bound]),
        float(W.size // W.shape[0]) if W.ndim else 1.0,
        float(max_scale or 0.0), float(max_accum_scale or 0.0), out))
    return out


def cap_accum(beta, alpha, max_accum_scale):
    """β lowered so that α·β ≤ ``max_accum_scale`` (a power of two)."""
    if max_accum_scale is None:
        return beta
    out = cupy.empty((), dtype=cupy.float64)
    _kernel('cap_accum')((1,), (1,), (scalar(beta), scalar(alpha),
                                      float(max_accum_scale), out))
    return out


def common_scale(scales, peaks, u_max, max_halvings=64):
    """Algorithm 5 on the device: ``scales`` and ``peaks`` are lists of 0-d
    float64 device arrays (α_k and max|δ_k|); returns a 0-d float64 array."""
    k = len(scales)
    a = cupy.stack([scalar(v) for v in scales])    # device copies only
    p = cupy.stack([scalar(v) for v in peaks])
    out = cupy.empty((), dtype=cupy.float64)
    _kernel('common_scale')((1,), (1,), (
        a, p, cupy.int32(k), float(u_max), cupy.int32(max_halvings), out))
    return out


_rescale_f = cupy.ElementwiseKernel(
    'T x, float64 r', 'T y', 'y = (T)((float)x * (float)r)',
    'ada_loss_rescale_f')
_rescale_d = cupy.ElementwiseKernel(
    'T x, float64 r', 'T y', 'y = x * r', 'ada_loss_rescale_d')


def rescale(x, ratio):
    """``ratio · x`` for a power-of-two 0-d device ``ratio``: float16 and
    float32 arrays are multiplied in FP32 and rounded once (exact up to
    underflow/overflow of the result), float64 in FP64."""
    ratio = scalar(ratio)
    if x.dtype in (cupy.float16, cupy.float32):
        return _rescale_f(x, ratio)
    return _rescale_d(x, ratio)


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


# -- diagnostics: does code wait for the device? ---------------------------
_SPIN = r'''
extern "C" __global__ void ada_loss_spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
'''


def count_synchronizations(fn):
    """Runs ``fn()``; returns the number of device synchronizations CuPy
    declared meanwhile (``cupy._core.syncdetect``: device-to-host copies,
    ``float()``/``bool()`` of device arrays, stream synchronizations)."""
    from cupy._core import syncdetect
    count = [0]
    original = syncdetect._declare_synchronize

    def counting():
        count[0] += 1
        return original()
    syncdetect._declare_synchronize = counting
    try:
        fn()
    finally:
        syncdetect._declare_synchronize = original
    return count[0]


def waits_for_device(fn, seconds=1.0):
    """Runs ``fn()`` behind a kernel that spins for ``seconds`` on the same
    stream; True if the host waited for the device during ``fn`` (any
    synchronization, declared by CuPy or not, waits for the spin)."""
    spin = cupy.RawKernel(_SPIN, 'ada_loss_spin')
    rate = cupy.cuda.runtime.getDeviceProperties(
        cupy.cuda.Device().id)['clockRate'] * 1e3     # kHz -> Hz
    done = cupy.cuda.Event()
    cupy.cuda.Device().synchronize()
    spin((1,), (1,), (cupy.int64(int(rate * seconds)),))
    done.record()
    fn()
    waited = done.done
    cupy.cuda.Device().synchronize()
    return waited
