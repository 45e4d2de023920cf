// cuRAND for the emulator: generators seeded as asked, drawing on the host. The streams of
// numbers are not cuRAND's, only their distributions.
#include <cstddef>
#include <random>

namespace {
enum Status { SUCCESS = 0 };
struct Generator {
    std::mt19937_64 engine;
};
}  // namespace

extern "C" {

int curandCreateGenerator(Generator** generator, int) {
    *generator = new Generator;
    return SUCCESS;
}
int curandDestroyGenerator(Generator* generator) {
    delete generator;
    return SUCCESS;
}
int curandSetStream(Generator*, void*) { return SUCCESS; }
int curandSetPseudoRandomGeneratorSeed(Generator* generator, unsigned long long seed) {
    generator->engine.seed(seed);
    return SUCCESS;
}
int curandGenerateUniform(Generator* g, float* out, size_t n) {
    // cuRAND's uniform excludes 0 and includes 1.
    std::uniform_real_distribution<float> d(0.f, 1.f);
    for (size_t i = 0; i < n; ++i) out[i] = 1.f - d(g->engine);
    return SUCCESS;
}
int curandGenerateUniformDouble(Generator* g, double* out, size_t n) {
    std::uniform_real_distribution<double> d(0.0, 1.0);
    for (size_t i = 0; i < n; ++i) out[i] = 1.0 - d(g->engine);
    return SUCCESS;
}
int curandGenerateNormal(Generator* g, float* out, size_t n, float mean, float std) {
    std::normal_distribution<float> d(mean, std);
    for (size_t i = 0; i < n; ++i) out[i] = d(g->engine);
    return SUCCESS;
}
int curandGenerateNormalDouble(Generator* g, double* out, size_t n, double mean, double std) {
    std::normal_distribution<double> d(mean, std);
    for (size_t i = 0; i < n; ++i) out[i] = d(g->engine);
    return SUCCESS;
}

}  // extern "C"
