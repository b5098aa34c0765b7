// recordtool._nvsubmit: one batch of nvJPEG's hardware decode submitted in one call, GIL released;
// one batch of headers read (nvjpegGetImageInfo) the same way; and the hybrid decoder's images
// of a batch decoded one after another in one call.
//
// Why: from Python the submission is one ctypes call per image (nvjpegDecodeParamsSetROI) plus
// the batched decode; each ctypes call releases and retakes the GIL, so a training loop on the
// main thread and the producer threads hand the GIL back and forth hundreds of times a batch.
// Here the whole loop runs without the GIL.
//
// Nothing links CUDA or nvJPEG: the functions are nvJPEG's own, passed by address from the
// ctypes binding (recordtool/decode/nvjpeg.py, which loaded the library). Their C signatures
// are nvjpeg.h's. Reference: HardwareDecoder.decode's Python loop (tests/test_gpu.py decodes
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
}
