// Softmax cross-entropy, one warp per row. Forward writes per-row loss and the probabilities;
// backward writes d_logits = (p - onehot(label)) * d_loss / rows.
extern "C" __global__ void softmax_xent_forward(const float* __restrict__ logits, const int* __restrict__ labels,
                                                float* __restrict__ probs, float* __restrict__ loss,
                                                int rows, int cols) {
    int warps_per_block = blockDim.x / 32;
    int row = blockIdx.x * warps_per_block + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* lr = logits + (size_t)row * cols;
    float m = -__int_as_float(0x7f800000);
    for (int j = lane; j < cols; j += 32) m = fmaxf(m, lr[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = 0.0f;
    for (int j = lane; j < cols; j += 32) s += expf(lr[j] - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float log_s = logf(s);
    for (int j = lane; j < cols; j += 32) probs[(size_t)row * cols + j] = expf(lr[j] - m) / s;
    if (lane == 0) {
        int label = labels[row];
        loss[row] = log_s + m - lr[label];
    }
}

extern "C" __global__ void softmax_xent_backward(const float* __restrict__ probs, const int* __restrict__ labels,
                                                 const float* __restrict__ d_loss, float* __restrict__ d_logits,
                                                 int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    int row = i / cols;
    int col = i - row * cols;
    float g = probs[i] - (labels[row] == col ? 1.0f : 0.0f);
    d_logits[i] = g * (d_loss[0] / rows);
}
