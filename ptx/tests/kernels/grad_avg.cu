// Fused gradient averaging over the towers' gradient buffers plus a momentum update:
// g = mean_t grads[t][i]; v = momentum * v + g; w -= lr * v.
#define MAX_TOWERS 8
struct TowerGrads {
    const float* grads[MAX_TOWERS];
    int count;
};

extern "C" __global__ void grad_avg_momentum(TowerGrads towers, float* __restrict__ weights,
                                             float* __restrict__ velocity, float lr, float momentum,
                                             int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = 0.0f;
    for (int t = 0; t < towers.count; ++t) g += towers.grads[t][i];
    g *= 1.0f / towers.count;
    float v = momentum * velocity[i] + g;
    velocity[i] = v;
    weights[i] -= lr * v;
}
