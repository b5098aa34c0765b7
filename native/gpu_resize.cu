// One kernel for the whole batch after decode: antialiased bilinear resample of each decoded
// window (Pillow's BILINEAR filter: triangle widened by the downscale factor), optional
// horizontal mirror, mean/std normalisation, NCHW or NHWC, float / half / bfloat16 / uint8 output.
// Compiled by CuPy (RawModule) at first use. Python reference: recordtool/decode/gpu_ref.py.
// bfloat16 goes into a uint16 CuPy array (CuPy has no bfloat16): the bits, round to nearest even;
// compiled apart (RECORDTOOL_BF16), so a toolkit without cuda_bf16.h costs only that variant.
#include <cuda_fp16.h>
#ifdef RECORDTOOL_BF16
#include <cuda_bf16.h>
#endif

struct Sample {
    const unsigned char* src;  // interleaved RGB, `pitch` bytes per row
    long long pitch;
    int rw, rh;                // decoded region size
    float x0, y0, x1, y1;      // window inside the region (float box, Pillow semantics)
    int mirror;
};

template <typename T> __device__ __forceinline__ T convert_out(float v);
template <> __device__ __forceinline__ float convert_out<float>(float v) { return v; }
template <> __device__ __forceinline__ __half convert_out<__half>(float v) { return __float2half_rn(v); }
#ifdef RECORDTOOL_BF16
template <> __device__ __forceinline__ __nv_bfloat16 convert_out<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
#endif
template <> __device__ __forceinline__ unsigned char convert_out<unsigned char>(float v) {
    return (unsigned char)fminf(fmaxf(rintf(v), 0.0f), 255.0f);
}

__device__ __forceinline__ float tri(float x) {
    x = fabsf(x);
    return x < 1.0f ? 1.0f - x : 0.0f;
}

// Filter taps of one output coordinate along one axis (Pillow's precompute_coeffs).
__device__ __forceinline__ void taps(float in0, float in1, int in_size, int out_size, int o, int& lo, int& hi,
                                     float& center, float& inv_fs) {
    float scale = (in1 - in0) / out_size;
    float fs = scale < 1.0f ? 1.0f : scale;
    float support = fs;
    center = in0 + (o + 0.5f) * scale;
    lo = (int)(center - support + 0.5f);
    if (lo < 0) lo = 0;
    hi = (int)(center + support + 0.5f);
    if (hi > in_size) hi = in_size;
    inv_fs = 1.0f / fs;
}

// grid: (ceil(W/32), ceil(H/8), N); block (32, 8)
template <typename T, bool NCHW, bool NORMALIZE>
__global__ void resize_normalize(const Sample* __restrict__ samples, T* __restrict__ out, int W, int H,
                                 float m0, float m1, float m2, float s0, float s1, float s2) {
    const int ox = blockIdx.x * blockDim.x + threadIdx.x;
    const int oy = blockIdx.y * blockDim.y + threadIdx.y;
    const int n = blockIdx.z;
    if (ox >= W || oy >= H) return;
    const Sample s = samples[n];
    const int sx = s.mirror ? (W - 1 - ox) : ox;  // mirrored output column reads this source column
    int xlo, xhi, ylo, yhi;
    float cx, cy, ifx, ify;
    taps(s.x0, s.x1, s.rw, W, sx, xlo, xhi, cx, ifx);
    taps(s.y0, s.y1, s.rh, H, oy, ylo, yhi, cy, ify);
    float wxs = 0.f, wys = 0.f;
    for (int x = xlo; x < xhi; x++) wxs += tri((x - cx + 0.5f) * ifx);
    for (int y = ylo; y < yhi; y++) wys += tri((y - cy + 0.5f) * ify);
    const float norm = 1.0f / ((wxs == 0.f ? 1.f : wxs) * (wys == 0.f ? 1.f : wys));
    float r = 0.f, g = 0.f, b = 0.f;
    for (int y = ylo; y < yhi; y++) {
        const float wy = tri((y - cy + 0.5f) * ify);
        if (wy == 0.f) continue;
        const unsigned char* row = s.src + (long long)y * s.pitch;
        float rr = 0.f, gg = 0.f, bb = 0.f;
        for (int x = xlo; x < xhi; x++) {
            const float wx = tri((x - cx + 0.5f) * ifx);
            const unsigned char* p = row + 3 * x;
            rr += wx * p[0];
            gg += wx * p[1];
            bb += wx * p[2];
        }
        r += wy * rr;
        g += wy * gg;
        b += wy * bb;
    }
    r *= norm;
    g *= norm;
    b *= norm;
    if (NORMALIZE) {
        r = (r * (1.0f / 255.0f) - m0) / s0;
        g = (g * (1.0f / 255.0f) - m1) / s1;
        b = (b * (1.0f / 255.0f) - m2) / s2;
    }
    const long long plane = (long long)H * W;
    if (NCHW) {
        T* o = out + (long long)n * 3 * plane + (long long)oy * W + ox;
        o[0] = convert_out<T>(r);
        o[plane] = convert_out<T>(g);
        o[2 * plane] = convert_out<T>(b);
    } else {
        T* o = out + ((long long)n * plane + (long long)oy * W + ox) * 3;
        o[0] = convert_out<T>(r);
        o[1] = convert_out<T>(g);
        o[2] = convert_out<T>(b);
    }
}
