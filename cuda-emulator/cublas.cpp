// cuBLAS for the emulator: the handle calls candle makes, and its batched GEMMs computed
// naively on the host (column-major, as cuBLAS is), each element's products summed in double
// and rounded once into the output's type.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace {

// cudaDataType_t and cublasComputeType_t values (library_types.h, cublas_api.h).
enum DataType { R_32F = 0, R_64F = 1, R_16F = 2, R_16BF = 14 };
enum ComputeType { COMPUTE_16F = 64, COMPUTE_16F_PEDANTIC = 65, COMPUTE_64F = 70, COMPUTE_64F_PEDANTIC = 71 };
enum Status { SUCCESS = 0, INVALID_VALUE = 7, NOT_SUPPORTED = 15 };
int handle_tag;

bool known(int type) { return type == R_32F || type == R_64F || type == R_16F || type == R_16BF; }

double read(const void* base, int type, long long i) {
    switch (type) {
    case R_32F: return static_cast<const float*>(base)[i];
    case R_64F: return static_cast<const double*>(base)[i];
    case R_16F: return __half2float(static_cast<const __half*>(base)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    }
}

void write(void* base, int type, long long i, double v) {
    switch (type) {
    case R_32F: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case R_64F: static_cast<double*>(base)[i] = v; break;
    case R_16F: static_cast<__half*>(base)[i] = __float2half_rn(static_cast<float>(v)); break;
    default: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(static_cast<float>(v)); break;
    }
}

// The scalar type of alpha and beta for a compute type.
double scalar(const void* p, int compute) {
    if (compute == COMPUTE_64F || compute == COMPUTE_64F_PEDANTIC) return *static_cast<const double*>(p);
    if (compute == COMPUTE_16F || compute == COMPUTE_16F_PEDANTIC) return __half2float(*static_cast<const __half*>(p));
    return *static_cast<const float*>(p);
}

// C = alpha op(A) op(B) + beta C for each of `batch` matrices; op transposes where `trans` is
// not 0 (CUBLAS_OP_N).
int gemm(int transa, int transb, int m, int n, int k, double alpha, const void* A, int atype, int lda,
         long long stride_a, const void* B, int btype, int ldb, long long stride_b, double beta, void* C, int ctype,
         int ldc, long long stride_c, int batch) {
    if (!known(atype) || !known(btype) || !known(ctype)) return NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || batch < 0) return INVALID_VALUE;
    for (int b = 0; b < batch; ++b)
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i) {
                double sum = 0;
                for (int l = 0; l < k; ++l) {
                    const long long a = b * stride_a + (transa ? l + 1ll * i * lda : i + 1ll * l * lda);
                    const long long bb = b * stride_b + (transb ? j + 1ll * l * ldb : l + 1ll * j * ldb);
                    sum += read(A, atype, a) * read(B, btype, bb);
                }
                const long long c = b * stride_c + i + 1ll * j * ldc;
                write(C, ctype, c, alpha * sum + (beta == 0 ? 0 : beta * read(C, ctype, c)));
            }
    return SUCCESS;
}

}  // namespace

extern "C" {

int cublasCreate_v2(void** handle) {
    *handle = &handle_tag;
    return SUCCESS;
}
int cublasDestroy_v2(void*) { return SUCCESS; }
int cublasSetStream_v2(void*, void*) { return SUCCESS; }
int cublasSetMathMode(void*, int) { return SUCCESS; }
int cublasSetWorkspace_v2(void*, void*, size_t) { return SUCCESS; }

int cublasGemmStridedBatchedEx(void*, int transa, int transb, int m, int n, int k, const void* alpha, const void* A,
                               int atype, int lda, long long stride_a, const void* B, int btype, int ldb,
                               long long stride_b, const void* beta, void* C, int ctype, int ldc, long long stride_c,
                               int batch, int compute, int) {
    return gemm(transa, transb, m, n, k, scalar(alpha, compute), A, atype, lda, stride_a, B, btype, ldb, stride_b,
                scalar(beta, compute), C, ctype, ldc, stride_c, batch);
}
int cublasGemmEx(void* handle, int transa, int transb, int m, int n, int k, const void* alpha, const void* A, int atype,
                 int lda, const void* B, int btype, int ldb, const void* beta, void* C, int ctype, int ldc, int compute,
                 int algo) {
    return cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, atype, lda, 0, B, btype, ldb, 0, beta,
                                      C, ctype, ldc, 0, 1, compute, algo);
}
int cublasSgemmStridedBatched(void*, int transa, int transb, int m, int n, int k, const float* alpha, const float* A,
                              int lda, long long stride_a, const float* B, int ldb, long long stride_b,
                              const float* beta, float* C, int ldc, long long stride_c, int batch) {
    return gemm(transa, transb, m, n, k, *alpha, A, R_32F, lda, stride_a, B, R_32F, ldb, stride_b, *beta, C, R_32F, ldc,
                stride_c, batch);
}
int cublasDgemmStridedBatched(void*, int transa, int transb, int m, int n, int k, const double* alpha, const double* A,
                              int lda, long long stride_a, const double* B, int ldb, long long stride_b,
                              const double* beta, double* C, int ldc, long long stride_c, int batch) {
    return gemm(transa, transb, m, n, k, *alpha, A, R_64F, lda, stride_a, B, R_64F, ldb, stride_b, *beta, C, R_64F, ldc,
                stride_c, batch);
}

}  // extern "C"
