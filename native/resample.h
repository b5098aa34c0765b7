// Antialiased bilinear resample with Pillow's exact arithmetic (ImagingResample, 8 bpc):
// triangle filter widened by the downscale factor, coefficients in 22-bit fixed point,
// horizontal pass into a uint8 buffer, then vertical pass. With a float source box this is
// PIL's Image.resize(size, BILINEAR, box=...) — the Python reference the tests compare with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
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

inline uint8_t clip8(int64_t v) {
    v >>= kPrecisionBits;
    return v < 0 ? 0 : (v > 255 ? 255 : (uint8_t)v);
}

// Horizontal pass over rows [y0, y0 + rows) of src (3 channels, src_stride bytes per row).
inline void resample_h(const uint8_t* src, size_t src_stride, int y0, int rows, uint8_t* dst, int out_w,
                       const Coeffs& c) {
    const int64_t half = (int64_t)1 << (kPrecisionBits - 1);
    for (int y = 0; y < rows; y++) {
        const uint8_t* s = src + (size_t)(y0 + y) * src_stride;
        uint8_t* d = dst + (size_t)y * out_w * 3;
        for (int xx = 0; xx < out_w; xx++) {
            int xmin = c.bounds[xx * 2], xmax = c.bounds[xx * 2 + 1];
            const int32_t* k = &c.k[(size_t)xx * c.ksize];
            int64_t s0 = half, s1 = half, s2 = half;
            const uint8_t* p = s + (size_t)xmin * 3;
            for (int x = 0; x < xmax; x++, p += 3) {
                s0 += (int64_t)p[0] * k[x];
                s1 += (int64_t)p[1] * k[x];
                s2 += (int64_t)p[2] * k[x];
            }
            d[xx * 3 + 0] = clip8(s0);
            d[xx * 3 + 1] = clip8(s1);
            d[xx * 3 + 2] = clip8(s2);
        }
    }
}

// Vertical pass: dst row yy = sum over src rows bounds[yy] (relative to src) .
inline void resample_v(const uint8_t* src, size_t src_stride, uint8_t* dst, size_t dst_stride, int width,
                       int out_h, const Coeffs& c, int row_shift) {
    const int64_t half = (int64_t)1 << (kPrecisionBits - 1);
    for (int yy = 0; yy < out_h; yy++) {
        int ymin = c.bounds[yy * 2] - row_shift, ymax = c.bounds[yy * 2 + 1];
        const int32_t* k = &c.k[(size_t)yy * c.ksize];
        uint8_t* d = dst + (size_t)yy * dst_stride;
        for (int x = 0; x < width * 3; x++) {
            int64_t s = half;
            const uint8_t* p = src + (size_t)ymin * src_stride + x;
            for (int y = 0; y < ymax; y++, p += src_stride) s += (int64_t)(*p) * k[y];
            d[x] = clip8(s);
        }
    }
}

// Resample src (in_w × in_h RGB, stride src_stride) restricted to the float box
// (x0, y0, x1, y1) into dst (out_w × out_h RGB, stride dst_stride). tmp is scratch.
inline void resample(const uint8_t* src, int in_w, int in_h, size_t src_stride, double x0, double y0, double x1,
                     double y1, uint8_t* dst, int out_w, int out_h, size_t dst_stride, std::vector<uint8_t>& tmp,
                     Coeffs& ch, Coeffs& cv) {
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
        resample_h(src, src_stride, yfirst, rows, tmp.data(), out_w, ch);
        if (need_v) {
            resample_v(tmp.data(), (size_t)out_w * 3, dst, dst_stride, out_w, out_h, cv, yfirst);
        } else {
            for (int y = 0; y < out_h; y++)
                std::copy_n(tmp.data() + (size_t)y * out_w * 3, (size_t)out_w * 3, dst + (size_t)y * dst_stride);
        }
    } else if (need_v) {
        resample_v(src, src_stride, dst, dst_stride, out_w, out_h, cv, 0);
    } else {
        for (int y = 0; y < out_h; y++)
            std::copy_n(src + (size_t)y * src_stride, (size_t)out_w * 3, dst + (size_t)y * dst_stride);
    }
}

}  // namespace rt
