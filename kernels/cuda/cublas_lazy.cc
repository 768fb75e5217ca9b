// The cuBLASLt functions the GEMM launcher calls, and the few cuBLAS ones its grouped GEMMs
// call, resolved from libcublasLt and libcublas on first use instead of at process start.
//
// Linking libcublasLt directly costs every process that links the CUDA kernels about 0.3 s and
// 150 MB of resident memory when it starts (the loader relocates the library's half-gigabyte
// image), whether or not it ever runs a GEMM on a GPU: every CPU worker paid it. These
// definitions stand in for the libraries': the first call dlopens the library (by soname, then
// from the directory libcudart was loaded from) and forwards; without it, every call fails with
// CUBLAS_STATUS_NOT_INITIALIZED, which the launcher reports.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <string>

namespace {

#define TY_STRINGIFY2(x) #x
#define TY_STRINGIFY(x) TY_STRINGIFY2(x)

void* Open(const char* soname) {
  void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  Dl_info info;
  if (h == nullptr && dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) != 0 &&
      info.dli_fname != nullptr) {
    std::string dir = info.dli_fname;
    dir.resize(dir.rfind('/') + 1);
    h = dlopen((dir + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  return h;
}

void* LtSymbol(const char* name) {
  static void* const library = Open("libcublasLt.so." TY_STRINGIFY(CUBLAS_VER_MAJOR));
  return library == nullptr ? nullptr : dlsym(library, name);
}

void* BlasSymbol(const char* name) {
  static void* const library = Open("libcublas.so." TY_STRINGIFY(CUBLAS_VER_MAJOR));
  return library == nullptr ? nullptr : dlsym(library, name);
}

}  // namespace

// Defines `name` (declared by cublasLt.h or cublas_api.h) to forward to the library's (looked
// up with `lookup`), or return `missing`.
#define TY_CUBLAS_FORWARD_FROM(lookup, ret, name, missing, params, args)       \
  extern "C" ret CUBLASWINAPI name params {                                    \
    static const auto fn = reinterpret_cast<decltype(&::name)>(lookup(#name)); \
    if (fn == nullptr) return missing;                                         \
    return fn args;                                                            \
  }
#define TY_CUBLASLT_FORWARD(...) TY_CUBLAS_FORWARD_FROM(LtSymbol, __VA_ARGS__)
#define TY_CUBLAS_FORWARD(...) TY_CUBLAS_FORWARD_FROM(BlasSymbol, __VA_ARGS__)

TY_CUBLASLT_FORWARD(cublasStatus_t, cublasLtCreate, CUBLAS_STATUS_NOT_INITIALIZED,
                    (cublasLtHandle_t * handle), (handle))
TY_CUBLASLT_FORWARD(cublasStatus_t, cublasLtDestroy, CUBLAS_STATUS_NOT_INITIALIZED,
                    (cublasLtHandle_t handle), (handle))
TY_CUBLASLT_FORWARD(const char*, cublasLtGetStatusString, "libcublasLt could not be loaded",
                    (cublasStatus_t status), (status))
TY_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmul, CUBLAS_STATUS_NOT_INITIALIZED,
                    (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                     const void* a, cublasLtMatrixLayout_t a_desc, const void* b,
                     cublasLtMatrixLayout_t b_desc, const void* beta, const void* c,
                     cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                     const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream),
                    (handle, desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d, d_desc, algo,
                     workspace, workspace_bytes, stream))
TY_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic, CUBLAS_STATUS_NOT_INITIALIZED,
                    (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                     cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                     cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                     cublasLtMatmulPreference_t preference, int requested,
                     cublasLtMatmulHeuristicResult_t results[], int* returned),
                    (handle, desc, a_desc, b_desc, c_desc, d_desc, preference, requested, results,
                     returned))
TY_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulDescCreate, CUBLAS_STATUS_NOT_INITIALIZED,
                    (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute,
                     cudaDataType_t scale),
                    (desc, compute, scale))
TY_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulDescDestroy, CUBLAS_STATUS_NOT_INITIALIZED,
                    (cublasLtMatmulDesc_t desc), (desc))
TY_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulDescSetAttribute, CUBLAS_STATUS_NOT_INITIALIZED,
                    (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                     const void* buf, size_t bytes),
                    (desc, attr, buf, bytes))
TY_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceCreate, CUBLAS_STATUS_NOT_INITIALIZED,
                    (cublasLtMatmulPreference_t * pref), (pref))
TY_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceDestroy, CUBLAS_STATUS_NOT_INITIALIZED,
                    (cublasLtMatmulPreference_t pref), (pref))
TY_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
                    CUBLAS_STATUS_NOT_INITIALIZED,
                    (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                     const void* buf, size_t bytes),
                    (pref, attr, buf, bytes))
TY_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutCreate, CUBLAS_STATUS_NOT_INITIALIZED,
                    (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows,
                     uint64_t cols, int64_t ld),
                    (layout, type, rows, cols, ld))
TY_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutDestroy, CUBLAS_STATUS_NOT_INITIALIZED,
                    (cublasLtMatrixLayout_t layout), (layout))

// cuBLAS, for the grouped GEMMs (Gemm::Grouped). A library without the grouped GEMM (before
// CUDA 12.5) answers CUBLAS_STATUS_NOT_SUPPORTED, and the caller runs the products one by one.
TY_CUBLAS_FORWARD(cublasStatus_t, cublasCreate_v2, CUBLAS_STATUS_NOT_INITIALIZED,
                  (cublasHandle_t * handle), (handle))
TY_CUBLAS_FORWARD(cublasStatus_t, cublasDestroy_v2, CUBLAS_STATUS_NOT_INITIALIZED,
                  (cublasHandle_t handle), (handle))
TY_CUBLAS_FORWARD(cublasStatus_t, cublasSetStream_v2, CUBLAS_STATUS_NOT_INITIALIZED,
                  (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
TY_CUBLAS_FORWARD(cublasStatus_t, cublasGemmGroupedBatchedEx, CUBLAS_STATUS_NOT_SUPPORTED,
                  (cublasHandle_t handle, const cublasOperation_t transa_array[],
                   const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
                   const int k_array[], const void* alpha_array, const void* const Aarray[],
                   cudaDataType_t Atype, const int lda_array[], const void* const Barray[],
                   cudaDataType_t Btype, const int ldb_array[], const void* beta_array,
                   void* const Carray[], cudaDataType_t Ctype, const int ldc_array[],
                   int group_count, const int group_size[], cublasComputeType_t computeType),
                  (handle, transa_array, transb_array, m_array, n_array, k_array, alpha_array,
                   Aarray, Atype, lda_array, Barray, Btype, ldb_array, beta_array, Carray, Ctype,
                   ldc_array, group_count, group_size, computeType))
