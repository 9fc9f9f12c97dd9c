// The MPI backend of comm.h. Large arrays go in pieces of at most 2^28 elements (MPI counts are
// ints, and some MPI stacks overflow byte counts above 4 GiB). The reduce-scatter is one
// MPI_Reduce per rank's shard (to that rank), the all-gather one MPI_Bcast per shard (from its
// owner): correct for any sizes and counts, not the fastest collective an MPI library offers
// (MPI_Reduce_scatter needs int counts and contiguous rank order).
#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "comm.h"

#if defined(DOS_HAVE_MPI)
#include <mpi.h>
#endif

namespace dos {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

int launcher_tasks() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"})
    if (const char* e = std::getenv(v)) return std::max(1, std::atoi(e));
  return 1;
}

#if defined(DOS_HAVE_MPI)
bool have_mpi() { return true; }

namespace {

constexpr std::size_t kPiece = std::size_t(1) << 28;  // elements or bytes per MPI call

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw std::runtime_error(std::string(what) + " failed: " + std::string(msg, std::size_t(len)));
  }
}

int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names)
    if (const char* v = std::getenv(n)) return std::atoi(v);
  return fallback;
}

class MpiComm : public Comm {
 public:
  MpiComm() {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // errors come back to check()
    if (provided < MPI_THREAD_FUNNELED)
      throw std::runtime_error("the MPI library gives no MPI_THREAD_FUNNELED support (only level " +
                               std::to_string(provided) + "): dos-train calls MPI from its main thread beside StarPU's");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
          "MPI_Comm_split_type (the ranks of this node)");
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
    // the launcher's view must agree with MPI's (Slurm's or Open MPI's environment)
    const int env_size = env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, size_);
    if (env_size != size_)
      throw std::runtime_error("the launcher says " + std::to_string(env_size) + " ranks and MPI says " +
                               std::to_string(size_) + ": check srun/mpirun's task count");
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, std::size_t(len));
    name_ = "MPI: " + v.substr(0, v.find_first_of(",\n"));
  }
  ~MpiComm() override { MPI_Finalize(); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string name() const override { return name_; }

  void reduce_sum(const float* send, float* recv, std::size_t count, int root) override {
    for (std::size_t off = 0; off < count; off += kPiece)
      check(MPI_Reduce(send + off, root == rank_ ? recv + off : nullptr, int(std::min(kPiece, count - off)), MPI_FLOAT,
                       MPI_SUM, root, MPI_COMM_WORLD),
            "MPI_Reduce (gradients)");
  }

  void broadcast(void* buf, std::size_t bytes, int root) override {
    for (std::size_t off = 0; off < bytes; off += kPiece)
      check(MPI_Bcast(static_cast<char*>(buf) + off, int(std::min(kPiece, bytes - off)), MPI_BYTE, root, MPI_COMM_WORLD),
            "MPI_Bcast (parameters)");
  }

  void all_gather(const void* shard, void* full, const std::vector<ShardRange>& ranges, std::size_t elem_bytes) override {
    char* out = static_cast<char*>(full);
    const ShardRange& mine = ranges.at(std::size_t(rank_));
    std::copy(static_cast<const char*>(shard), static_cast<const char*>(shard) + (mine.end - mine.begin) * elem_bytes,
              out + mine.begin * elem_bytes);
    for (int r = 0; r < size_; ++r) {
      const ShardRange& s = ranges.at(std::size_t(r));
      broadcast(out + s.begin * elem_bytes, (s.end - s.begin) * elem_bytes, r);
    }
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);  // MPI_Abort does not return; the compiler does not know it
  }

  bool all_ok(bool ok) override {
    int mine = ok ? 1 : 0, all = 0;
    check(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD), "MPI_Allreduce");
    return all != 0;
  }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string name_;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm() { return std::make_unique<MpiComm>(); }
#else
bool have_mpi() { return false; }
std::unique_ptr<Comm> make_mpi_comm() {
  throw std::runtime_error("this build has no MPI (install libopenmpi-dev and rebuild: scripts/setup.sh build)");
}
#endif

}  // namespace dos
