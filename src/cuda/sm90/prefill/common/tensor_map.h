// Host helpers of the prefill kernels that read through the TMA unit: the driver's
// cuTensorMapEncodeTiled (looked up once, no libcuda link) and tensor-map encoders.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <string>

#include "cuda/sm90/prefill/workspace.h"
#include "kdakit/kdakit.h"

namespace kdakit::sm90::prefill::common {

// cuTensorMapEncodeTiled from the driver, looked up once (no libcuda link needed).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult qres{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &qres) !=
            cudaSuccess ||
        qres != cudaDriverEntryPointSuccess)
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

inline Status encode_block_map(CUtensorMap* map, CUtensorMapDataType dtype, const void* base, uint64_t cols,
                               uint64_t rows, uint64_t blocks, uint64_t row_bytes, uint32_t box_cols,
                               uint32_t box_rows, CUtensorMapSwizzle swizzle, const char* name) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr)
    return Status(StatusCode::kCudaError, "prefill: cuTensorMapEncodeTiled not found in the CUDA driver");
  const cuuint64_t dims[3] = {cols, rows, blocks};
  const cuuint64_t strides[2] = {row_bytes, kChunkBlockBytes};
  const cuuint32_t box[3] = {box_cols, box_rows, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult res = encode(map, dtype, 3, const_cast<void*>(base), dims, strides, box, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS)
    return Status(StatusCode::kCudaError,
                  std::string("prefill: cuTensorMapEncodeTiled failed for ") + name + " (CUresult " +
                      std::to_string(int(res)) + ")");
  return Status::Ok();
}

// A [B, T, heads, D] bf16 activation (q, k, v or g; strides in elements, the last dim
// contiguous) as a 4D map (D, heads, T, B) read in boxes of 64 channels x 1 head x 64 tokens,
// 128-byte swizzled: a box lands as 64 rows (tokens) of 128 bytes, 8 KB, and the 16-byte chunk
// c of row r sits at chunk c ^ (r % 8). Tokens past T read as zeros. Needs a 16-byte aligned
// base and strides that are multiples of 8 elements (the caller checks).
inline Status encode_activation_map(CUtensorMap* map, const void* base, uint64_t dim, uint64_t heads,
                                    uint64_t tokens, uint64_t batch, int64_t stride_h, int64_t stride_t,
                                    int64_t stride_b, const char* name) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr)
    return Status(StatusCode::kCudaError, "prefill: cuTensorMapEncodeTiled not found in the CUDA driver");
  const cuuint64_t dims[4] = {dim, heads, tokens, batch};
  const cuuint64_t strides[3] = {cuuint64_t(stride_h) * 2, cuuint64_t(stride_t) * 2, cuuint64_t(stride_b) * 2};
  const cuuint32_t box[4] = {64, 1, 64, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult res = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides, box,
                              elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS)
    return Status(StatusCode::kCudaError,
                  std::string("prefill: cuTensorMapEncodeTiled failed for ") + name + " (CUresult " +
                      std::to_string(int(res)) + ")");
  return Status::Ok();
}

}  // namespace kdakit::sm90::prefill::common
