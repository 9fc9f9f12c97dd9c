// The compute emulator's GPU backend: cuBLAS GEMMs with fp32 accumulation (compute_emulator.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "compute_emulator.h"

namespace dos_train {
namespace {

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw std::runtime_error("compute emulator: " + what + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const std::string& what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("compute emulator: " + what + " failed (cuBLAS status " + std::to_string(int(s)) + ")");
}

class CudaBackend : public ComputeBackend {
 public:
  explicit CudaBackend(dos::DType t) : dtype_(t) {
    type_ = t == dos::DType::bf16 ? CUDA_R_16BF : t == dos::DType::fp16 ? CUDA_R_16F : CUDA_R_32F;
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    const cublasStatus_t st = cublasCreate(&h_);
    if (st != CUBLAS_STATUS_SUCCESS) cudaStreamDestroy(stream_);
    check(st, "cublasCreate");
    check(cublasSetStream(h_, stream_), "cublasSetStream");
    check(cudaEventCreate(&span_begin_), "cudaEventCreate");
    check(cudaEventCreate(&span_end_), "cudaEventCreate");
  }
  ~CudaBackend() override {
    cudaEventDestroy(span_begin_);
    cudaEventDestroy(span_end_);
    cublasDestroy(h_);
    cudaStreamDestroy(stream_);
  }
  std::size_t elem_bytes() const override { return dos::dtype_size(dtype_); }
  void* alloc(std::size_t bytes) override {
    void* p = nullptr;
    // stream-ordered, as a training framework's caching allocator: cudaMalloc and cudaFree would
    // wait for the whole device, the runtime's transfers on StarPU's streams included
    const cudaError_t got = cudaMallocAsync(&p, bytes ? bytes : 256, stream_);
    if (got == cudaErrorMemoryAllocation)  // StarPU keeps what it freed up to its limit beside these
      throw std::runtime_error("compute emulator: cudaMallocAsync of " + std::to_string(bytes) +
                               " bytes of activations: out of memory (" + memory_at_failure() +
                               "; StarPU keeps up to the GPU budgets' worth of GPU memory beside the activations, "
                               "the buffers it freed included: lower --gpu-update-budget or --tokens)");
    check(got, "cudaMallocAsync of " + std::to_string(bytes) + " bytes of activations");
    const cudaError_t e = cudaMemsetAsync(p, 0x3c, bytes, stream_);  // about 1e-2 in bf16 and fp32, 1 in fp16
    if (e != cudaSuccess) cudaFreeAsync(p, stream_);
    check(e, "cudaMemset");
    return p;
  }
  void free(void* p) override { cudaFreeAsync(p, stream_); }
  /// Where the GPU's memory was when an allocation failed, for the error: the device's free and
  /// total bytes (cudaMemGetInfo) and what the device's default pool had reserved and had in use,
  /// in GB. cudaMallocAsync draws the activations from that pool, and the bundled StarPU its device
  /// buffers (scripts/starpu-1.3.10-malloc-async.patch), so the pool holds both, StarPU's buffers of
  /// unregistered data included (StarPU keeps them allocated, cached for reuse, until its limit
  /// makes it reclaim them); the rest of the used memory is outside the pool (the model's parameters
  /// and gradients, the CUDA contexts). A figure that cannot be read is left out. Throws nothing.
  static std::string memory_at_failure() {
    char text[320] = "";
    std::size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) == cudaSuccess)
      std::snprintf(text, sizeof text, "the GPU had %.2f GB free of %.2f GB", free_b / 1e9, total / 1e9);
    int device = 0;
    cudaMemPool_t pool{};
    std::uint64_t reserved = 0, used = 0;  // the attributes are 64-bit counts
    if (cudaGetDevice(&device) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess &&
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess &&
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess) {
      const std::size_t n = std::strlen(text);
      std::snprintf(text + n, sizeof text - n,
                    "%sthe default pool (StarPU's buffers and the activations) held %.2f GB, %.2f GB of it in use",
                    n ? "; " : "", double(reserved) / 1e9, double(used) / 1e9);
    }
    cudaGetLastError();  // a failed query leaves no error behind for the next call
    return text[0] ? text : "the GPU's free memory could not be read";
  }
  void forward(const void* W, const void* X, void* Y, std::int64_t T, std::int64_t in, std::int64_t out) override {
    // cuBLAS is column-major: Y [T,out] row-major is [out,T] column-major, W [out,in] row-major is
    // [in,out] column-major, X is [in,T]: Y = op_T(W) X.
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, W, in, X, in, Y, out);
  }
  void backward(const void* W, const void* X, const void* dY, void* dX, void* dW, std::int64_t T, std::int64_t in,
                std::int64_t out) override {
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, T, out, W, in, dY, out, dX, in);   // dX^T[in,T] = W^T[in,out] dY^T[out,T]
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, T, X, in, dY, out, dW, in);   // dW^T[in,out] = X^T[in,T] dY[T,out]
  }
  void sync() override { check(cudaStreamSynchronize(stream_), "GEMMs"); }
  void span_begin() override { check(cudaEventRecord(span_begin_, stream_), "cudaEventRecord"); }
  double span_end() override {
    check(cudaEventRecord(span_end_, stream_), "cudaEventRecord");
    check(cudaEventSynchronize(span_end_), "GEMMs");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, span_begin_, span_end_), "cudaEventElapsedTime");
    return 1e-3 * double(ms);
  }
  std::uint64_t used_bytes() const override {
    std::size_t free_b = 0, total = 0;
    check(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
    return total - free_b;
  }

 private:
  void gemm(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t k, const void* A,
            std::int64_t lda, const void* B, std::int64_t ldb, void* C, std::int64_t ldc) {
    const float alpha = 1.0f, beta = 0.0f;
    check(cublasGemmEx(h_, ta, tb, int(m), int(n), int(k), &alpha, A, type_, int(lda), B, type_, int(ldb), &beta, C,
                       type_, int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
  }
  dos::DType dtype_;
  cudaDataType_t type_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t h_ = nullptr;
  cudaEvent_t span_begin_ = nullptr, span_end_ = nullptr;
};

}  // namespace

std::unique_ptr<ComputeBackend> make_cuda_backend(dos::DType dtype) { return std::make_unique<CudaBackend>(dtype); }

}  // namespace dos_train
