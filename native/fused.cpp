// Fused JPEG decode → crop window → resize, over libjpeg-turbo's libjpeg API.
//
// Per image: read the header, pick the smallest DCT scale (1/4, 1/2, 1) that keeps the window
// at least the output size (× a margin, see choose_scale), decode only the window's columns (jpeg_crop_scanline) and rows
// (jpeg_skip_scanlines, then abort: rows below the window are never decoded), then resample
// with Pillow's BILINEAR arithmetic (resample.h) straight into the output slot.
// A batch runs on a persistent thread pool, GIL released; tasks are taken largest image
// first through an atomic counter so one huge image never leaves the other threads idle.
// Python references: recordtool/decode/reference.py (used by the tests).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <malloc.h>
#include <mutex>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

extern "C" {
#include <jpeglib.h>
#include <jerror.h>
}

#include "resample.h"

namespace py = pybind11;

namespace rt {

// ------------------------------------------------------------------ libjpeg error handling

// Limits that keep a small hostile file from costing unbounded time or memory (README,
// Security). Python reference: recordtool.format.jpeg (MAX_SCANS, COEF_RATIO, COEF_FLOOR,
// decode_refusal), which pack and verify apply to the same header fields.
constexpr int kMaxScans = 100;            // progressive files: more scans than this are refused
constexpr long long kCoefRatio = 1024;    // multi-scan coefficient buffer ≤ ratio × file size …
constexpr long long kCoefFloor = 4 << 20; // … or this many bytes, whichever is larger
constexpr int kMaxSide = 16384;           // output sides (and the resampler's) above this are refused

struct ErrorMgr {
    jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
    bool truncated;       // JWRN_JPEG_EOF: the pixels would be made up
    bool corrupt;         // any other libjpeg warning: corrupt data (as verify --decode counts them)
    char warning[JMSG_LENGTH_MAX];
};

static void on_error_exit(j_common_ptr cinfo) {
    ErrorMgr* err = reinterpret_cast<ErrorMgr*>(cinfo->err);
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_emit_message(j_common_ptr cinfo, int level) {
    // level -1: a warning (corrupt or missing data; libjpeg goes on with made-up pixels).
    if (level >= 0) return;
    ErrorMgr* err = reinterpret_cast<ErrorMgr*>(cinfo->err);
    if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
        err->truncated = true;
    } else if (!err->corrupt) {
        err->corrupt = true;
        (*cinfo->err->format_message)(cinfo, err->warning);
    }
}

// Called by libjpeg between input passes (once per consumed iMCU row or marker): refuse a file
// whose scan count passes kMaxScans (as tjbench -maxscans / libjpeg-turbo's TJPARAM_SCANLIMIT).
struct ScanLimit {
    jpeg_progress_mgr pub;
    int max_scans;
};

static void on_progress(j_common_ptr cinfo) {
    if (!cinfo->is_decompressor) return;
    j_decompress_ptr d = reinterpret_cast<j_decompress_ptr>(cinfo);
    const ScanLimit* lim = reinterpret_cast<const ScanLimit*>(cinfo->progress);
    if (d->input_scan_number > lim->max_scans) {
        ErrorMgr* err = reinterpret_cast<ErrorMgr*>(cinfo->err);
        std::snprintf(err->message, sizeof(err->message), "more than %d scans (scan limit; hostile progressive file?)",
                      lim->max_scans);
        longjmp(err->jump, 1);
    }
}

// Bytes of 64 int16 coefficients for every block of the image, each component's blocks padded
// to its sampling factors: what libjpeg allocates for the whole-image coefficient buffer of a
// multi-scan file (progressive, or sequential with one scan per component). A complete
// Huffman-coded file spends at least a bit per block, so single-scan files are held to the
// same bound (format.jpeg.decode_refusal): a few bytes declaring 8192x8192 are refused.
static bool multi_scan(const jpeg_decompress_struct& c) {
    return c.progressive_mode || c.comps_in_scan < c.num_components;
}

static long long coef_bytes(const jpeg_decompress_struct& c) {
    const long long maxh = c.max_h_samp_factor, maxv = c.max_v_samp_factor;
    const long long mcux = (c.image_width + 8 * maxh - 1) / (8 * maxh);
    const long long mcuy = (c.image_height + 8 * maxv - 1) / (8 * maxv);
    long long blocks = 0;
    for (int k = 0; k < c.num_components; k++)
        blocks += mcux * c.comp_info[k].h_samp_factor * mcuy * c.comp_info[k].v_samp_factor;
    return blocks * 64 * 2;
}

static void on_output_message(j_common_ptr) {}

// ------------------------------------------------------------------ scale choice

// DCT scaling M/8 for M in {2, 4} (then 8 = none): the smallest that keeps the window at
// least margin × the output size. Measured on this project's images (BENCHMARKS.md):
// - only 1/2 and 1/4 have SIMD IDCTs; 5/8–7/8 decode *slower* than 8/8 (scalar 10×10–14×14
//   chroma IDCTs), 3/8 slower than 4/8. 1/8 is DC-only, an 8×8 box filter: 31–37 dB.
// - margin > 1 keeps a real antialiasing step after the DCT downscale, which is sharper than
//   Pillow's triangle filter: worst case 40.3 dB at margin 1.0, 41.9 dB at 1.1.
// - chroma subsampled in one direction only (4:2:2, 4:4:0, 4:1:1) loses colour detail at
//   2/8 (33 dB): min_m 4 there.
inline int choose_scale(double win_w, double win_h, int out_w, int out_h, double margin, int min_m) {
    for (int m = 2; m <= 4; m *= 2) {
        if (m >= min_m && win_w * m / 8.0 >= out_w * margin && win_h * m / 8.0 >= out_h * margin) return m;
    }
    return 8;
}

inline int min_scale(const jpeg_decompress_struct& cinfo) {
    if (cinfo.num_components >= 3) {
        const jpeg_component_info* c = cinfo.comp_info;
        int rh = c[0].h_samp_factor / std::max(1, c[1].h_samp_factor);
        int rv = c[0].v_samp_factor / std::max(1, c[1].v_samp_factor);
        if (rh != rv) return 4;
    }
    return 2;
}

constexpr size_t kKeepBytes = 48u << 20;  // per-thread region buffer kept between batches

struct Scratch {
    std::vector<uint8_t> region;  // decoded window rows (crop-scanline width)
    std::vector<JSAMPROW> rowptr;
    std::vector<uint8_t> rgb;     // CMYK converted
    std::vector<uint8_t> tmp;     // resample horizontal pass
    std::vector<int32_t> acc;     // resample vertical accumulators
    HScratch hs;                  // resample horizontal pass
    Coeffs ch, cv;
    std::vector<uint8_t> tile;    // one resampled image before the fused normalize (Emit)
};

// Per-thread decode buffers, kept across batches (and reserved up front by `reserve`).
static Scratch& scratch() {
    static thread_local Scratch s;
    return s;
}

struct Task {
    const uint8_t* data;
    size_t size;
    double y, x, h, w;  // window in source pixels
    uint8_t* out;       // out_h × out_w × 3
    int status = 0;     // 0 ok, else error
    std::string message;
};

struct Params {
    int out_w, out_h;
    long long max_pixels;
    int force_scale;  // 0: choose; else M in 1..8 (tests)
    double margin;
};

// The fused output pass: one resampled uint8 image (h × w × 3, RGB) → mirrored if asked,
// x · scale + bias per channel, float32, float16 or bfloat16, NCHW or NHWC — what the GPU kernel does
// after its resample. Runs on the decode thread right after the resample, while the tile is in
// cache. Python reference: recordtool.decode.ops.normalize_reference.
enum OutKind { OUT_F32 = 0, OUT_F16 = 1, OUT_BF16 = 2 };

struct Emit {
    bool on = false;
    int kind = OUT_F32;
    bool nchw = true;
    float scale[3], bias[3];
    const bool* flips = nullptr;
    void* out = nullptr;  // N × 3 × h × w (or N × h × w × 3) elements of float, half or bfloat16
};

// float → bfloat16 bits, round to nearest even (as torch's .to(torch.bfloat16)); finite inputs only.
static inline uint16_t to_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

// The output element type from the array's dtype: float32, float16, or uint16 holding bfloat16
// bits (numpy has no bfloat16; recordtool.decode.spec hands such arrays out as bfloat16).
static int out_kind(const py::array& a, const char* what) {
    if (a.dtype().is(py::dtype::of<float>())) return OUT_F32;
    if (a.dtype().is(py::dtype("float16"))) return OUT_F16;
    if (a.dtype().is(py::dtype::of<uint16_t>())) return OUT_BF16;
    throw std::invalid_argument(std::string(what) + " must be float32, float16 or uint16 (bfloat16 bits)");
}

// float → IEEE half, round to nearest even (as numpy's astype(float16)); finite inputs only.
static inline uint16_t to_half(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7FFFFFFFu;
    if (x >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // overflow → inf
    if (x < 0x38800000u) {                                    // subnormal half (or zero)
        if (x < 0x33000000u) return (uint16_t)sign;
        const uint32_t e = x >> 23, m = (x & 0x7FFFFFu) | 0x800000u;
        const uint32_t shift = 126 - e;  // half subnormal = m · 2^(e - 150) / 2^-24
        const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        uint32_t r = m >> shift;
        if (rem > halfway || (rem == halfway && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = x - 0x38000000u;  // rebias exponent 127 → 15
    const uint32_t rem = r & 0x1FFFu;
    r >>= 13;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}


static Emit make_emit(int kind, bool nchw, const std::vector<float>& scale, const std::vector<float>& bias,
                      const bool* flips, void* out) {
    Emit e;
    e.on = true;
    e.kind = kind;
    e.nchw = nchw;
    for (int c = 0; c < 3; c++) {
        e.scale[c] = scale[c];
        e.bias[c] = bias[c];
    }
    e.flips = flips;
    e.out = out;
    return e;
}

static void emit_one(const Emit& e, const uint8_t* img, int H, int W, size_t n) {
    const bool flip = e.flips[n];
    const size_t plane = (size_t)H * W, base = n * plane * 3;
    for (int y = 0; y < H; y++) {
        const uint8_t* row = img + (size_t)y * W * 3;
        for (int x = 0; x < W; x++) {
            const uint8_t* q = row + 3 * (flip ? (W - 1 - x) : x);
            for (int c = 0; c < 3; c++) {
                const float v = q[c] * e.scale[c] + e.bias[c];
                const size_t o = e.nchw ? base + c * plane + (size_t)y * W + x : base + ((size_t)y * W + x) * 3 + c;
                if (e.kind == OUT_F16) static_cast<uint16_t*>(e.out)[o] = to_half(v);
                else if (e.kind == OUT_BF16) static_cast<uint16_t*>(e.out)[o] = to_bf16(v);
                else static_cast<float*>(e.out)[o] = v;
            }
        }
    }
}

// A per-image user op compiled by Numba (recordtool.ops): called by the decode thread on each
// resampled image while it is in cache — after the resize, before mirror and normalize — without
// the GIL. ABI: int32 op(uint8* img, int64 height, int64 width, int64 row_stride_bytes,
// const double* params), img RGB HWC edited in place, params this image's row of the (N, k)
// array of keyed draws the caller computed; 0 = ok, anything else is reported back in
// status[n]. Plain C (a Numba cfunc): it cannot throw. Python reference:
// recordtool.decode.cpu.apply_op_reference (the same function through ctypes).
using OpFn = int32_t (*)(uint8_t*, int64_t, int64_t, int64_t, const double*);

struct UserOp {
    OpFn fn = nullptr;
    const double* params = nullptr;  // N × k, row n for image n
    int64_t k = 0;
    int32_t* status = nullptr;       // N: what the op returned per image
};

static inline void run_op(const UserOp& op, uint8_t* img, int H, int W, size_t n) {
    op.status[n] = op.fn(img, H, W, (int64_t)W * 3, op.params + n * op.k);
}

// Decode the window of one JPEG and resample it into task.out. Returns false with a reason.
// libjpeg errors come back through longjmp to the setjmp below; C++ exceptions (allocation
// of the region buffer, …) are caught here: every failure is this image's, never the process's.
static bool run_one(Task& t, const Params& p, Scratch& s) {
    jpeg_decompress_struct cinfo;
    ErrorMgr err;
    ScanLimit limit;
    std::memset(&err, 0, sizeof(err));
    std::memset(&limit, 0, sizeof(limit));
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error_exit;
    err.pub.emit_message = on_emit_message;
    err.pub.output_message = on_output_message;
    limit.pub.progress_monitor = on_progress;
    limit.max_scans = kMaxScans;
    if (setjmp(err.jump)) {
        t.message = std::string("libjpeg: ") + err.message;
        jpeg_destroy_decompress(&cinfo);
        return false;
    }
    jpeg_create_decompress(&cinfo);
    if (t.size == 0) {
        t.message = "empty buffer";
        jpeg_destroy_decompress(&cinfo);
        return false;
    }
    try {
        cinfo.progress = &limit.pub;
        jpeg_mem_src(&cinfo, t.data, (unsigned long)t.size);
        jpeg_read_header(&cinfo, TRUE);
        const long long W = cinfo.image_width, H = cinfo.image_height;
        if (W * H > p.max_pixels) {
            t.message = "header declares " + std::to_string(W) + "x" + std::to_string(H) + ", more than max_pixels " +
                        std::to_string(p.max_pixels);
            jpeg_destroy_decompress(&cinfo);
            return false;
        }
        const long long coef = coef_bytes(cinfo);
        if (coef > std::max(kCoefFloor, kCoefRatio * (long long)t.size)) {
            t.message = multi_scan(cinfo)
                            ? "multi-scan JPEG declares " + std::to_string(W) + "x" + std::to_string(H) + ": its " +
                                  std::to_string(coef) + "-byte coefficient buffer is more than " +
                                  std::to_string(kCoefRatio) + "x its " + std::to_string(t.size) +
                                  " bytes (truncated or hostile file)"
                            : "JPEG declares " + std::to_string(W) + "x" + std::to_string(H) + " in " +
                                  std::to_string(t.size) + " bytes: its " + std::to_string(coef / 128) +
                                  " blocks need at least a bit each (truncated or hostile file)";
            jpeg_destroy_decompress(&cinfo);
            return false;
        }
        // the window must hold at least part of a pixel: x < W, y < H (a window starting at the
        // right or bottom edge would be an empty crop)
        if (!(t.w > 0 && t.h > 0 && t.x >= 0 && t.y >= 0 && t.x < W && t.y < H && t.x + t.w <= W + 1e-6 &&
              t.y + t.h <= H + 1e-6)) {
            t.message = "window (y=" + std::to_string(t.y) + ", x=" + std::to_string(t.x) + ", h=" +
                        std::to_string(t.h) + ", w=" + std::to_string(t.w) + ") outside the " + std::to_string(W) +
                        "x" + std::to_string(H) + " image";
            jpeg_destroy_decompress(&cinfo);
            return false;
        }
        const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
        cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
        int m = p.force_scale ? p.force_scale
                              : choose_scale(t.w, t.h, p.out_w, p.out_h, p.margin, min_scale(cinfo));
        cinfo.scale_num = m;
        cinfo.scale_denom = 8;
        jpeg_start_decompress(&cinfo);  // progressive files: every scan is read here
        const int SW = cinfo.output_width, SH = cinfo.output_height;
        const double sc = m / 8.0;
        // window in scaled pixels, and the whole-pixel region that holds it (at least one pixel,
        // inside the scaled image)
        double bx0 = t.x * sc, by0 = t.y * sc, bx1 = (t.x + t.w) * sc, by1 = (t.y + t.h) * sc;
        int rx0 = std::min(SW - 1, (int)std::floor(bx0 + 1e-9)), ry0 = std::min(SH - 1, (int)std::floor(by0 + 1e-9));
        int rx1 = std::min(SW, (int)std::ceil(bx1 - 1e-9)), ry1 = std::min(SH, (int)std::ceil(by1 - 1e-9));
        if (rx1 <= rx0) rx1 = rx0 + 1;
        if (ry1 <= ry0) ry1 = ry0 + 1;
        JDIMENSION xoff = rx0, cw = rx1 - rx0;
        if (rx0 > 0 || rx1 < SW) jpeg_crop_scanline(&cinfo, &xoff, &cw);  // xoff moves down to an iMCU edge
        const int lead = rx0 - (int)xoff;
        const int comps = cinfo.output_components;
        const size_t row_bytes = (size_t)cinfo.output_width * comps;  // crop_scanline width
        const int rows = ry1 - ry0;
        const int rw = rx1 - rx0;
        if (ry0 > 0) jpeg_skip_scanlines(&cinfo, ry0);
        // libjpeg writes the rows straight into the region buffer, many rows per call
        s.region.resize((size_t)rows * row_bytes);
        s.rowptr.resize(rows);
        for (int r = 0; r < rows; r++) s.rowptr[r] = s.region.data() + (size_t)r * row_bytes;
        int done = 0;
        while (done < rows) {
            JDIMENSION got = jpeg_read_scanlines(&cinfo, s.rowptr.data() + done, rows - done);
            if (got == 0) {
                t.message = "decoder returned no row " + std::to_string(ry0 + done);
                jpeg_destroy_decompress(&cinfo);
                return false;
            }
            done += got;
        }
        const uint8_t* src = s.region.data() + (size_t)lead * comps;
        size_t src_stride = row_bytes;
        if (cmyk) {
            // Pillow's CMYK → RGB (Adobe files store inverted CMYK)
            const bool inv = cinfo.saw_Adobe_marker;
            s.rgb.resize((size_t)rows * rw * 3);
            for (int r = 0; r < rows; r++) {
                const uint8_t* q = src + (size_t)r * row_bytes;
                uint8_t* d = s.rgb.data() + (size_t)r * rw * 3;
                for (int x = 0; x < rw; x++) {
                    int c = q[4 * x], mg = q[4 * x + 1], y = q[4 * x + 2], k = q[4 * x + 3];
                    if (!inv) { c = 255 - c; mg = 255 - mg; y = 255 - y; k = 255 - k; }
                    // here c, mg, y, k are 255 - ink: R = (255 - C)(255 - K) / 255
                    auto mul = [](int a, int b) { int tmp = a * b + 128; return (uint8_t)((tmp + (tmp >> 8)) >> 8); };
                    d[3 * x] = mul(c, k);
                    d[3 * x + 1] = mul(mg, k);
                    d[3 * x + 2] = mul(y, k);
                }
            }
            src = s.rgb.data();
            src_stride = (size_t)rw * 3;
        }
        // window down to the last row: read on to the EOI marker (cheap: no more rows to
        // decode), so damage at the end of the data (extraneous bytes, …) is seen too
        if (ry1 == SH && cinfo.output_scanline == cinfo.output_height) jpeg_finish_decompress(&cinfo);
        const bool truncated = err.truncated, corrupt = err.corrupt;
        jpeg_abort_decompress(&cinfo);  // rows below the window are never decoded
        jpeg_destroy_decompress(&cinfo);
        if (truncated) {
            t.message = "truncated: premature end of JPEG data inside the crop window";
            return false;
        }
        if (corrupt) {  // libjpeg went on with made-up pixels: a failure, as in verify --decode
            t.message = std::string("libjpeg: ") + err.warning;
            return false;
        }
        resample(src, rw, rows, src_stride, bx0 - rx0, by0 - ry0, bx1 - rx0, by1 - ry0, t.out, p.out_w, p.out_h,
                 (size_t)p.out_w * 3, s.tmp, s.ch, s.cv, s.acc, s.hs);
        return true;
    } catch (const std::bad_alloc&) {
        t.message = "out of memory decoding this image (std::bad_alloc)";
    } catch (const std::exception& e) {
        t.message = std::string("internal error: ") + e.what();
    }
    jpeg_destroy_decompress(&cinfo);  // safe after a partial decode, and after destroy (no-op)
    return false;
}

// Task order: largest encoded size first, ties by batch position. A huge image started last
// would leave every other thread idle while it finishes.
inline std::vector<uint32_t> largest_first(const std::vector<size_t>& sizes) {
    std::vector<uint32_t> order(sizes.size());
    for (size_t i = 0; i < sizes.size(); i++) order[i] = (uint32_t)i;
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return sizes[a] > sizes[b]; });
    return order;
}

// ------------------------------------------------------------------ thread pool

struct ThreadStartError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class Pool {
  public:
    ~Pool() {
        {
            std::lock_guard<std::mutex> g(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        for (auto& th : threads_) th.join();
    }

    // Run job(worker_id) on `n` pool threads and wait. The caller only waits: per-thread buffers
    // then live in the pool's own long-lived threads, whichever thread calls. An exception a job
    // throws on a pool thread (std::bad_alloc sizing a buffer) is rethrown here, in the caller:
    // it never reaches std::terminate on the pool thread.
    void run(int n, const std::function<void(int)>& job) {
        std::lock_guard<std::mutex> serial(call_mu_);
        ensure(n);
        {
            std::lock_guard<std::mutex> g(mu_);
            job_ = &job;
            active_ = n;
            pending_ = n;
            error_ = nullptr;
            generation_++;
        }
        cv_.notify_all();
        std::unique_lock<std::mutex> lk(mu_);
        done_cv_.wait(lk, [&] { return pending_ == 0; });
        job_ = nullptr;
        if (error_) {
            std::exception_ptr e = error_;
            error_ = nullptr;
            std::rethrow_exception(e);
        }
    }

    size_t size() const { return threads_.size(); }

    // This pool's threads run at `increment` over the nice value they started with (a GPU
    // loader's CPU share gives the cores to the training loop when both want them); each
    // thread applies it before its next job. Raising nice needs no privilege; lowering it again
    // may be refused, so the Python side never reuses a raised pool as a normal one.
    void set_nice(int increment) { nice_.store(increment); }

    // The kernel thread ids of this pool's threads (started so far).
    std::vector<long> thread_ids() {
        std::lock_guard<std::mutex> g(mu_);
        return tids_;
    }

  private:
    // std::thread throws std::system_error when the system will not start one (no memory for
    // its stack under a cap, a thread limit): ThreadStartError, recordtool.errors'
    // ThreadStartError in Python. The threads this call started are stopped and joined first,
    // so a failed call leaves the pool as it found it: a thread count the system refuses does
    // not leave thousands of idle threads behind for every later call to trip on.
    void ensure(int workers) {
        const size_t before = threads_.size();
        while ((int)threads_.size() < workers) {
            int id = (int)threads_.size() + 1;
            unsigned long gen;
            {
                std::lock_guard<std::mutex> g(mu_);
                gen = generation_;  // a new thread must not mistake an old call for work
            }
            try {
                threads_.emplace_back([this, id, gen] { loop(id, gen); });
            } catch (const std::system_error& e) {
                shrink(before);
                throw ThreadStartError("cannot start native decode thread " + std::to_string(id) + " of " +
                                       std::to_string(workers) + " (" + e.what() +
                                       "): fewer threads, or a higher memory or thread limit");
            }
        }
    }

    // Stop and join the threads past the first `keep` (idle: run() holds call_mu_, so no job is
    // under way); each takes its kernel id out of tids_ as it leaves.
    void shrink(size_t keep) {
        {
            std::lock_guard<std::mutex> g(mu_);
            keep_ = (int)keep;
        }
        cv_.notify_all();
        for (size_t i = keep; i < threads_.size(); i++) threads_[i].join();
        threads_.resize(keep);
        std::lock_guard<std::mutex> g(mu_);
        keep_ = INT_MAX;
    }

    void loop(int id, unsigned long seen) {
        const long tid = syscall(SYS_gettid);
        errno = 0;
        const int base = getpriority(PRIO_PROCESS, (id_t)tid);
        int applied = 0;
        {
            std::lock_guard<std::mutex> g(mu_);
            tids_.push_back(tid);
        }
        for (;;) {
            const std::function<void(int)>* job;
            {
                std::unique_lock<std::mutex> lk(mu_);
                cv_.wait(lk, [&] { return stop_ || id > keep_ || generation_ != seen; });
                if (stop_) return;
                if (id > keep_) {  // shrink(): this thread goes
                    tids_.erase(std::remove(tids_.begin(), tids_.end(), tid), tids_.end());
                    return;
                }
                seen = generation_;
                if (id > active_) continue;  // not needed for this call
                job = job_;
            }
            const int want = nice_.load();
            if (want != applied) {  // refused (lowering without privilege): left as it is
                setpriority(PRIO_PROCESS, (id_t)tid, std::min(19, std::max(-20, base + want)));
                applied = want;
            }
            std::exception_ptr err;
            try {
                (*job)(id);
            } catch (...) {
                err = std::current_exception();
            }
            {
                std::lock_guard<std::mutex> g(mu_);
                if (err && !error_) error_ = err;
                if (--pending_ == 0) done_cv_.notify_all();
            }
        }
    }

    std::vector<std::thread> threads_;
    std::vector<long> tids_;
    std::atomic<int> nice_{0};
    std::mutex mu_, call_mu_;
    std::condition_variable cv_, done_cv_;
    const std::function<void(int)>* job_ = nullptr;
    unsigned long generation_ = 0;
    int active_ = 0, pending_ = 0;
    int keep_ = INT_MAX;  // threads with a higher id leave (shrink)
    bool stop_ = false;
    std::exception_ptr error_;  // the first exception a job threw in this call
};

// Pools by id: callers that run batches at the same time (one per GPU producer thread) each
// get their own threads instead of queueing on one pool. Never destroyed: threads must not be
// joined at interpreter exit.
static std::mutex* pools_mu = new std::mutex();
static std::vector<Pool*>* pools = new std::vector<Pool*>();

static Pool& pool(int id = 0) {
    std::lock_guard<std::mutex> g(*pools_mu);
    if (id < 0 || id > 128) throw std::invalid_argument("pool id must be in 0..128");
    while ((int)pools->size() <= id) pools->push_back(new Pool());
    return *(*pools)[id];
}

// A forked child (a torch DataLoader worker, multiprocessing with fork) has none of its
// parent's pool threads, and a pool's locks may have been held at the fork: the child starts
// with new, empty pools (their threads made on first use) and leaves the old ones untouched —
// waiting on them would hang, destroying them would join threads that do not exist.
static void pools_after_fork_in_child() {
    pools_mu = new std::mutex();
    pools = new std::vector<Pool*>();
}

}  // namespace rt

// ------------------------------------------------------------------ Python bindings

using namespace rt;

// A buffer whose bytes are one C-contiguous block (a JPEG's bytes): for a strided or reversed
// view, ptr .. ptr + size · itemsize would not be its bytes, or not even its memory. Names the
// buffer's position otherwise (ValueError in Python).
static py::buffer_info contiguous_buffer(const py::object& obj, size_t i) {
    py::buffer_info b = py::buffer(obj).request();
    py::ssize_t expect = b.itemsize;
    for (py::ssize_t d = b.ndim - 1; d >= 0; --d) {
        if (b.shape[(size_t)d] > 1 && b.strides[(size_t)d] != expect)
            throw std::invalid_argument("buffer " + std::to_string(i) + " is not C-contiguous (a strided view of bytes)");
        expect *= b.shape[(size_t)d];
    }
    return b;
}

// Tasks of one batch: buffers (sequence of bytes-likes, kept alive by `keep`) and windows
// (N, 4) float64 (y, x, h, w). `out` (uint8 slots) is set by the caller or by Emit.
static std::vector<Task> make_tasks(py::sequence buffers, py::array_t<double, py::array::c_style> windows,
                                    std::vector<py::buffer_info>& keep) {
    const size_t n = buffers.size();
    if (windows.ndim() != 2 || (size_t)windows.shape(0) != n || windows.shape(1) != 4)
        throw std::invalid_argument("windows must have shape (N, 4)");
    std::vector<Task> tasks(n);
    keep.reserve(n);
    auto win = windows.unchecked<2>();
    for (size_t i = 0; i < n; i++) {
        keep.emplace_back(contiguous_buffer(buffers[i], i));
        const py::buffer_info& b = keep.back();
        tasks[i].data = static_cast<const uint8_t*>(b.ptr);
        tasks[i].size = (size_t)b.size * b.itemsize;
        tasks[i].y = win(i, 0);
        tasks[i].x = win(i, 1);
        tasks[i].h = win(i, 2);
        tasks[i].w = win(i, 3);
    }
    return tasks;
}

// An output side from an array shape, checked before it is narrowed to int (a 2**32 + 5 side
// must not pass as 5).
static int side(py::ssize_t v) {
    if (v < 1 || v > kMaxSide)
        throw std::invalid_argument("output side " + std::to_string(v) + " not in 1.." + std::to_string(kMaxSide));
    return (int)v;
}

static void check_params(const Params& p) {
    if (p.out_w < 1 || p.out_h < 1 || p.out_w > kMaxSide || p.out_h > kMaxSide)
        throw std::invalid_argument("output size " + std::to_string(p.out_h) + "x" + std::to_string(p.out_w) +
                                    ": each side must be in 1.." + std::to_string(kMaxSide));
    if (p.force_scale < 0 || p.force_scale > 8) throw std::invalid_argument("force_scale must be in 0..8");
    if (!(p.margin > 0)) throw std::invalid_argument("scale margin must be > 0");
}

// Decode every task on the pool (pool_id -1: on the calling thread), largest first; a failed
// image's slot is zeros (before the op and Emit).
// With a user op, it runs on each image (failed ones too: zeros) right after its resample.
// With Emit on, each image goes through the thread's tile and the fused output pass.
static py::list run_batch(std::vector<Task>& tasks, const Params& p, int threads, int pool_id, const Emit& emit,
                          const UserOp& op) {
    const size_t n = tasks.size();
    const size_t slot = (size_t)p.out_w * p.out_h * 3;
    std::vector<size_t> sizes(n);
    for (size_t i = 0; i < n; i++) sizes[i] = tasks[i].size;
    const std::vector<uint32_t> order = largest_first(sizes);
    std::atomic<size_t> next{0};
    int participants = std::max(1, std::min<int>(threads, (int)n));
    {
        py::gil_scoped_release release;
        auto job = [&](int) {
            // per-thread buffers live across batches: no allocation in steady state
            Scratch& s = scratch();
            if (emit.on && s.tile.size() < slot) s.tile.resize(slot);
            for (;;) {
                size_t k = next.fetch_add(1, std::memory_order_relaxed);
                if (k >= n) break;
                Task& t = tasks[order[k]];
                if (emit.on) t.out = s.tile.data();
                bool ok = false;
                try {
                    ok = run_one(t, p, s);
                } catch (...) {  // run_one catches its own; nothing may reach std::terminate
                    t.message = "internal error (unknown C++ exception)";
                }
                if (!ok) {
                    t.status = 1;
                    std::memset(t.out, 0, slot);
                }
                if (op.fn) run_op(op, t.out, p.out_h, p.out_w, order[k]);
                if (emit.on) emit_one(emit, t.out, p.out_h, p.out_w, order[k]);
            }
            if (s.region.capacity() > kKeepBytes) {  // after a huge image, give the memory back
                std::vector<uint8_t>().swap(s.region);
                std::vector<uint8_t>().swap(s.rgb);
            }
        };
        // pool -1: on the calling thread, no pool. Many callers decoding one image each at the
        // same time (pack's transcoding workers) would otherwise queue on one pool's call lock.
        if (pool_id == -1) job(0);
        else pool(pool_id).run(participants, job);
    }
    py::list failures;
    for (size_t i = 0; i < n; i++)
        if (tasks[i].status) failures.append(py::make_tuple(i, tasks[i].message));
    return failures;
}

// The user op of a batch of n images from Python: address (0: none), params (n, k) float64
// C-contiguous, status (n,) int32 C-contiguous, written. The arrays must outlive the call.
static UserOp make_op(uintptr_t address, const py::object& params, const py::object& status, size_t n) {
    UserOp op;
    if (address == 0) return op;
    // numpy arrays only (a converted copy would die with this function, its pointer kept)
    if (!py::isinstance<py::array>(params) || !py::isinstance<py::array>(status))
        throw std::invalid_argument("a user op needs op_params and op_status numpy arrays");
    auto par = py::reinterpret_borrow<py::array>(params);
    auto st = py::reinterpret_borrow<py::array>(status);
    if (!par.dtype().is(py::dtype::of<double>()) || par.ndim() != 2 || (size_t)par.shape(0) != n ||
        !(par.flags() & py::array::c_style))
        throw std::invalid_argument("op_params must be C-contiguous float64 (N, k)");
    if (!st.dtype().is(py::dtype::of<int32_t>()) || st.ndim() != 1 || (size_t)st.shape(0) != n ||
        !(st.flags() & py::array::c_style) || !st.writeable())
        throw std::invalid_argument("op_status must be a writeable C-contiguous int32 (N,)");
    op.fn = reinterpret_cast<OpFn>(address);
    op.params = static_cast<const double*>(par.data());
    op.k = par.shape(1);
    op.status = static_cast<int32_t*>(st.mutable_data());
    return op;
}

// buffers: sequence of bytes-like; windows: (N, 4) float64 (y, x, h, w);
// out: (N, H, W, 3) uint8 C-contiguous; pool_id: a pool, or -1 for the calling thread.
// Returns list of (index, reason) for failed images.
static py::list decode_crop_resize(py::sequence buffers, py::array_t<double, py::array::c_style> windows,
                                   py::array_t<uint8_t, py::array::c_style> out, int threads, long long max_pixels,
                                   int force_scale, double margin, int pool_id, uintptr_t op_address,
                                   py::object op_params, py::object op_status) {
    const size_t n = buffers.size();
    if (out.ndim() != 4 || (size_t)out.shape(0) != n || out.shape(3) != 3)
        throw std::invalid_argument("out must have shape (N, H, W, 3)");
    Params p{side(out.shape(2)), side(out.shape(1)), max_pixels, force_scale, margin};
    check_params(p);
    std::vector<py::buffer_info> keep;
    std::vector<Task> tasks = make_tasks(buffers, windows, keep);
    uint8_t* base = out.mutable_data();
    const size_t slot = (size_t)p.out_w * p.out_h * 3;
    for (size_t i = 0; i < n; i++) tasks[i].out = base + i * slot;
    const UserOp op = make_op(op_address, op_params, op_status, n);
    return run_batch(tasks, p, threads, pool_id, Emit{}, op);
}

// The same, with the fused output pass: out is float32, float16 or bfloat16 bits (uint16), (N, 3, H, W) when nchw else
// (N, H, W, 3); image n is mirrored where flips[n]; value = pixel · scale[c] + bias[c].
// Reference: ops.normalize_reference(decode_crop_resize(...)). Failed images come out as the
// normalised zero image; their (index, reason) are returned.
static py::list decode_crop_resize_normalize(py::sequence buffers, py::array_t<double, py::array::c_style> windows,
                                             py::array_t<bool, py::array::c_style> flips, py::array out,
                                             std::vector<float> scale, std::vector<float> bias, bool nchw,
                                             int threads, long long max_pixels, double margin, int pool_id,
                                             uintptr_t op_address, py::object op_params, py::object op_status) {
    const size_t n = buffers.size();
    if (out.ndim() != 4 || (size_t)out.shape(0) != n) throw std::invalid_argument("out must have shape (N, ...)");
    if (!(out.flags() & py::array::c_style)) throw std::invalid_argument("out must be C-contiguous");
    const int kind = out_kind(out, "out");
    const int H = side(nchw ? out.shape(2) : out.shape(1)), W = side(nchw ? out.shape(3) : out.shape(2));
    if ((nchw ? out.shape(1) : out.shape(3)) != 3) throw std::invalid_argument("out must have 3 channels");
    if ((size_t)flips.size() != n) throw std::invalid_argument("flips must have N entries");
    if (scale.size() != 3 || bias.size() != 3) throw std::invalid_argument("scale and bias need 3 values");
    Params p{W, H, max_pixels, 0, margin};
    check_params(p);
    std::vector<py::buffer_info> keep;
    std::vector<Task> tasks = make_tasks(buffers, windows, keep);
    const Emit e = make_emit(kind, nchw, scale, bias, flips.data(), out.mutable_data());
    const UserOp op = make_op(op_address, op_params, op_status, n);
    return run_batch(tasks, p, threads, pool_id, e, op);
}

// The resampler alone, for its tests against PIL: src (H, W, 3) uint8, box (x0, y0, x1, y1).
static py::array_t<uint8_t> resample_py(py::array_t<uint8_t, py::array::c_style> src, std::vector<double> box, int out_w,
                                        int out_h) {
    if (src.ndim() != 3 || src.shape(2) != 3) throw std::invalid_argument("src must be (H, W, 3)");
    if (box.size() != 4) throw std::invalid_argument("box must be (x0, y0, x1, y1)");
    if (out_w < 1 || out_h < 1 || out_w > kMaxSide || out_h > kMaxSide)
        throw std::invalid_argument("output size: each side must be in 1.." + std::to_string(kMaxSide));
    if (src.shape(0) < 1 || src.shape(1) < 1) throw std::invalid_argument("src must not be empty");
    if (!(box[0] >= 0 && box[1] >= 0 && box[2] > box[0] && box[3] > box[1] && box[2] <= src.shape(1) &&
          box[3] <= src.shape(0)))
        throw std::invalid_argument("box must lie inside src with x1 > x0, y1 > y0");
    py::array_t<uint8_t> out({(py::ssize_t)out_h, (py::ssize_t)out_w, (py::ssize_t)3});
    std::vector<uint8_t> tmp;
    std::vector<int32_t> acc;
    HScratch hs;
    Coeffs ch, cv;
    resample(src.data(), (int)src.shape(1), (int)src.shape(0), (size_t)src.shape(1) * 3, box[0], box[1], box[2], box[3],
             out.mutable_data(), out_w, out_h, (size_t)out_w * 3, tmp, ch, cv, acc, hs);
    return out;
}

// Copy many byte buffers into one destination (e.g. pinned staging memory) at offsets rounded
// up to `align`, without the GIL. Returns the offsets; Python reference: a numpy copy loop.
static py::array_t<int64_t> gather(py::sequence buffers, uintptr_t dst, size_t capacity, size_t align) {
    const size_t n = buffers.size();
    if (align == 0) throw std::invalid_argument("align must be > 0");
    std::vector<py::buffer_info> keep;
    keep.reserve(n);
    py::array_t<int64_t> offsets(n);
    auto off = offsets.mutable_unchecked<1>();
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        keep.emplace_back(contiguous_buffer(buffers[i], i));
        off(i) = (int64_t)pos;
        pos += ((size_t)keep.back().size * keep.back().itemsize + align - 1) / align * align;
    }
    if (pos > capacity) throw std::length_error("gather: " + std::to_string(pos) + " bytes > capacity " +
                                                std::to_string(capacity));
    {
        py::gil_scoped_release release;
        for (size_t i = 0; i < n; i++)
            std::memcpy(reinterpret_cast<uint8_t*>(dst) + off(i), keep[i].ptr, (size_t)keep[i].size * keep[i].itemsize);
    }
    return offsets;
}

// Does each buffer end in JPEG's EOI marker (FF D9)? Reference: recordtool.decode.gpu.plan.ends_with_eoi
// (Python). One pass in C: a batch's check costs the producer thread no per-buffer Python.
static py::array_t<bool> ends_with_eoi(py::sequence buffers) {
    const size_t n = buffers.size();
    py::array_t<bool> out(n);
    auto o = out.mutable_unchecked<1>();
    for (size_t i = 0; i < n; i++) {
        py::buffer_info b = contiguous_buffer(buffers[i], i);
        const size_t len = (size_t)b.size * b.itemsize;
        const uint8_t* p = static_cast<const uint8_t*>(b.ptr);
        o(i) = len >= 2 && p[len - 2] == 0xFF && p[len - 1] == 0xD9;
    }
    return out;
}

// Where each buffer's bytes start and how many there are: int64 (n,) addresses and lengths, for
// nvJPEG's host-pointer calls without a NumPy view per buffer on the producer thread. The
// addresses hold while the caller keeps the buffers. Reference: recordtool.decode.gpu.plan.buffer_spans_py.
static py::tuple buffer_spans(py::sequence buffers) {
    const size_t n = buffers.size();
    py::array_t<int64_t> ptrs(n), lens(n);
    auto p = ptrs.mutable_unchecked<1>();
    auto l = lens.mutable_unchecked<1>();
    for (size_t i = 0; i < n; i++) {
        py::buffer_info b = contiguous_buffer(buffers[i], i);
        p(i) = (int64_t)reinterpret_cast<uintptr_t>(b.ptr);
        l(i) = (int64_t)((size_t)b.size * b.itemsize);
    }
    return py::make_tuple(ptrs, lens);
}

// Size every pool thread's region buffer now (touched, so resident memory stops growing later):
// the loader calls this with the index's largest image, capped at kKeepBytes.
static void reserve(size_t bytes, int threads, int pool_id) {
    bytes = std::min(bytes, kKeepBytes);
    py::gil_scoped_release release;
    pool(pool_id).run(std::max(1, threads), [&](int) {
        Scratch& s = scratch();
        if (s.region.size() < bytes) s.region.resize(bytes);
    });
}

// ------------------------------------------------------------------ normalize

// uint8 NHWC batch → (x · scale + bias) per channel, mirrored where flips[n], into float32 or
// float16 or bfloat16 bits (uint16), NCHW or NHWC. One image per task on the pool. Reference: recordtool.decode.ops.normalize.
static void normalize_py(py::array_t<uint8_t, py::array::c_style> src, py::array_t<bool, py::array::c_style> flips,
                         py::array dst, std::vector<float> scale, std::vector<float> bias, bool nchw, int threads,
                         int pool_id) {
    if (src.ndim() != 4 || src.shape(3) != 3) throw std::invalid_argument("src must be (N, H, W, 3) uint8");
    const int n = (int)src.shape(0), H = (int)src.shape(1), W = (int)src.shape(2);
    if (flips.size() != n) throw std::invalid_argument("flips must have N entries");
    if (scale.size() != 3 || bias.size() != 3) throw std::invalid_argument("scale and bias need 3 values");
    const int kind = out_kind(dst, "dst");
    if (!(dst.flags() & py::array::c_style) || dst.size() != (py::ssize_t)n * H * W * 3)
        throw std::invalid_argument("dst must be C-contiguous with N*H*W*3 elements");
    const Emit e = make_emit(kind, nchw, scale, bias, flips.data(), dst.mutable_data());  // the fused pass
    const uint8_t* s = src.data();
    std::atomic<int> next{0};
    py::gil_scoped_release release;
    pool(pool_id).run(std::max(1, std::min(threads, n)), [&](int) {
        for (;;) {
            const int k = next.fetch_add(1);
            if (k >= n) break;
            emit_one(e, s + (size_t)k * H * W * 3, H, W, (size_t)k);
        }
    });
}

// A user op over a uint8 NHWC batch in place, one image per task on the pool (a Pillow-retried
// image, the op as a batch op). Reference: recordtool.decode.cpu.apply_op_reference.
static void apply_op_py(py::array_t<uint8_t, py::array::c_style> batch, uintptr_t op_address, py::object op_params,
                        py::object op_status, int threads, int pool_id) {
    if (batch.ndim() != 4 || batch.shape(3) != 3) throw std::invalid_argument("batch must be (N, H, W, 3) uint8");
    if (op_address == 0) throw std::invalid_argument("op address is 0");
    const size_t n = (size_t)batch.shape(0);
    const int H = side(batch.shape(1)), W = side(batch.shape(2));
    const UserOp op = make_op(op_address, op_params, op_status, n);
    uint8_t* b = batch.mutable_data();
    std::atomic<size_t> next{0};
    auto job = [&](int) {
        for (;;) {
            const size_t k = next.fetch_add(1);
            if (k >= n) break;
            run_op(op, b + k * (size_t)H * W * 3, H, W, k);
        }
    };
    py::gil_scoped_release release;
    if (pool_id == -1) job(0);
    else pool(pool_id).run(std::max(1, std::min<int>(threads, (int)n)), job);
}

// libjpeg mallocs its per-image buffers (progressive coefficient arrays: megabytes for a large
// image) on whichever decode thread runs the image. glibc's dynamic mmap threshold rises after
// the first such block is freed, so later ones come from the threads' arenas, and freed arena
// memory is kept: resident memory then creeps up epoch after epoch, all of it free arena
// memory. A fixed 1 MiB threshold keeps large blocks in
// mmap, returned on free. Skipped when the user set MALLOC_MMAP_THRESHOLD_ or
// RECORDTOOL_KEEP_MALLOC.
static bool fix_mmap_threshold() {
    if (std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("RECORDTOOL_KEEP_MALLOC")) return false;
#ifdef M_MMAP_THRESHOLD
    return mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1;
#else
    return false;
#endif
}

PYBIND11_MODULE(_native, m) {
    // raised as a subclass of recordtool.errors.ThreadStartError (a RecordtoolError)
    py::register_exception<ThreadStartError>(m, "ThreadStartError",
                                             py::module_::import("recordtool.errors").attr("ThreadStartError"));
    m.attr("MMAP_THRESHOLD_FIXED") = fix_mmap_threshold();
    pthread_atfork(nullptr, nullptr, &pools_after_fork_in_child);
    m.def("normalize", &normalize_py, py::arg("src"), py::arg("flips"), py::arg("dst"), py::arg("scale"),
          py::arg("bias"), py::arg("nchw"), py::arg("threads"), py::arg("pool") = 0);
    m.def("ends_with_eoi", &ends_with_eoi, py::arg("buffers"));
    m.def("buffer_spans", &buffer_spans, py::arg("buffers"));
    m.def("gather", &gather, py::arg("buffers"), py::arg("dst"), py::arg("capacity"), py::arg("align") = 64);
    m.doc() = "recordtool native decode: fused libjpeg-turbo crop decode + Pillow-exact bilinear resample";
    m.def("decode_crop_resize", &decode_crop_resize, py::arg("buffers"), py::arg("windows"), py::arg("out"),
          py::arg("threads"), py::arg("max_pixels"), py::arg("force_scale") = 0, py::arg("margin") = 1.1, py::arg("pool") = 0,
          py::arg("op") = 0, py::arg("op_params") = py::none(), py::arg("op_status") = py::none());
    m.def("decode_crop_resize_normalize", &decode_crop_resize_normalize, py::arg("buffers"), py::arg("windows"),
          py::arg("flips"), py::arg("out"), py::arg("scale"), py::arg("bias"), py::arg("nchw"), py::arg("threads"),
          py::arg("max_pixels"), py::arg("margin") = 1.1, py::arg("pool") = 0, py::arg("op") = 0,
          py::arg("op_params") = py::none(), py::arg("op_status") = py::none());
    m.def("apply_op", &apply_op_py, py::arg("batch"), py::arg("op"), py::arg("op_params"), py::arg("op_status"),
          py::arg("threads"), py::arg("pool") = 0);
    m.def("resample", &resample_py, py::arg("src"), py::arg("box"), py::arg("out_w"), py::arg("out_h"));
    m.def("choose_scale", &choose_scale, py::arg("win_w"), py::arg("win_h"), py::arg("out_w"), py::arg("out_h"),
          py::arg("margin"), py::arg("min_m"));
    m.def("largest_first", &largest_first, py::arg("sizes"));
    m.def("reserve", &reserve, py::arg("bytes"), py::arg("threads"), py::arg("pool") = 0);
    m.def("pool_size", [] { return pool().size(); });
    m.def("set_pool_nice", [](int id, int increment) { pool(id).set_nice(increment); }, py::arg("pool"),
          py::arg("increment"));
    m.def("pool_thread_ids", [](int id) { return pool(id).thread_ids(); }, py::arg("pool"));
    m.attr("LIBJPEG_VERSION") = JPEG_LIB_VERSION;
    m.attr("MAX_SCANS") = kMaxScans;
    m.attr("COEF_RATIO") = kCoefRatio;
    m.attr("COEF_FLOOR") = kCoefFloor;
    m.attr("MAX_SIDE") = kMaxSide;
}
