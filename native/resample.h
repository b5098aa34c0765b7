// Antialiased bilinear resample with Pillow's exact arithmetic (ImagingResample, 8 bpc):
// triangle filter widened by the downscale factor, coefficients in 22-bit fixed point,
// horizontal pass into a uint8 buffer, then vertical pass. With a float source box this is
// PIL's Image.resize(size, BILINEAR, box=...) — the Python reference the tests compare with.
#pragma once

#include <smmintrin.h>  // SSE4.1 (and SSSE3 pshufb): every x86-64 CPU since 2008; built with -msse4.1

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace rt {

constexpr int kPrecisionBits = 32 - 8 - 2;

struct Coeffs {
    int ksize = 0;
    std::vector<int> bounds;  // per output pixel: first input index, count
    std::vector<int32_t> k;   // ksize per output pixel, fixed point
};

inline double bilinear_filter(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

// Pillow's precompute_coeffs + normalize_coeffs_8bpc for one axis.
// in0/in1 are float, as in Pillow (the box reaches C as float), so float boxes round alike.
inline void precompute(int in_size, float in0, float in1, int out_size, Coeffs& c) {
    const double support_unit = 1.0;
    double scale = (double)(in1 - in0) / out_size;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = support_unit * filterscale;
    int ksize = (int)std::ceil(support) * 2 + 1;
    c.ksize = ksize;
    c.bounds.assign(out_size * 2, 0);
    c.k.assign((size_t)out_size * ksize, 0);
    std::vector<double> kd(ksize);
    double ss = 1.0 / filterscale;
    for (int xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            double w = bilinear_filter((x + xmin - center + 0.5) * ss);
            kd[x] = w;
            ww += w;
        }
        for (int x = 0; x < xmax; x++) {
            if (ww != 0.0) kd[x] /= ww;
        }
        int32_t* kk = &c.k[(size_t)xx * ksize];
        for (int x = 0; x < ksize; x++) {
            double v = x < xmax ? kd[x] : 0.0;
            kk[x] = (int32_t)(v < 0 ? (v * (1 << kPrecisionBits) - 0.5) : (v * (1 << kPrecisionBits) + 0.5));
        }
        c.bounds[xx * 2] = xmin;
        c.bounds[xx * 2 + 1] = xmax;
    }
}

inline uint8_t clip8(int32_t v) {
    v >>= kPrecisionBits;
    return v < 0 ? 0 : (v > 255 ? 255 : (uint8_t)v);
}

// 32-bit accumulators are exact, as in Pillow: |sum| ≤ 255 · 2^22 · (1 + rounding) < 2^31.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define RT_CLONES
#endif

// Horizontal pass over rows [y0, y0 + rows) of src (3 channels, src_stride bytes per row).
// Exact Pillow arithmetic without 32-bit vector multiplies (pmulld is 2 µops / 10 cycles on
// Intel cores): each 22-bit coefficient is split as k = kh·2^11 + kl (both fit int16) and
// taps are taken in pairs with pmaddwd over a row re-laid as
//   P[x] = (R[x], R[x+1], G[x], G[x+1], B[x], B[x+1], 0, 0)  (int16 lanes),
// so one pmaddwd gives R, G and B of two taps. Sum = (Σ p·kh)·2^11 + Σ p·kl, exactly.
template <int PAIRS>
static inline void resample_h_row(const __m128i* P, uint8_t* d, int out_w, const int* bounds, const __m128i* kh,
                                  const __m128i* kl, int npairs) {
    const __m128i half = _mm_set1_epi32((int32_t)1 << (kPrecisionBits - 1));
    for (int xx = 0; xx < out_w; xx++) {
        const __m128i* p = P + bounds[xx * 2];
        const __m128i* h = kh + (size_t)xx * npairs;
        const __m128i* l = kl + (size_t)xx * npairs;
        __m128i ah = _mm_setzero_si128(), al = half;
        const int n = PAIRS > 0 ? PAIRS : (bounds[xx * 2 + 1] + 1) / 2;
        for (int j = 0; j < n; j++) {
            const __m128i v = _mm_loadu_si128(p + 2 * j);
            ah = _mm_add_epi32(ah, _mm_madd_epi16(v, h[j]));
            al = _mm_add_epi32(al, _mm_madd_epi16(v, l[j]));
        }
        __m128i acc = _mm_add_epi32(_mm_slli_epi32(ah, 11), al);
        acc = _mm_srai_epi32(acc, kPrecisionBits);
        acc = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc);  // saturation = Pillow's clip8
        uint32_t px = (uint32_t)_mm_cvtsi128_si32(acc);
        d[xx * 3 + 0] = (uint8_t)px;
        d[xx * 3 + 1] = (uint8_t)(px >> 8);
        d[xx * 3 + 2] = (uint8_t)(px >> 16);
    }
}

struct HScratch {
    std::vector<__m128i> P;       // pair-interleaved row, zero-padded
    std::vector<__m128i> kh, kl;  // coefficient pairs, split high/low
};

