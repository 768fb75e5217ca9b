#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm_args.h"

namespace trainyard::kernels::cuda {
namespace {

absl::Status CublasError(cublasStatus_t s, const char* expr, const char* file, int line) {
  return absl::InternalError(absl::StrCat(expr, ": cuBLAS status ", static_cast<int>(s), " (",
                                          cublasLtGetStatusString(s), ") at ", file, ":", line));
}

#define TY_CUBLAS_RETURN_IF_ERROR(expr)                                 \
  do {                                                                  \
    const cublasStatus_t ty_cublas_status_ = (expr);                    \
    if (ty_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                   \
      return CublasError(ty_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                   \
  } while (false)

cudaDataType_t CudaType(DType d) { return d == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

cublasLtEpilogue_t LtEpilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kGeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kGeluAux:
      return CUBLASLT_EPILOGUE_GELU_AUX;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// Largest power of two (at most 256) dividing every address: cuBLASLt picks algorithms by the
// alignment it is promised.
uint32_t CommonAlignment(std::initializer_list<const void*> ptrs) {
  uint32_t align = 256;
  for (const void* p : ptrs) {
    if (p == nullptr) continue;
    const auto addr = reinterpret_cast<uintptr_t>(p);
    while (align > 1 && addr % align != 0) align /= 2;
  }
  return align;
}

// The first element of a Key: the activation type in bits 0-7 and the alignment from bit 8;
// an FP8 product sets kFp8Bit, the formats of cuBLASLt's A and B (E5M2 bits) and fast
// accumulation.
constexpr int kFp8Bit = 1 << 20, kFp8AIsE5M2 = 1 << 21, kFp8BIsE5M2 = 1 << 22,
              kFp8FastAccum = 1 << 23;
constexpr int kAlignMask = (1 << 20) - 1;

cudaDataType_t Fp8Type(bool e5m2) { return e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

}  // namespace

// Key layout: (act, transa, transb, M, N, K, epilogue, d_fp32, accumulate) in cuBLASLt's
// column-major terms, D = op(A)[M×K] · op(B)[K×N]; the alignment is folded into `act`'s high
// bits.
struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool accumulate = false;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(size_t workspace_bytes) {
  std::unique_ptr<Gemm> g(new Gemm());
  cublasLtHandle_t handle = nullptr;
  TY_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle));
  g->handle_ = handle;
  TY_CUDA_RETURN_IF_ERROR(cudaMalloc(&g->workspace_, workspace_bytes));
  g->workspace_bytes_ = workspace_bytes;
  return g;
}

Gemm::~Gemm() {
  if (grouped_handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(grouped_handle_));
  plans_.clear();
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

absl::StatusOr<const Gemm::Plan*> Gemm::GetPlan(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  if (auto it = no_algorithm_.find(key); it != no_algorithm_.end()) return it->second;
  const auto [act_align, transa, transb, M, N, K, epi, d_fp32, accumulate, ld_n] = key;
  const DType act = static_cast<DType>(act_align & 0xff);
  const uint32_t align = static_cast<uint32_t>((act_align & kAlignMask) >> 8);
  const bool fp8 = (act_align & kFp8Bit) != 0;
  auto plan = std::make_unique<Plan>();
  plan->accumulate = accumulate != 0;
  // FP8 products write bf16 (`act`) or fp32 from FP8 operands.
  const cudaDataType_t a_type = fp8 ? Fp8Type(act_align & kFp8AIsE5M2) : CudaType(act);
  const cudaDataType_t b_type = fp8 ? Fp8Type(act_align & kFp8BIsE5M2) : CudaType(act);
  const cudaDataType_t d_type = d_fp32 ? CUDA_R_32F : CudaType(act);
  TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (fp8) {
    const int8_t fast = (act_align & kFp8FastAccum) != 0 ? 1 : 0;
    TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    // The heuristic sees scale pointers set, as every run has them (any device address serves
    // until Run sets the real ones).
    const void* scale = workspace_;
    TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof(scale)));
    TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale, sizeof(scale)));
  }
  const cublasOperation_t op_a = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  TY_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  TY_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const cublasLtEpilogue_t epilogue = LtEpilogue(static_cast<GemmEpilogue>(epi));
  TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  // The heuristic learns the bias and aux alignment from those pointers' values (it never reads
  // their memory), and an unset (null) pointer claims every alignment. Show it an address with
  // exactly the key's alignment, so that the algorithm fits any pointers the key admits (Forward
  // folds the bias and aux pointers into the alignment); Run sets the real ones.
  const void* placeholder = reinterpret_cast<const void*>(static_cast<uintptr_t>(align));
  if (epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
    TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &placeholder, sizeof(placeholder)));
    if (fp8) {  // an FP8 product's bias is bf16 (Gemm::Fp8), stated as FP8 recipes state it
      const cudaDataType_t bias_type = CUDA_R_16BF;
      TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
  }
  if (epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX) {
    const int64_t aux_ld = ld_n;
    TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &placeholder, sizeof(placeholder)));
  }
  const int64_t a_rows = transa ? K : M, a_cols = transa ? M : K;
  const int64_t b_rows = transb ? N : K, b_cols = transb ? K : N;
  const int64_t b_ld = transa ? b_rows : ld_n, d_ld = transa ? ld_n : M;
  TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, a_type, a_rows, a_cols, a_rows));
  TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, b_type, b_rows, b_cols, b_ld));
  TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->d, d_type, M, N, d_ld));

  cublasLtMatmulPreference_t pref = nullptr;
  TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan->desc, plan->a,
                                     plan->b, plan->d, plan->d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
    absl::Status none = absl::UnimplementedError(
        absl::StrCat("cuBLASLt has no algorithm for ", fp8 ? "FP8 to " : "", DTypeName(act),
                     d_fp32 ? " (fp32 out)" : "", " M=", M, " N=", N, " K=", K, " transa=", transa,
                     " transb=", transb, " epilogue=", epi, " alignment=", align));
    // Asked again every step otherwise (SupportsGeluEpilogue's probe, for each layer).
    no_algorithm_.emplace(key, none);
    return none;
  }
  plan->algo = result.algo;
  const Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status Gemm::Run(cudaStream_t stream, const Key& key, const void* a, const void* b, void* d,
                       const void* bias, void* aux, const float* a_scale, const float* b_scale) {
  TY_ASSIGN_OR_RETURN(const Plan* plan, GetPlan(key));
  if (a_scale != nullptr) {
    TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
  }
  if (bias != nullptr) {
    TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (aux != nullptr) {
    TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
  const float alpha = 1.0f, beta = plan->accumulate ? 1.0f : 0.0f;
  TY_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      static_cast<cublasLtHandle_t>(handle_), plan->desc, &alpha, a, plan->a, b, plan->b, &beta, d,
      plan->d, d, plan->d, &plan->algo, workspace_, workspace_bytes_, stream));
  return absl::OkStatus();
}

