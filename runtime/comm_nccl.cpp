// The NCCL backend of comm.h (DeviceComm): the gradients' reduce and the parameters' broadcast on
// buffers in GPU memory, so that they go GPU to GPU (NVLink or PCIe peer-to-peer, or NCCL's network
// transports between nodes) instead of through host memory. Built when meson finds nccl.h and
// libnccl next to CUDA; without it make_nccl_comm throws and dos-train uses MPI.
//
// NVLink SHARP (multicast) is left to NCCL's environment: the GPU machines set NCCL_NVLS_ENABLE=0
// and nothing here overrides it.
#include <exception>
#include <stdexcept>
#include <string>

#include "comm.h"

#if defined(DOS_HAVE_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace dos {

#if defined(DOS_HAVE_NCCL)
bool have_nccl() { return true; }

namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + " failed: " + ncclGetErrorString(r));
}
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(e));
}

class NcclComm : public DeviceComm {
 public:
  NcclComm(Comm& host, int device) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId id{};
    if (host.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    host.broadcast(&id, sizeof id, 0);
    check_nccl(ncclCommInitRank(&comm_, host.size(), id, host.rank()), "ncclCommInitRank");
    const cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      ncclCommAbort(comm_);
      check_cuda(e, "cudaStreamCreate (NCCL's stream)");
    }
    int v = 0;
    ncclGetVersion(&v);
    name_ = "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }
  ~NcclComm() override {
    if (std::uncaught_exceptions() > 0) {  // this rank failed: the others may never join a destroy
      ncclCommAbort(comm_);
    } else {
      ncclCommDestroy(comm_);
    }
    cudaStreamDestroy(stream_);
  }
  std::string name() const override { return name_; }

  void reduce_sum(const float* send, float* recv, std::size_t count, int root) override {
    check_nccl(ncclReduce(send, recv, count, ncclFloat32, ncclSum, root, comm_, stream_), "ncclReduce (gradients)");
    check_cuda(cudaStreamSynchronize(stream_), "ncclReduce (gradients), waiting");
  }

  void broadcast(const void* send, void* recv, std::size_t bytes, int root) override {
    check_nccl(ncclBroadcast(send, recv, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast (parameters)");
    check_cuda(cudaStreamSynchronize(stream_), "ncclBroadcast (parameters), waiting");
  }

 private:
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::string name_;
};

}  // namespace

std::unique_ptr<DeviceComm> make_nccl_comm(Comm& host, int cuda_device) {
  return std::make_unique<NcclComm>(host, cuda_device);
}
#else
bool have_nccl() { return false; }
std::unique_ptr<DeviceComm> make_nccl_comm(Comm&, int) {
  throw std::runtime_error("this build has no NCCL (it needs CUDA, and nccl.h and libnccl where meson looks: "
                           "-Dnccl_dir=...); use --comm mpi");
}
#endif

}  // namespace dos
