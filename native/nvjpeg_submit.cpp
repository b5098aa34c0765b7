// recordtool._nvsubmit: one batch of nvJPEG's hardware decode submitted in one call, GIL released;
// and one batch of headers read (nvjpegGetImageInfo) the same way.
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

#include <cstddef>
#include <cstdint>

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
// 0..2). Returns (status, call, index): call 0 = done, 1 = nvjpegDecodeParamsSetROI of image
// `index`, 2 = nvjpegDecodeBatchedEx; status is nvJPEG's (0 = success).
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
    {
        py::gil_scoped_release nogil;
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
    }
    return py::make_tuple(status, call, at);
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

}  // namespace

PYBIND11_MODULE(_nvsubmit, m) {
    m.doc() = "recordtool: nvJPEG hardware batch submission without the GIL (functions passed by address)";
    m.def("submit", &submit, py::arg("set_roi"), py::arg("batched_ex"), py::arg("handle"), py::arg("state"),
          py::arg("params"), py::arg("ptrs_out"), py::arg("lens_out"), py::arg("imgs_out"), py::arg("host_ptrs"),
          py::arg("lengths"), py::arg("rois"), py::arg("dsts"), py::arg("pitches"), py::arg("stream"),
          py::arg("capacity"));
    m.def("infos", &infos, py::arg("get_info"), py::arg("handle"), py::arg("host_ptrs"), py::arg("lengths"));
}
