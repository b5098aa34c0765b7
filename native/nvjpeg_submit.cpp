// recordtool._nvsubmit: one batch of nvJPEG's hardware decode submitted in one call, GIL released;
// one batch of headers read (nvjpegGetImageInfo) the same way; the hybrid decoder's images
// of a batch decoded one after another in one call; and a stream's copies and launches (a user
// op's pass) queued in one call.
//
// Why: from Python the submission is one ctypes call per image (nvjpegDecodeParamsSetROI) plus
// the batched decode; each ctypes call releases and retakes the GIL, so a training loop on the
// main thread and the producer threads hand the GIL back and forth hundreds of times a batch.
// Here the whole loop runs without the GIL.
//
// Nothing links CUDA or nvJPEG: the functions are nvJPEG's own, passed by address from the
// ctypes binding (recordtool/decode/gpu/nvjpeg.py, which loaded the library), and the CUDA driver's
// likewise. Their C signatures are nvjpeg.h's and cuda.h's. Reference: HardwareDecoder.decode's Python loop (tests/gpu/test_nvjpeg.py decodes
// one batch both ways and compares the pixels) and _Handle.image_info.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace py = pybind11;

namespace {

struct NvImage {  // nvjpegImage_t (NVJPEG_MAX_COMPONENT = 4)
    unsigned char* channel[4];
    size_t pitch[4];
};

using SetRoiFn = int (*)(void* params, int x, int y, int w, int h);
using BatchedExFn = int (*)(void* handle, void* state, const unsigned char* const* data, const size_t* lengths,
                            NvImage* destinations, void* const* params, void* stream);
using ImageInfoFn = int (*)(void* handle, const unsigned char* data, size_t length, int* components, int* subsampling,
                            int* widths, int* heights);

// dsts / pitches: (n,) for interleaved output (channel 0) or (n, 3) for planar YCbCr (channels
// 0..2). Returns (status, call, index, seconds): call 0 = done, 1 = nvjpegDecodeParamsSetROI of
// image `index`, 2 = nvjpegDecodeBatchedEx; status is nvJPEG's (0 = success); seconds: the time
// spent without the GIL (nvJPEG's own, apart from retaking the GIL after it).
py::tuple submit(uintptr_t set_roi, uintptr_t batched_ex, uintptr_t handle, uintptr_t state, uintptr_t params,
                 uintptr_t ptrs_out, uintptr_t lens_out, uintptr_t imgs_out,
                 py::array_t<int64_t, py::array::c_style | py::array::forcecast> host_ptrs,
                 py::array_t<int64_t, py::array::c_style | py::array::forcecast> lengths,
                 py::array_t<int64_t, py::array::c_style | py::array::forcecast> rois,
                 py::array_t<int64_t, py::array::c_style | py::array::forcecast> dsts,
                 py::array_t<int64_t, py::array::c_style | py::array::forcecast> pitches, uintptr_t stream,
                 size_t capacity) {
    const py::ssize_t n = host_ptrs.size();
    const py::ssize_t nc = n ? dsts.size() / n : 1;
    if (lengths.size() != n || (nc != 1 && nc != 3) || dsts.size() != nc * n || pitches.size() != nc * n ||
        rois.size() != 4 * n)
        throw std::invalid_argument("submit: host_ptrs, lengths (n), dsts, pitches (n or n x 3) and rois (n, 4) must agree");
    if ((size_t)n > capacity) throw std::invalid_argument("submit: batch larger than the decoder's arrays");
    if (!set_roi || !batched_ex || !handle || !state || !params || !ptrs_out || !lens_out || !imgs_out)
        throw std::invalid_argument("submit: null function or handle");
    const int64_t* hp = host_ptrs.data();
    const int64_t* ln = lengths.data();
    const int64_t* roi = rois.data();
    const int64_t* dp = dsts.data();
    const int64_t* pp = pitches.data();
    auto set = reinterpret_cast<SetRoiFn>(set_roi);
    auto dec = reinterpret_cast<BatchedExFn>(batched_ex);
    auto prm = reinterpret_cast<void* const*>(params);
    auto out_ptrs = reinterpret_cast<const unsigned char**>(ptrs_out);
    auto out_lens = reinterpret_cast<size_t*>(lens_out);
    auto out_imgs = reinterpret_cast<NvImage*>(imgs_out);
    int status = 0, call = 0;
    py::ssize_t at = 0;
    double seconds = 0.0;  // inside the GIL-free part: nvJPEG's own time, without retaking the GIL
    {
        py::gil_scoped_release nogil;
        const auto t0 = std::chrono::steady_clock::now();
        for (py::ssize_t k = 0; k < n; ++k) {
            out_ptrs[k] = reinterpret_cast<const unsigned char*>(hp[k]);
            out_lens[k] = (size_t)ln[k];
            status = set(prm[k], (int)roi[4 * k], (int)roi[4 * k + 1], (int)roi[4 * k + 2], (int)roi[4 * k + 3]);
            if (status != 0) {
                call = 1;
                at = k;
                break;
            }
            NvImage& img = out_imgs[k];
            for (int c = 0; c < 4; ++c) {
                img.channel[c] = nullptr;
                img.pitch[c] = 0;
            }
            for (py::ssize_t c = 0; c < nc; ++c) {
                img.channel[c] = reinterpret_cast<unsigned char*>(dp[nc * k + c]);
                img.pitch[c] = (size_t)pp[nc * k + c];
            }
        }
        if (status == 0 && n > 0) {
            status = dec(reinterpret_cast<void*>(handle), reinterpret_cast<void*>(state), out_ptrs, out_lens, out_imgs,
                         prm, reinterpret_cast<void*>(stream));
            if (status != 0) call = 2;
        }
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return py::make_tuple(status, call, at, seconds);
}

// Headers of n JPEGs: row k = (status, components, subsampling, width0, height0, width1, height1)
// of nvjpegGetImageInfo (planes 0 and 1; status nvJPEG's, the rest 0 where it failed).
py::array_t<int64_t> infos(uintptr_t get_info, uintptr_t handle,
                           py::array_t<int64_t, py::array::c_style | py::array::forcecast> host_ptrs,
                           py::array_t<int64_t, py::array::c_style | py::array::forcecast> lengths) {
    const py::ssize_t n = host_ptrs.size();
    if (lengths.size() != n) throw std::invalid_argument("infos: host_ptrs and lengths must agree");
    if (!get_info || !handle) throw std::invalid_argument("infos: null function or handle");
    py::array_t<int64_t> out({n, (py::ssize_t)7});
    int64_t* o = out.mutable_data();
    const int64_t* hp = host_ptrs.data();
    const int64_t* ln = lengths.data();
    auto info = reinterpret_cast<ImageInfoFn>(get_info);
    {
        py::gil_scoped_release nogil;
        for (py::ssize_t k = 0; k < n; ++k) {
            int comps = 0, css = 0, w[4] = {0, 0, 0, 0}, h[4] = {0, 0, 0, 0};
            const int st = info(reinterpret_cast<void*>(handle), reinterpret_cast<const unsigned char*>(hp[k]),
                                (size_t)ln[k], &comps, &css, w, h);
            int64_t* r = o + 7 * k;
            r[0] = st;
            r[1] = st ? 0 : comps;
            r[2] = st ? 0 : css;
            r[3] = st ? 0 : w[0];
            r[4] = st ? 0 : h[0];
            r[5] = st ? 0 : w[1];
            r[6] = st ? 0 : h[1];
        }
    }
    return out;
}

using ParseFn = int (*)(void* handle, const unsigned char* data, size_t length, int save_metadata, int save_stream,
                       void* jpeg_stream);
using SetFormatFn = int (*)(void* params, int format);
using AttachFn = int (*)(void* state, void* buffer);
using HostFn = int (*)(void* handle, void* decoder, void* state, void* params, void* jpeg_stream);
using TransferFn = int (*)(void* handle, void* decoder, void* state, void* jpeg_stream, void* stream);
using DeviceFn = int (*)(void* handle, void* decoder, void* state, NvImage* destination, void* stream);
using RecordFn = int (*)(void* event, void* stream);  // cuEventRecord
using SyncFn = int (*)(void* event);                  // cuEventSynchronize

// nvJPEG's decoupled hybrid decode of n images, one after another, in one GIL-free call: per
// image what HybridDecoder._decode does (its Python reference, which tests/test_nvsubmit.py
// replays against this loop): take the next of two (JPEG stream, pinned buffer, event) sets,
// wait for that event if it was recorded (the copy out of that pinned buffer two images ago),
// parse, set the output format and the ROI where they change, attach the pinned buffer,
// Huffman-decode on this thread, queue the copy, record the event, queue the device decode.
//   fns:  parse, set_format, set_roi, attach_pinned, host, transfer, device, event_record, event_sync
//   objs: handle, decoder, state, params, stream
//   sets: jpeg_stream 0, 1, pinned 0, 1, event 0, 1
//   st (int64[8], updated): next set, set 0 used, set 1 used, current format, current ROI (x, y, w, h)
//   per image: host_ptrs, lengths, formats (n); rois (n, 4); planes, pitches (n, 3): channels 0..2
// Returns (m, 3) int64: (image, call, status) of each image that failed — call 1 the event wait,
// 2 parse, 3 format, 4 ROI, 5 attach, 6 host decode, 7 transfer, 8 event record, 9 device decode —
// and goes on with the next image, as the Python loop does.
py::array_t<int64_t> hybrid(py::array_t<int64_t, py::array::c_style | py::array::forcecast> fns,
                            py::array_t<int64_t, py::array::c_style | py::array::forcecast> objs,
                            py::array_t<int64_t, py::array::c_style | py::array::forcecast> sets,
                            py::array_t<int64_t, py::array::c_style> st,
                            py::array_t<int64_t, py::array::c_style | py::array::forcecast> host_ptrs,
                            py::array_t<int64_t, py::array::c_style | py::array::forcecast> lengths,
                            py::array_t<int64_t, py::array::c_style | py::array::forcecast> formats,
                            py::array_t<int64_t, py::array::c_style | py::array::forcecast> rois,
                            py::array_t<int64_t, py::array::c_style | py::array::forcecast> planes,
                            py::array_t<int64_t, py::array::c_style | py::array::forcecast> pitches) {
    const py::ssize_t n = host_ptrs.size();
    if (fns.size() != 9 || objs.size() != 5 || sets.size() != 6 || st.size() != 8)
        throw std::invalid_argument("hybrid: fns (9), objs (5), sets (6) and st (8) have fixed sizes");
    if (lengths.size() != n || formats.size() != n || rois.size() != 4 * n || planes.size() != 3 * n ||
        pitches.size() != 3 * n)
        throw std::invalid_argument("hybrid: host_ptrs, lengths, formats (n), rois (n, 4), planes, pitches (n, 3) must agree");
    const int64_t* f = fns.data();
    for (int k = 0; k < 9; ++k)
        if (!f[k]) throw std::invalid_argument("hybrid: null function");
    const int64_t* o = objs.data();
    const int64_t* z = sets.data();
    if (!o[0] || !o[1] || !o[2] || !o[3] || !z[0] || !z[1] || !z[2] || !z[3] || !z[4] || !z[5])
        throw std::invalid_argument("hybrid: null handle");
    auto parse = reinterpret_cast<ParseFn>(f[0]);
    auto set_format = reinterpret_cast<SetFormatFn>(f[1]);
    auto set_roi = reinterpret_cast<SetRoiFn>(f[2]);
    auto attach = reinterpret_cast<AttachFn>(f[3]);
    auto host = reinterpret_cast<HostFn>(f[4]);
    auto transfer = reinterpret_cast<TransferFn>(f[5]);
    auto device = reinterpret_cast<DeviceFn>(f[6]);
    auto record = reinterpret_cast<RecordFn>(f[7]);
    auto sync = reinterpret_cast<SyncFn>(f[8]);
    void* handle = reinterpret_cast<void*>(o[0]);
    void* decoder = reinterpret_cast<void*>(o[1]);
    void* state = reinterpret_cast<void*>(o[2]);
    void* params = reinterpret_cast<void*>(o[3]);
    void* stream = reinterpret_cast<void*>(o[4]);
    int64_t* s = st.mutable_data();
    const int64_t* hp = host_ptrs.data();
    const int64_t* ln = lengths.data();
    const int64_t* fm = formats.data();
    const int64_t* roi = rois.data();
    const int64_t* pl = planes.data();
    const int64_t* pp = pitches.data();
    std::vector<int64_t> failed;
    {
        py::gil_scoped_release nogil;
        for (py::ssize_t i = 0; i < n; ++i) {
            const int k = (int)(s[0] & 1);
            s[0] = k ^ 1;
            void* js = reinterpret_cast<void*>(z[k]);
            void* pinned = reinterpret_cast<void*>(z[2 + k]);
            void* event = reinterpret_cast<void*>(z[4 + k]);
            int call = 0, status = 0;
            const int64_t* r = roi + 4 * i;
            if (s[1 + k] && (status = sync(event)) != 0) call = 1;
            else if ((status = parse(handle, reinterpret_cast<const unsigned char*>(hp[i]), (size_t)ln[i], 0, 0, js)) != 0)
                call = 2;
            else if (fm[i] != s[3] && (status = set_format(params, (int)fm[i])) != 0) call = 3;
            else {
                s[3] = fm[i];
                if ((r[0] != s[4] || r[1] != s[5] || r[2] != s[6] || r[3] != s[7]) &&
                    (status = set_roi(params, (int)r[0], (int)r[1], (int)r[2], (int)r[3])) != 0)
                    call = 4;
                else {
                    for (int c = 0; c < 4; ++c) s[4 + c] = r[c];
                    if ((status = attach(state, pinned)) != 0) call = 5;
                    else if ((status = host(handle, decoder, state, params, js)) != 0) call = 6;
                    else if ((status = transfer(handle, decoder, state, js, stream)) != 0) call = 7;
                    else if ((status = record(event, stream)) != 0) call = 8;
                    else {
                        s[1 + k] = 1;
                        NvImage img;
                        for (int c = 0; c < 4; ++c) {
                            img.channel[c] = c < 3 ? reinterpret_cast<unsigned char*>(pl[3 * i + c]) : nullptr;
                            img.pitch[c] = c < 3 ? (size_t)pp[3 * i + c] : 0;
                        }
                        if ((status = device(handle, decoder, state, &img, stream)) != 0) call = 9;
                    }
                }
            }
            if (call) {
                failed.push_back(i);
                failed.push_back(call);
                failed.push_back(status);
            }
        }
    }
    py::array_t<int64_t> out({(py::ssize_t)(failed.size() / 3), (py::ssize_t)3});
    std::copy(failed.begin(), failed.end(), out.mutable_data());
    return out;
}

using StreamWaitFn = int (*)(void* stream, void* event, unsigned int flags);  // cuStreamWaitEvent
using CopyHtoDFn = int (*)(uint64_t dst, const void* src, size_t bytes, void* stream);  // cuMemcpyHtoDAsync_v2
using LaunchFn = int (*)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shared, void* stream, void** params, void** extra);  // cuLaunchKernel

// Device work of one stream queued in one GIL-free call, in this order: wait (on the host) for
// `prev` (an event, 0 = none); the stream waits for each of `waits`; the host-to-device copies
// (dst, src, bytes) — src pinned, so truly queued; the kernel launches (function, grid x y z,
// block x y z, shared bytes, nargs), each taking its next nargs argument slots of `slots`
// (8 bytes each, the value in its first bytes: a pointer or int64 in all 8, an int32 or float
// in the low 4); then `done` is recorded (0 = none). A user op's pass (loader/gpu.py: the op's
// params and the normalising pass's samples up, the op's kernel, the normalising kernel) is
// one such call: from Python each of those calls gives the GIL up and must take it back from a
// busy training thread. Reference: GPUBatcher's CuPy calls (tests/test_nvsubmit.py replays
// this against stand-ins, tests/gpu/test_user_ops.py compares the pixels on a GPU).
// Returns (status, call, index): call 0 = done, 1 cuEventSynchronize, 2 cuStreamWaitEvent of
// waits[index], 3 the copy `index`, 4 the launch `index`, 5 cuEventRecord; status the
// driver's (0 = success); nothing after a failed call is queued.
py::tuple queue(py::array_t<int64_t, py::array::c_style | py::array::forcecast> fns, uintptr_t stream, uintptr_t prev,
                py::array_t<int64_t, py::array::c_style | py::array::forcecast> waits,
                py::array_t<int64_t, py::array::c_style | py::array::forcecast> copies,
                py::array_t<int64_t, py::array::c_style | py::array::forcecast> launches,
                py::array_t<int64_t, py::array::c_style | py::array::forcecast> slots, uintptr_t done) {
    if (fns.size() != 5) throw std::invalid_argument("queue: fns holds 5 functions");
    const int64_t* f = fns.data();
    for (int k = 0; k < 5; ++k)
        if (!f[k]) throw std::invalid_argument("queue: null function");
    if (!stream) throw std::invalid_argument("queue: null stream (the legacy default stream is not taken)");
    if (copies.ndim() != 2 || copies.shape(1) != 3) throw std::invalid_argument("queue: copies must be (m, 3)");
    if (launches.ndim() != 2 || launches.shape(1) != 9) throw std::invalid_argument("queue: launches must be (k, 9)");
    const py::ssize_t nw = waits.size(), nc = copies.shape(0), nl = launches.shape(0);
    const int64_t* wt = waits.data();
    const int64_t* cp = copies.data();
    const int64_t* ln = launches.data();
    int64_t need = 0;
    for (py::ssize_t i = 0; i < nw; ++i)
        if (!wt[i]) throw std::invalid_argument("queue: null event in waits");
    for (py::ssize_t i = 0; i < nc; ++i)
        if (cp[3 * i + 2] < 0 || (cp[3 * i + 2] > 0 && (!cp[3 * i] || !cp[3 * i + 1])))
            throw std::invalid_argument("queue: a copy with a null pointer or a negative size");
    for (py::ssize_t i = 0; i < nl; ++i) {
        const int64_t* r = ln + 9 * i;
        if (!r[0]) throw std::invalid_argument("queue: null kernel function");
        for (int d = 1; d < 8; ++d)
            if (r[d] < 0 || r[d] > 0xffffffffLL) throw std::invalid_argument("queue: grid, block and shared sizes are uint32");
        for (int d = 1; d < 7; ++d)
            if (r[d] == 0) throw std::invalid_argument("queue: a grid or block dimension of 0");
        if (r[8] < 0 || r[8] > (int64_t)slots.size() - need)  // (no overflow: need ≤ slots.size() so far)
            throw std::invalid_argument("queue: the launches' nargs must add up to the slots");
        need += r[8];
    }
    if (need != slots.size()) throw std::invalid_argument("queue: the launches' nargs must add up to the slots");
    // the kernels' argument pointers, into the slots (cuLaunchKernel copies the values it is given)
    std::vector<void*> argp((size_t)need);
    int64_t* base = const_cast<int64_t*>(slots.data());
    for (int64_t i = 0; i < need; ++i) argp[(size_t)i] = base + i;
    auto sync = reinterpret_cast<SyncFn>(f[0]);
    auto wait = reinterpret_cast<StreamWaitFn>(f[1]);
    auto copy = reinterpret_cast<CopyHtoDFn>(f[2]);
    auto launch = reinterpret_cast<LaunchFn>(f[3]);
    auto record = reinterpret_cast<RecordFn>(f[4]);
    void* st = reinterpret_cast<void*>(stream);
    int status = 0, call = 0;
    py::ssize_t at = 0;
    {
        py::gil_scoped_release nogil;
        if (prev && (status = sync(reinterpret_cast<void*>(prev))) != 0) call = 1;
        for (py::ssize_t i = 0; !call && i < nw; ++i)
            if ((status = wait(st, reinterpret_cast<void*>(wt[i]), 0)) != 0) call = 2, at = i;
        for (py::ssize_t i = 0; !call && i < nc; ++i)
            if (cp[3 * i + 2] > 0 && (status = copy((uint64_t)cp[3 * i], reinterpret_cast<const void*>(cp[3 * i + 1]),
                                                    (size_t)cp[3 * i + 2], st)) != 0)
                call = 3, at = i;
        size_t a = 0;
        for (py::ssize_t i = 0; !call && i < nl; ++i) {
            const int64_t* r = ln + 9 * i;
            if ((status = launch(reinterpret_cast<void*>(r[0]), (unsigned)r[1], (unsigned)r[2], (unsigned)r[3],
                                 (unsigned)r[4], (unsigned)r[5], (unsigned)r[6], (unsigned)r[7], st,
                                 r[8] ? argp.data() + a : nullptr, nullptr)) != 0)
                call = 4, at = i;
            a += (size_t)r[8];
        }
        if (!call && done && (status = record(reinterpret_cast<void*>(done), st)) != 0) call = 5;
    }
    return py::make_tuple(status, call, at);
}

}  // namespace

PYBIND11_MODULE(_nvsubmit, m) {
    m.doc() = "recordtool: nvJPEG hardware batch submission without the GIL (functions passed by address)";
    m.def("submit", &submit, py::arg("set_roi"), py::arg("batched_ex"), py::arg("handle"), py::arg("state"),
          py::arg("params"), py::arg("ptrs_out"), py::arg("lens_out"), py::arg("imgs_out"), py::arg("host_ptrs"),
          py::arg("lengths"), py::arg("rois"), py::arg("dsts"), py::arg("pitches"), py::arg("stream"),
          py::arg("capacity"));
    m.def("infos", &infos, py::arg("get_info"), py::arg("handle"), py::arg("host_ptrs"), py::arg("lengths"));
    m.def("hybrid", &hybrid, py::arg("fns"), py::arg("objs"), py::arg("sets"), py::arg("st"), py::arg("host_ptrs"),
          py::arg("lengths"), py::arg("formats"), py::arg("rois"), py::arg("planes"), py::arg("pitches"));
    m.def("queue", &queue, py::arg("fns"), py::arg("stream"), py::arg("prev"), py::arg("waits"), py::arg("copies"),
          py::arg("launches"), py::arg("slots"), py::arg("done"));
}
