// Prototype (benchmarks only, not part of the package): batch-1 tree attention in ONE launch,
// the split-KV reduction done through a thread-block cluster's distributed shared memory.
//
// Why: on an H200 the Triton kernel's batch-1 call (ctx 4096, 16 tree tokens) spends ~3 us on
// the partials' round trip through global memory plus the merge kernel (KERNELS_NOTES.md v7).
// Here the S splits of one KV head form one cluster; each CTA leaves (m, l, O) of its 64 rows in
// its own shared memory, the cluster synchronises, and CTA s merges rows [s*64/S, (s+1)*64/S)
// by reading every peer's shared memory. No partials in HBM, no second kernel.
//
// Scope of the prototype: one sequence, G = 4 query heads per KV head, head dim 128, bf16,
// N <= 16 tree tokens (64 packed rows: row r = token r / 4, head kvh * 4 + r % 4). Tensor cores
// through mma.sync.m16n8k16 (4 warps, 16 rows each), K/V streamed with cp.async through a ring
// of 4 blocks of 64 keys (at ctx 4096 and 16 splits: the whole chunk in flight at once),
// FA2-style online softmax in registers.
//
// Roofline per call: bytes = 2 * (prefix + N) * Hkv * 128 * 2 (K and V read once);
// FLOPs = 4 * 64 * 128 * (prefix + N) per KV head.

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#ifndef KERNEL_ONLY  // KERNEL_ONLY: compile the device code alone (a syntax / register check)
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#endif

namespace cg = cooperative_groups;

constexpr int D = 128;          // head dim
constexpr int G = 4;            // query heads per KV head
constexpr int ROWS = 64;        // packed rows (16 tokens x 4 heads)
constexpr int BN = 64;          // keys per block
constexpr int PAD = 8;          // bf16 elements of row padding (16 B): conflict-free ldmatrix
constexpr int LD = D + PAD;     // smem row stride in elements
constexpr int TREE = 16;        // tree keys (one k-step)
constexpr int THREADS = 128;

// shared memory layout (bf16 elements): Q [64][LD], K [4][64][LD], V [4][64][LD],
// KT [16][LD], VT [16][LD]; after the compute the K region is reused for the fp32 O rows
// [64][D + 4] and the m, l vectors.
constexpr int Q_ELEMS = ROWS * LD;
__host__ __device__ constexpr int kv_elems(int stages) { return stages * BN * LD; }  // ring of K/V blocks
constexpr int T_ELEMS = TREE * LD;
__host__ __device__ constexpr int smem_bytes(int stages) { return (Q_ELEMS + 2 * kv_elems(stages) + 2 * T_ELEMS) * 2; }
constexpr int OLD = D + 4;      // fp32 O row stride in the reduction buffer

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  int n = valid ? 16 : 0;  // src-size 0: zero-fill
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// D(16x8 f32) += A(16x16 bf16, row) * B(16x8 bf16, col)
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Copy `rows` rows of 128 bf16 (256 B = 16 chunks of 16 B) from global (row stride in elements)
// to smem rows of stride LD; rows >= valid are zero-filled.
__device__ __forceinline__ void load_rows(__nv_bfloat16* dst, const __nv_bfloat16* src,
                                          int64_t stride, int rows, int valid) {
  for (int i = threadIdx.x; i < rows * 16; i += THREADS) {
    int r = i >> 4, c = (i & 15) * 8;
    bool ok = r < valid;
    cp_async16(dst + r * LD + c, src + (ok ? r : 0) * stride + c, ok);
  }
}