inline void resample_h(const uint8_t* src, size_t src_stride, int in_w, int y0, int rows, uint8_t* dst, int out_w,
                       const Coeffs& c, HScratch& hs) {
    const int ksize = c.ksize;
    const int npairs = (ksize + 1) / 2;
    hs.P.assign((size_t)in_w + 2 * npairs + 2, _mm_setzero_si128());
    hs.kh.resize((size_t)out_w * npairs);
    hs.kl.resize((size_t)out_w * npairs);
    for (int xx = 0; xx < out_w; xx++) {
        const int32_t* k = &c.k[(size_t)xx * ksize];
        for (int j = 0; j < npairs; j++) {
            int32_t k0 = k[2 * j], k1 = 2 * j + 1 < ksize ? k[2 * j + 1] : 0;
            int16_t h0 = (int16_t)(k0 >> 11), h1 = (int16_t)(k1 >> 11);
            int16_t l0 = (int16_t)(k0 & 0x7FF), l1 = (int16_t)(k1 & 0x7FF);
            hs.kh[(size_t)xx * npairs + j] = _mm_setr_epi16(h0, h1, h0, h1, h0, h1, 0, 0);
            hs.kl[(size_t)xx * npairs + j] = _mm_setr_epi16(l0, l1, l0, l1, l0, l1, 0, 0);
        }
    }
    // bytes R0 G0 B0 R1 G1 B1 → words R0 R1 G0 G1 B0 B1 0 0
    const __m128i shuf = _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
    __m128i* P = hs.P.data();
    const int* bounds = c.bounds.data();
    for (int y = 0; y < rows; y++) {
        const uint8_t* s = src + (size_t)(y0 + y) * src_stride;
        int x = 0;
        for (; x + 2 < in_w; x++) {  // 8-byte load stays inside the row for x ≤ in_w - 3
            P[x] = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i*)(s + 3 * x)), shuf);
        }
        for (; x < in_w; x++) {
            const bool nxt = x + 1 < in_w;
            P[x] = _mm_setr_epi16(s[3 * x], nxt ? s[3 * x + 3] : 0, s[3 * x + 1], nxt ? s[3 * x + 4] : 0, s[3 * x + 2],
                                  nxt ? s[3 * x + 5] : 0, 0, 0);
        }
        uint8_t* d = dst + (size_t)y * out_w * 3;
        // taps beyond a pixel's count have zero weight, so a fixed count is exact too
        switch (npairs) {
            case 2: resample_h_row<2>(P, d, out_w, bounds, hs.kh.data(), hs.kl.data(), npairs); break;
            case 3: resample_h_row<3>(P, d, out_w, bounds, hs.kh.data(), hs.kl.data(), npairs); break;
            case 4: resample_h_row<4>(P, d, out_w, bounds, hs.kh.data(), hs.kl.data(), npairs); break;
            default: resample_h_row<0>(P, d, out_w, bounds, hs.kh.data(), hs.kl.data(), npairs); break;
        }
    }
}

// Vertical pass: taps outer, pixels inner, so the inner loop runs over contiguous bytes and
// vectorises. acc is scratch of width*3 ints. Rows of src are relative to row_shift.
RT_CLONES
inline void resample_v(const uint8_t* src, size_t src_stride, uint8_t* dst, size_t dst_stride, int width,
                       int out_h, const Coeffs& c, int row_shift, std::vector<int32_t>& acc_buf) {
    const int32_t half = (int32_t)1 << (kPrecisionBits - 1);
    const int n = width * 3;
    acc_buf.resize(n);
    int32_t* acc = acc_buf.data();
    for (int yy = 0; yy < out_h; yy++) {
        const int ymin = c.bounds[yy * 2] - row_shift, ymax = c.bounds[yy * 2 + 1];
        const int32_t* k = &c.k[(size_t)yy * c.ksize];
        for (int x = 0; x < n; x++) acc[x] = half;
        for (int y = 0; y < ymax; y++) {
            const uint8_t* row = src + (size_t)(ymin + y) * src_stride;
            const int32_t w = k[y];
            for (int x = 0; x < n; x++) acc[x] += row[x] * w;
        }
        uint8_t* d = dst + (size_t)yy * dst_stride;
        for (int x = 0; x < n; x++) {
            int32_t v = acc[x] >> kPrecisionBits;
            d[x] = (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v));
        }
    }
}

// Resample src (in_w × in_h RGB, stride src_stride) restricted to the float box
// (x0, y0, x1, y1) into dst (out_w × out_h RGB, stride dst_stride). tmp is scratch.
inline void resample(const uint8_t* src, int in_w, int in_h, size_t src_stride, double x0, double y0, double x1,
                     double y1, uint8_t* dst, int out_w, int out_h, size_t dst_stride, std::vector<uint8_t>& tmp,
                     Coeffs& ch, Coeffs& cv, std::vector<int32_t>& acc, HScratch& hs) {
    float fx0 = (float)x0, fy0 = (float)y0, fx1 = (float)x1, fy1 = (float)y1;
    bool need_h = out_w != in_w || fx0 != 0.0f || fx1 != (float)out_w;
    bool need_v = out_h != in_h || fy0 != 0.0f || fy1 != (float)out_h;
    precompute(in_w, fx0, fx1, out_w, ch);
    precompute(in_h, fy0, fy1, out_h, cv);
    int yfirst = cv.bounds[0];
    int ylast = cv.bounds[out_h * 2 - 2] + cv.bounds[out_h * 2 - 1];
    if (need_h) {
        int rows = ylast - yfirst;
        tmp.resize((size_t)rows * out_w * 3);
        resample_h(src, src_stride, in_w, yfirst, rows, tmp.data(), out_w, ch, hs);
        if (need_v) {
            resample_v(tmp.data(), (size_t)out_w * 3, dst, dst_stride, out_w, out_h, cv, yfirst, acc);
        } else {
            for (int y = 0; y < out_h; y++)
                std::copy_n(tmp.data() + (size_t)y * out_w * 3, (size_t)out_w * 3, dst + (size_t)y * dst_stride);
        }
    } else if (need_v) {
        resample_v(src, src_stride, dst, dst_stride, out_w, out_h, cv, 0, acc);
    } else {
        for (int y = 0; y < out_h; y++)
            std::copy_n(src + (size_t)y * src_stride, (size_t)out_w * 3, dst + (size_t)y * dst_stride);
    }
}

}  // namespace rt