absl::Status Gemm::Forward(cudaStream_t stream, DType act, void* out, void* pre, const void* inp,
                           const void* weight, const void* bias, int64_t m, int64_t n, int64_t k,
                           GemmEpilogue epilogue, int64_t ld) {
  TY_RETURN_IF_ERROR(gemm_args::CheckProduct(out, inp, weight, m, n, k, ld));
  TY_RETURN_IF_ERROR(gemm_args::CheckEpilogue(epilogue, pre, bias));
  const bool gelu = gemm_args::HasGelu(epilogue);
  const int align = static_cast<int>(CommonAlignment({out, pre, inp, weight, bias}));
  // Column-major: outᵀ[n×m] = (weight stored k×n)ᵀ · (inp stored k×m).
  const Key key{static_cast<int>(act) | align << 8,
                1,
                0,
                n,
                m,
                k,
                static_cast<int>(epilogue),
                0,
                0,
                ld == 0 ? n : ld};
  return Run(stream, key, weight, inp, out, bias, gelu ? pre : nullptr);
}

absl::Status Gemm::BackwardInput(cudaStream_t stream, DType act, void* dinp, const void* dout,
                                 const void* weight, int64_t m, int64_t n, int64_t k, int64_t ld) {
  TY_RETURN_IF_ERROR(gemm_args::CheckProduct(dinp, dout, weight, m, n, k, ld));
  const int align = static_cast<int>(CommonAlignment({dinp, dout, weight}));
  // Column-major: dinpᵀ[k×m] = (weight stored k×n) · (dout stored n×m).
  const Key key{static_cast<int>(act) | align << 8,
                0,
                0,
                k,
                m,
                n,
                static_cast<int>(GemmEpilogue::kNone),
                0,
                0,
                ld == 0 ? n : ld};
  return Run(stream, key, weight, dout, dinp, nullptr, nullptr);
}