// One key block for warp w's 16 rows: scores (8 n-tiles of 8 keys), mask, online softmax,
// P @ V. kvalid: keys < kvalid are real; tree: mask bits per row token.
template <int NT>  // n-tiles of 8 keys in this block (8 for a prefix block, 2 for the tree)
__device__ __forceinline__ void block_step(const uint32_t (&qa)[8][4], const __nv_bfloat16* Ks,
                                           const __nv_bfloat16* Vs, int kvalid, bool tree,
                                           uint64_t mask0, uint64_t mask1, float scale_log2,
                                           float (&m)[2], float (&l)[2], float (&o)[16][4]) {
  const int lane = threadIdx.x & 31;
  float s[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
  // S = Q K^T: B fragment of n-tile nt, k-step ks from K rows [nt*8, +8), cols [ks*16, +16)
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int ks = 0; ks < 8; ks += 2) {
      // x4: matrices (k-half 0, ks), (k-half 1, ks), (k-half 0, ks+1), (k-half 1, ks+1)
      uint32_t b[4];
      int row = nt * 8 + (lane & 7);
      int col = ks * 16 + (lane >> 3) * 8;
      ldmatrix_x4(b, Ks + row * LD + col);
      mma16816(s[nt], qa[ks], b[0], b[1]);
      mma16816(s[nt], qa[ks + 1], b[2], b[3]);
    }
  }
  // mask and online softmax: this thread's rows r0 = lane/4, r1 = r0 + 8 (of the warp's 16)
  const int c0 = (lane & 3) * 2;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int key = nt * 8 + c0 + (e & 1);
      bool ok = key < kvalid;
      if (tree) ok = ok && (((e < 2 ? mask0 : mask1) >> key) & 1ull);
      float v = ok ? s[nt][e] * scale_log2 : -INFINITY;
      s[nt][e] = v;
      mx[e >> 1] = fmaxf(mx[e >> 1], v);
    }
  }
  float alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 2));
    float mn = fmaxf(m[h], mx[h]);
    // a row with nothing allowed so far keeps m = -inf: use 0 as reference, alpha 1 (l = 0)
    float ref = mn == -INFINITY ? 0.f : mn;
    alpha[h] = exp2f(m[h] - ref);
    m[h] = mn;
    mx[h] = ref;
  }
  float ls[2] = {0.f, 0.f};
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float p = exp2f(s[nt][e] - mx[e >> 1]);
      s[nt][e] = p;
      ls[e >> 1] += p;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + ls[h];
#pragma unroll
  for (int dt = 0; dt < 16; ++dt) {
    o[dt][0] *= alpha[0];
    o[dt][1] *= alpha[0];
    o[dt][2] *= alpha[1];
    o[dt][3] *= alpha[1];
  }
  // O += P V: k-step kk covers keys [kk*16, +16) = n-tiles 2kk, 2kk+1 of S
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                      pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                      pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int dt = 0; dt < 16; dt += 2) {
      // x4.trans: matrices (keys kk*16+0..7, d dt*8), (keys +8.., d dt*8), (keys 0..7, d dt*8+8),
      // (keys 8.., d dt*8+8)
      uint32_t b[4];
      int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      int col = dt * 8 + (lane >> 4) * 8;
      ldmatrix_x4_trans(b, Vs + key * LD + col);
      mma16816(o[dt], pa, b[0], b[1]);
      mma16816(o[dt + 1], pa, b[2], b[3]);
    }
  }
}

template <int S, int STAGES>
__global__ void __cluster_dims__(S, 1, 1) __launch_bounds__(THREADS, 1)
    tree_attention_cluster_kernel(const __nv_bfloat16* __restrict__ q,  // [N, Hq, D]
                                  const __nv_bfloat16* __restrict__ k,  // [slots, Hkv, D]
                                  const __nv_bfloat16* __restrict__ v,
                                  const int64_t* __restrict__ tree_mask,  // [N]
                                  __nv_bfloat16* __restrict__ out,        // [N, Hq, D]
                                  int n_tokens, int prefix, int hkv, int chunk, float scale_log2) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* Ks = Qs + Q_ELEMS;
  __nv_bfloat16* Vs = Ks + kv_elems(STAGES);
  __nv_bfloat16* KTs = Vs + kv_elems(STAGES);
  __nv_bfloat16* VTs = KTs + T_ELEMS;
  cg::cluster_group cluster = cg::this_cluster();
  const int split = blockIdx.x;  // == cluster rank (cluster spans the x dimension)
  const int kvh = blockIdx.y;
  const int hq = hkv * G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = n_tokens * G;
  const int64_t kv_stride = int64_t(hkv) * D;

  // Q rows: row r = token r / G, head kvh * G + r % G (zero past the tree)
  for (int i = threadIdx.x; i < ROWS * 16; i += THREADS) {
    int r = i >> 4, c = (i & 15) * 8;
    bool ok = r < rows;
    const __nv_bfloat16* src = q + (int64_t(ok ? r / G : 0) * hq + kvh * G + r % G) * D + c;
    cp_async16(Qs + r * LD + c, src, ok);
  }
  const int lo = split * chunk;
  const int hi = min(lo + chunk, prefix);
  const int nblocks = hi > lo ? (hi - lo + BN - 1) / BN : 0;
  const bool last = split == S - 1;
  auto issue = [&](int j) {  // block j of the chunk into ring stage j % STAGES
    int start = lo + j * BN;
    int valid = min(BN, hi - start);
    int st = j % STAGES;
    load_rows(Ks + st * BN * LD, k + (int64_t(start) * hkv + kvh) * D, kv_stride, BN, valid);
    load_rows(Vs + st * BN * LD, v + (int64_t(start) * hkv + kvh) * D, kv_stride, BN, valid);
  };
  // group 0: Q, the tree keys' K/V (last split; they sit right after the prefix) and block 0;
  // groups 1 .. STAGES-1: the next blocks (empty groups past the chunk keep the count uniform)
  if (last) {
    load_rows(KTs, k + (int64_t(prefix) * hkv + kvh) * D, kv_stride, TREE, n_tokens);
    load_rows(VTs, v + (int64_t(prefix) * hkv + kvh) * D, kv_stride, TREE, n_tokens);
  }
