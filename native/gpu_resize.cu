// One kernel for the whole batch after decode: antialiased bilinear resample of each decoded
// window (Pillow's BILINEAR filter: triangle widened by the downscale factor), optional
// horizontal mirror, mean/std normalisation, NCHW or NHWC, float / half / bfloat16 / uint8 output.
// A sample is interleaved RGB (the engines' RGBI output, the CPU share) or, with
// chroma="interpolate", nvJPEG's planar YCbCr / Y: the kernel then makes libjpeg-turbo's RGB
// pixels itself (fancy upsampling, jdsample.c, and jdcolor.c's fixed-point conversion), from the
// whole image's planes or from a region's (ox, oy: where the planes start in the image; the
// kernel works in image coordinates with the whole image's edges, so both give the same pixels).
// Compiled by CuPy (RawModule) at first use. Python reference: recordtool/decode/gpu/reference.py.
// bfloat16 goes into a uint16 CuPy array (CuPy has no bfloat16): the bits, round to nearest even;
// compiled apart (RECORDTOOL_BF16), so a toolkit without cuda_bf16.h costs only that variant.
#include <cuda_fp16.h>
#ifdef RECORDTOOL_BF16
#include <cuda_bf16.h>
#endif

#define FMT_RGB 0    // interleaved RGB at src
#define FMT_YCC 1    // planar Y (src, pitch), Cb (cb, cpitch), Cr (cr, cpitch) subsampled by hs x vs
#define FMT_GRAY 2   // planar Y only

struct Sample {
    const unsigned char* src;  // interleaved RGB or the Y plane, `pitch` bytes per row
    long long pitch;
    int rw, rh;                // decoded region size (planar samples: the image's size)
    float x0, y0, x1, y1;      // window inside the region (float box, Pillow semantics)
    int mirror;
    int format;                // FMT_*
    const unsigned char* cb;   // FMT_YCC: chroma planes, cw x ch samples, `cpitch` bytes per row
    const unsigned char* cr;
    long long cpitch;
    int hs, vs;                // chroma subsampling (1 or 2 each)
    int cw, ch;                // the whole image's chroma plane size (libjpeg's downsampled size)
    int ox, oy;                // planar: image pixel of the planes' first sample (multiples of hs, vs)
};

// One full-resolution chroma sample at image pixel (x, y), as libjpeg-turbo's fancy upsampling
// makes it (jdsample.c h2v1 / h1v2 / h2v2_fancy_upsample; edge samples replicated). Planes of
// <= 2 columns are replicated, as libjpeg does (fancy only when downsampled_width > 2). Indices
// are the whole plane's (cw x ch); p holds it from chroma sample (cx0, cy0) on.
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

__device__ __forceinline__ int chroma_at(const unsigned char* __restrict__ p, long long pitch, int x, int y,
                                         int hs, int vs, int cw, int ch, int cx0, int cy0) {
    if (hs == 1 && vs == 1) return p[(long long)(y - cy0) * pitch + (x - cx0)];
    if (hs == 2 && cw <= 2)
        return p[(long long)(imin(y / vs, ch - 1) - cy0) * pitch + (imin(x >> 1, cw - 1) - cx0)];
    if (hs == 2 && vs == 1) {
        const unsigned char* row = p + (long long)(y - cy0) * pitch;
        const int i = imin(x >> 1, cw - 1);
        const int j = (x & 1) ? imin(i + 1, cw - 1) : imax(i - 1, 0);
        return (3 * row[i - cx0] + row[j - cx0] + ((x & 1) ? 2 : 1)) >> 2;
    }
    const int ri = imin(y >> 1, ch - 1);
    const int rj = (y & 1) ? imin(ri + 1, ch - 1) : imax(ri - 1, 0);
    const unsigned char* r0 = p + (long long)(ri - cy0) * pitch;
    const unsigned char* r1 = p + (long long)(rj - cy0) * pitch;
    if (hs == 1) return (3 * r0[x - cx0] + r1[x - cx0] + ((y & 1) ? 2 : 1)) >> 2;  // h1v2
    const int i = imin(x >> 1, cw - 1) - cx0;
    const int j = ((x & 1) ? imin(i + cx0 + 1, cw - 1) : imax(i + cx0 - 1, 0)) - cx0;
    const int here = 3 * r0[i] + r1[i], there = 3 * r0[j] + r1[j];  // column sums (region indices)
    return (3 * here + there + ((x & 1) ? 7 : 8)) >> 4;
}

__device__ __forceinline__ int clamp255(int v) { return v < 0 ? 0 : (v > 255 ? 255 : v); }

// Image pixel (x, y) of a planar sample as libjpeg's RGB (jdcolor.c ycc_rgb_convert: FIX(1.402)
// = 91881, FIX(1.772) = 116130, FIX(0.71414) = 46802, FIX(0.34414) = 22554, SCALEBITS 16).
__device__ __forceinline__ void planar_rgb(const Sample& s, int x, int y, float& r, float& g, float& b) {
    const int Y = s.src[(long long)(y - s.oy) * s.pitch + (x - s.ox)];
    if (s.format == FMT_GRAY) {
        r = g = b = (float)Y;
        return;
    }
    const int cx0 = s.ox / s.hs, cy0 = s.oy / s.vs;
    const int cb = chroma_at(s.cb, s.cpitch, x, y, s.hs, s.vs, s.cw, s.ch, cx0, cy0) - 128;
    const int cr = chroma_at(s.cr, s.cpitch, x, y, s.hs, s.vs, s.cw, s.ch, cx0, cy0) - 128;
    r = (float)clamp255(Y + ((91881 * cr + 32768) >> 16));
    g = (float)clamp255(Y + ((-22554 * cb + 32768 - 46802 * cr) >> 16));
    b = (float)clamp255(Y + ((116130 * cb + 32768) >> 16));
}

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
                                 float sc0, float sc1, float sc2, float bi0, float bi1, float bi2) {
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
    if (s.format == FMT_RGB) {
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
    } else {  // planar: the same sums over libjpeg's RGB of each source pixel
        for (int y = ylo; y < yhi; y++) {
            const float wy = tri((y - cy + 0.5f) * ify);
            if (wy == 0.f) continue;
            float rr = 0.f, gg = 0.f, bb = 0.f;
            for (int x = xlo; x < xhi; x++) {
                const float wx = tri((x - cx + 0.5f) * ifx);
                float pr, pg, pb;
                planar_rgb(s, x, y, pr, pg, pb);
                rr += wx * pr;
                gg += wx * pg;
                bb += wx * pb;
            }
            r += wy * rr;
            g += wy * gg;
            b += wy * bb;
        }
    }
    r *= norm;
    g *= norm;
    b *= norm;
    if (NORMALIZE) {  // value · scale + bias rounded twice, never fused: the CPU path's floats, bit for bit
        r = __fadd_rn(__fmul_rn(r, sc0), bi0);
        g = __fadd_rn(__fmul_rn(g, sc1), bi1);
        b = __fadd_rn(__fmul_rn(b, sc2), bi2);
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