absl::Status Gemm::BackwardWeight(cudaStream_t stream, DType act, float* dweight, const void* dout,
                                  const void* inp, int64_t m, int64_t n, int64_t k, int64_t ld) {
  TY_RETURN_IF_ERROR(gemm_args::CheckProduct(dweight, dout, inp, m, n, k, ld));
  const int align = static_cast<int>(CommonAlignment({dweight, dout, inp}));
  // Column-major: dweightᵀ[k×n] += (inp stored k×m) · (dout stored n×m)ᵀ.
  const Key key{static_cast<int>(act) | align << 8,
                0,
                1,
                k,
                n,
                m,
                static_cast<int>(GemmEpilogue::kNone),
                1,
                1,
                ld == 0 ? n : ld};
  return Run(stream, key, inp, dout, dweight, nullptr, nullptr);
}

absl::Status Gemm::Fp8(cudaStream_t stream, void* out, DType out_type, const void* a,
                       Fp8Format a_format, const float* a_scale, const void* b, Fp8Format b_format,
                       const float* b_scale, int64_t m, int64_t n, int64_t k, const void* bias,
                       bool fast_accum) {
  TY_RETURN_IF_ERROR(gemm_args::CheckFp8(out, out_type, a, a_format, a_scale, b, b_format, b_scale,
                                         m, n, k, bias));
  const bool fp32 = out_type == DType::kF32;
  // As Forward: column-major outᵀ[n×m] = (b stored k×n)ᵀ · (a stored k×m), the "TN" form
  // cuBLASLt's FP8 kernels take, so cuBLASLt's A is b and its B is a. The act bits carry the
  // output's type (bf16, or fp32 with accumulation); the alignment is 16 (checked) or the bias's.
  const int align = static_cast<int>(CommonAlignment({out, a, b, bias}));
  int first = static_cast<int>(fp32 ? DType::kBF16 : out_type) | align << 8 | kFp8Bit;
  if (b_format == Fp8Format::kE5M2) first |= kFp8AIsE5M2;
  if (a_format == Fp8Format::kE5M2) first |= kFp8BIsE5M2;
  if (fast_accum) first |= kFp8FastAccum;
  const GemmEpilogue epilogue = bias != nullptr ? GemmEpilogue::kBias : GemmEpilogue::kNone;
  const Key key{first, 1, 0, n, m, k, static_cast<int>(epilogue), fp32 ? 1 : 0, fp32 ? 1 : 0, n};
  return Run(stream, key, b, a, out, bias, nullptr, b_scale, a_scale);
}