#pragma unroll
  for (int j = 0; j < STAGES; ++j) {
    if (j < nblocks) issue(j);
    cp_async_commit();
  }

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[16][4];
#pragma unroll
  for (int dt = 0; dt < 16; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;

  cp_async_wait<STAGES - 1>();  // group 0 landed: Q (and block 0, the tree K/V)
  __syncthreads();
  uint32_t qa[8][4];  // A fragments of the warp's 16 rows, 8 k-steps
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    int row = warp * 16 + (lane & 15);
    int col = ks * 16 + (lane >> 4) * 8;
    ldmatrix_x4(qa[ks], Qs + row * LD + col);
  }
  for (int j = 0; j < nblocks; ++j) {
    cp_async_wait<STAGES - 1>();  // block j's group is the oldest pending one
    __syncthreads();
    int st = j % STAGES;
    int valid = min(BN, hi - (lo + j * BN));
    block_step<8>(qa, Ks + st * BN * LD, Vs + st * BN * LD, valid, false, 0, 0, scale_log2, m,
                  l, o);
    __syncthreads();  // every warp is done with this stage before it is refilled
    if (j + STAGES < nblocks) issue(j + STAGES);
    cp_async_commit();
  }
  cp_async_wait<0>();
  __syncthreads();
  if (last) {
    int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
    uint64_t m0 = r0 < rows ? static_cast<uint64_t>(tree_mask[r0 / G]) : 0ull;
    uint64_t m1 = r1 < rows ? static_cast<uint64_t>(tree_mask[r1 / G]) : 0ull;
    block_step<2>(qa, KTs, VTs, n_tokens, true, m0, m1, scale_log2, m, l, o);
  }
  // finish l across the quad; leave (m, l, O) of this CTA's rows in shared memory
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 2);
  }
  __syncthreads();  // everyone is done with K/V smem
  float* Ob = reinterpret_cast<float*>(Ks);  // [64][OLD] fp32
  float* Mb = Ob + ROWS * OLD;               // [64]
  float* Lb = Mb + ROWS;                     // [64]
  {
    int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
    int c = (lane & 3) * 2;
#pragma unroll
    for (int dt = 0; dt < 16; ++dt) {
      Ob[r0 * OLD + dt * 8 + c] = o[dt][0];
      Ob[r0 * OLD + dt * 8 + c + 1] = o[dt][1];
      Ob[r1 * OLD + dt * 8 + c] = o[dt][2];
      Ob[r1 * OLD + dt * 8 + c + 1] = o[dt][3];
    }
    if ((lane & 3) == 0) {
      Mb[r0] = m[0];
      Lb[r0] = l[0];
      Mb[r1] = m[1];
      Lb[r1] = l[1];
    }
  }
  cluster.sync();  // every CTA's partial is in its shared memory (release / acquire)

  // CTA `split` merges rows [split * 64 / S, (split + 1) * 64 / S): 128 threads over
  // (row, 4 columns) pairs
  constexpr int RPC = ROWS / S;  // rows per CTA
  for (int i = threadIdx.x; i < RPC * (D / 4); i += THREADS) {
    int rr = i / (D / 4), c4 = (i % (D / 4)) * 4;
    int r = split * RPC + rr;
    if (r < rows) {
      float mm = -INFINITY;
#pragma unroll
      for (int p = 0; p < S; ++p) mm = fmaxf(mm, cluster.map_shared_rank(Mb, p)[r]);
      float ref = mm == -INFINITY ? 0.f : mm;
      float lsum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int p = 0; p < S; ++p) {
        float w = exp2f(cluster.map_shared_rank(Mb, p)[r] - ref);
        lsum += w * cluster.map_shared_rank(Lb, p)[r];
        float4 ov = *reinterpret_cast<const float4*>(cluster.map_shared_rank(Ob, p) + r * OLD + c4);
        acc[0] += w * ov.x;
        acc[1] += w * ov.y;
        acc[2] += w * ov.z;
        acc[3] += w * ov.w;
      }
      float inv = lsum > 0.f ? 1.f / lsum : 0.f;
      __nv_bfloat16* dst = out + (int64_t(r / G) * hq + kvh * G + r % G) * D + c4;
      reinterpret_cast<uint32_t*>(dst)[0] = pack_bf16(acc[0] * inv, acc[1] * inv);
      reinterpret_cast<uint32_t*>(dst)[1] = pack_bf16(acc[2] * inv, acc[3] * inv);
    }
  }
  cluster.sync();  // peers may still read this CTA's shared memory
}

