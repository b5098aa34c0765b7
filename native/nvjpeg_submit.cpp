// recordtool._nvsubmit: one batch of nvJPEG's hardware decode submitted in one call, GIL released.
//
// Why: from Python the submission is one ctypes call per image (nvjpegDecodeParamsSetROI) plus
// the batched decode; each ctypes call releases and retakes the GIL, so a training loop on the
// main thread and the producer threads hand the GIL back and forth hundreds of times a batch.
// Here the whole loop runs without the GIL.
//
// Nothing links CUDA or nvJPEG: the functions are nvJPEG's own, passed by address from the
// ctypes binding (recordtool/decode/nvjpeg.py, which loaded the library). Their C signatures
// are nvjpeg.h's. Reference: HardwareDecoder.decode's Python loop (tests/test_gpu.py decodes
// one batch both ways and compares the pixels).
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

// Returns (status, call): call 0 = done, 1 = nvjpegDecodeParamsSetROI of image `index`,
// 2 = nvjpegDecodeBatchedEx; status is nvJPEG's (0 = success).
py::tuple submit(uintptr_t set_roi, uintptr_t batched_ex, uintptr_t handle, uintptr_t state, uintptr_t params,
                 uintptr_t ptrs_out, uintptr_t lens_out, uintptr_t imgs_out,
                 py::array_t<int64_t, py::array::c_style | py::array::forcecast> host_ptrs,
                 py::array_t<int64_t, py::array::c_style | py::array::forcecast> lengths,
                 py::array_t<int64_t, py::array::c_style | py::array::forcecast> rois,
                 py::array_t<int64_t, py::array::c_style | py::array::forcecast> dsts,
                 py::array_t<int64_t, py::array::c_style | py::array::forcecast> pitches, uintptr_t stream,
                 size_t capacity) {
    const py::ssize_t n = host_ptrs.size();
    if (lengths.size() != n || dsts.size() != n || pitches.size() != n || rois.size() != 4 * n)
        throw std::invalid_argument("submit: host_ptrs, lengths, dsts, pitches (n) and rois (n, 4) must agree");
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
            img.channel[0] = reinterpret_cast<unsigned char*>(dp[k]);
            img.pitch[0] = (size_t)pp[k];
        }
        if (status == 0 && n > 0) {
            status = dec(reinterpret_cast<void*>(handle), reinterpret_cast<void*>(state), out_ptrs, out_lens, out_imgs,
                         prm, reinterpret_cast<void*>(stream));
            if (status != 0) call = 2;
        }
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
}