absl::Status Gemm::Grouped(cudaStream_t stream, DType act, const GemmGroup& g, int64_t n,
                           int64_t k) {
  TY_RETURN_IF_ERROR(gemm_args::CheckGroup(g, n, k));
  if (g.count == 0) return absl::OkStatus();
  if (grouped_handle_ == nullptr && grouped_available_) {
    cublasHandle_t handle = nullptr;
    if (cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS) {
      grouped_handle_ = handle;
    } else {
      grouped_available_ = false;  // no library (or no memory for its handle): one by one
    }
  }
  const std::pair<int, int> combination{static_cast<int>(g.kind), static_cast<int>(act)};
  if (!GroupedOneByOne(g.kind, act)) {
    // Column-major, one group per product (their m differ), A = y and B = x throughout:
    // forward outᵀ[n×m] = (weight stored k×n)ᵀ · (inp stored k×m); input gradient dinpᵀ[k×m] =
    // (weight stored k×n) · (dout stored n×m); weight gradient dweightᵀ[k×n] += (inp stored k×m)
    // · (dout stored n×m)ᵀ.
    const size_t count = static_cast<size_t>(g.count);
    const bool forward = g.kind == GemmKind::kForward;
    const bool weight_grad = g.kind == GemmKind::kBackwardWeight;
    const cublasOperation_t op_a = forward ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = weight_grad ? CUBLAS_OP_T : CUBLAS_OP_N;
    std::vector<cublasOperation_t> transa(count, op_a), transb(count, op_b);
    // Per product only m varies: it is the columns, or (weight gradient) the depth.
    std::vector<int> rows(count, static_cast<int>(forward ? n : k));
    std::vector<int> cols(count, static_cast<int>(n)),
        depth(count, static_cast<int>(forward ? k : n));
    for (size_t i = 0; i < count; ++i) (weight_grad ? depth : cols)[i] = static_cast<int>(g.m[i]);
    std::vector<int> lda(count, static_cast<int>(k)), ldb(count, static_cast<int>(forward ? k : n));
    std::vector<int> ldc(count, static_cast<int>(forward ? n : k)), sizes(count, 1);
    const std::vector<float> alpha(count, 1.0f), beta(count, weight_grad ? 1.0f : 0.0f);
    const auto handle = static_cast<cublasHandle_t>(grouped_handle_);
    TY_CUBLAS_RETURN_IF_ERROR(cublasSetStream(handle, stream));
    const void* const* device = g.device;
    const cudaDataType_t type = CudaType(act), c_type = weight_grad ? CUDA_R_32F : type;
    const cublasStatus_t s = cublasGemmGroupedBatchedEx(
        handle, transa.data(), transb.data(), rows.data(), cols.data(), depth.data(), alpha.data(),
        device + 2 * count, type, lda.data(), device + count, type, ldb.data(), beta.data(),
        const_cast<void* const*>(device), c_type, ldc.data(), g.count, sizes.data(),
        CUBLAS_COMPUTE_32F);
    if (s == CUBLAS_STATUS_SUCCESS) {
      grouped_ran_.insert(combination);
      return absl::OkStatus();
    }
    // A refusal of a combination's first call means the library has no grouped GEMM for it
    // (nothing ran: the products go one by one below); after a success, it is an error. So is
    // INVALID_VALUE always: the arguments are wrong, and one by one would only hide it.
    if (s != CUBLAS_STATUS_NOT_SUPPORTED || grouped_ran_.contains(combination)) {
      return CublasError(s, "cublasGemmGroupedBatchedEx", __FILE__, __LINE__);
    }
    one_by_one_.insert(combination);
  }
  for (int i = 0; i < g.count; ++i) {
    TY_RETURN_IF_ERROR(gemm_args::RunOne(*this, stream, act, g, i, n, k));
  }
  return absl::OkStatus();
}

bool Gemm::SupportsGeluEpilogue(DType act, int64_t m, int64_t n, int64_t k) {
  if (!gemm_args::GeluEpilogueWidthAllowed(n)) return false;
  const Key key{static_cast<int>(act) | 16 << 8,
                1,
                0,
                n,
                m,
                k,
                static_cast<int>(GemmEpilogue::kGeluAuxBias),
                0,
                0,
                n};
  return GetPlan(key).ok();
}

}  // namespace trainyard::kernels::cuda