#ifndef KERNEL_ONLY
template <int S, int STAGES>
void launch(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
            const torch::Tensor& mask, torch::Tensor& out, int prefix, float scale_log2) {
  const int n = q.size(0), hkv = k.size(1);
  const int chunk = ((prefix + S - 1) / S + BN - 1) / BN * BN;
  auto kernel = tree_attention_cluster_kernel<S, STAGES>;
  constexpr int SMEM_BYTES = smem_bytes(STAGES);
  static bool configured = false;
  if (!configured) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        SMEM_BYTES));
    if (S > 8)
      C10_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    configured = true;
  }
  dim3 grid(S, hkv);
  kernel<<<grid, THREADS, SMEM_BYTES, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(q.data_ptr()),
      reinterpret_cast<const __nv_bfloat16*>(k.data_ptr()),
      reinterpret_cast<const __nv_bfloat16*>(v.data_ptr()), mask.data_ptr<int64_t>(),
      reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), n, prefix, hkv, chunk, scale_log2);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// q [N, Hq, 128] bf16 (N <= 16, Hq = 4 Hkv); k, v [prefix + N (+ more), Hkv, 128] bf16 of one
// sequence starting at slot 0; mask int64 [N] (one word per tree token); splits 8 or 16.
torch::Tensor tree_attention_cluster(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                     torch::Tensor mask, int64_t prefix, int64_t splits,
                                     int64_t stages, double scale_log2) {
  TORCH_CHECK(q.is_cuda() && q.scalar_type() == torch::kBFloat16 && q.is_contiguous());
  TORCH_CHECK(k.scalar_type() == torch::kBFloat16 && k.is_contiguous() && v.is_contiguous());
  TORCH_CHECK(q.size(2) == D && k.size(2) == D && q.size(1) == G * k.size(1));
  TORCH_CHECK(q.size(0) <= TREE, "at most 16 tree tokens");
  TORCH_CHECK(mask.scalar_type() == torch::kInt64 && mask.dim() == 1 && mask.size(0) == q.size(0));
  auto out = torch::empty_like(q);
  if (splits == 16 && stages == 4)
    launch<16, 4>(q, k, v, mask, out, prefix, scale_log2);
  else if (splits == 16 && stages == 2)
    launch<16, 2>(q, k, v, mask, out, prefix, scale_log2);
  else if (splits == 8 && stages == 4)
    launch<8, 4>(q, k, v, mask, out, prefix, scale_log2);
  else if (splits == 8 && stages == 2)
    launch<8, 2>(q, k, v, mask, out, prefix, scale_log2);
  else
    TORCH_CHECK(false, "splits must be 8 or 16, stages 2 or 4");
  return out;
}

// Clusters of this launch that can be resident at once (cudaOccupancyMaxActiveClusters).
template <int S, int STAGES>
int active_clusters(int hkv) {
  auto kernel = tree_attention_cluster_kernel<S, STAGES>;
  constexpr int SMEM_BYTES = smem_bytes(STAGES);
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      SMEM_BYTES));
  if (S > 8)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(S, hkv);
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = SMEM_BYTES;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = S;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
  return n;
}

int64_t max_active_clusters(int64_t splits, int64_t stages, int64_t hkv) {
  if (splits == 16 && stages == 4) return active_clusters<16, 4>(hkv);
  if (splits == 16 && stages == 2) return active_clusters<16, 2>(hkv);
  if (splits == 8 && stages == 4) return active_clusters<8, 4>(hkv);
  if (splits == 8 && stages == 2) return active_clusters<8, 2>(hkv);
  TORCH_CHECK(false, "splits must be 8 or 16, stages 2 or 4");
  return 0;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("max_active_clusters", &max_active_clusters, "resident clusters of a launch");
  m.def("tree_attention_cluster", &tree_attention_cluster,
        "batch-1 tree attention, split-KV reduced through cluster shared memory (prototype)");
}
#else
template __global__ void tree_attention_cluster_kernel<16, 4>(const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const int64_t*, __nv_bfloat16*, int, int, int, int, float);
template __global__ void tree_attention_cluster_kernel<16, 2>(const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const int64_t*, __nv_bfloat16*, int, int, int, int, float);
template __global__ void tree_attention_cluster_kernel<8, 4>(const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const int64_t*, __nv_bfloat16*, int, int, int, int, float);
template __global__ void tree_attention_cluster_kernel<8, 2>(const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const int64_t*, __nv_bfloat16*, int, int, int, int, float);
#endif
