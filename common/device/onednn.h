// The CPU device's convolutions and poolings on oneDNN (Debian's libdnnl, the library
// TensorFlow and PyTorch use on CPUs), on the channels-last data Keras uses (nhwc); a
// convolution's kernel goes from Keras' hwio layout to the one oneDNN's fastest kernel wants
// and back (small beside the convolution). Each thread makes the primitives of a shape once
// and reuses them. Internal to common/device/.
//
// Thread safety: each call runs on a stream of the calling thread, with
// IntraOpThreads() OpenMP threads (1 by default: that thread alone).
#pragma once

#include <cstdint>

#include "stratum/device/device.h"

namespace stratum::onednn {

void Conv2DForward(const Window2D& w, int64_t batch, const float* x, const float* kernel,
                   const float* bias, float* out);
void Conv2DBackwardData(const Window2D& w, int64_t batch, const float* grad_out,
                        const float* kernel, float* grad_x);
void Conv2DBackwardWeights(const Window2D& w, int64_t batch, const float* x, const float* grad_out,
                           float* grad_kernel, float* grad_bias);

// Max (max true) or average pooling (the positions inside the image alone), channels_last.
void Pool2DForward(const Window2D& w, int64_t batch, bool max, const float* x, float* out);
// grad_x = d/dx of the pooling, from grad_out (overwritten); max pooling routes each
// window's gradient to its first maximum in x.
void Pool2DBackward(const Window2D& w, int64_t batch, bool max, const float* x,
                    const float* grad_out, float* grad_x);

}  // namespace stratum::onednn
