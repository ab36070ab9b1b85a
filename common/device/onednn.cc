#include "common/device/onednn.h"

#include <omp.h>

#include <array>
#include <map>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "stratum/util/devices.h"

namespace stratum::onednn {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

const dnnl::engine& Engine() {
  static const dnnl::engine* const kEngine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *kEngine;
}

// One stream per thread, whose oneDNN calls run on that thread and IntraOpThreads() - 1 more
// (1 by default): Stratum runs its replicas on threads of their own, and oneDNN's OpenMP
// team on top of them (or beside a busy core) spent most of a step spinning (685 examples/s
// against 2,523 on one thread, for the tutorial CNN on this 2-core machine kind).
dnnl::stream& Stream() {
  thread_local dnnl::stream stream(Engine());
  thread_local int threads = 0;
  if (const int wanted = IntraOpThreads(); wanted != threads) {
    omp_set_num_threads(wanted);  // this thread's OpenMP teams
    threads = wanted;
  }
  return stream;
}

// oneDNN's logical order is always (N, C, H, W) / (O, I, H, W); the tags give the layout.
memory::desc Data(int64_t n, int64_t h, int64_t w, int64_t c) {
  return memory::desc({n, c, h, w}, memory::data_type::f32, Tag::nhwc);
}

struct ConvDescs {
  memory::desc src, weights, bias, dst;
  memory::dims strides, dilates, pad_l, pad_r;
};

// The weights as Keras lays them out.
memory::desc UserWeights(const Window2D& w) {
  return memory::desc({w.out_c, w.in_c, w.kernel_h, w.kernel_w}, memory::data_type::f32, Tag::hwio);
}

// oneDNN picks the weights' layout its fastest kernel wants; they are small, so reorders
// from and to Keras' layout cost little beside the convolution.
ConvDescs Descs(const Window2D& w, int64_t batch) {
  return ConvDescs{.src = Data(batch, w.in_h, w.in_w, w.in_c),
                   .weights = memory::desc({w.out_c, w.in_c, w.kernel_h, w.kernel_w},
                                           memory::data_type::f32, Tag::any),
                   .bias = memory::desc({w.out_c}, memory::data_type::f32, Tag::a),
                   .dst = Data(batch, w.out_h, w.out_w, w.out_c),
                   .strides = {w.stride_h, w.stride_w},
                   .dilates = {w.dilation_h - 1, w.dilation_w - 1},  // oneDNN counts the gaps
                   .pad_l = {w.pad_top, w.pad_left},
                   .pad_r = {w.pad_bottom, w.pad_right}};
}

memory Wrap(const memory::desc& desc, const float* data) {
  return memory(desc, Engine(), const_cast<float*>(data));
}

// `user` in the layout `wanted`: itself when they agree, else a reordered copy.
memory Reordered(const memory& user, const memory::desc& wanted) {
  if (user.get_desc() == wanted) return user;
  memory copy(wanted, Engine());
  dnnl::reorder(user, copy).execute(Stream(), const_cast<memory&>(user), copy);
  return copy;
}

// The three primitives of one convolution shape, made once per thread and reused: a
// primitive descriptor costs far more than a small convolution's run, and the backward
// ones need the forward one as their hint. (The backward-data pass does not depend on the
// bias; it comes from the entry of the shape's forward pass.)
struct ConvPrimitives {
  ConvDescs descs;
  memory::desc user_weights;
  dnnl::convolution_forward::primitive_desc forward_pd;
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data::primitive_desc backward_data_pd;
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights::primitive_desc backward_weights_pd;
  dnnl::convolution_backward_weights backward_weights;
};

ConvPrimitives MakePrimitives(const Window2D& w, int64_t batch, bool with_bias) {
  ConvPrimitives p;
  const ConvDescs& d = p.descs = Descs(w, batch);
  p.user_weights = UserWeights(w);
  const auto forward_training = dnnl::prop_kind::forward_training;
  const auto direct = dnnl::algorithm::convolution_direct;
  p.forward_pd = dnnl::convolution_forward::primitive_desc(
      with_bias
          ? dnnl::convolution_forward::desc(forward_training, direct, d.src, d.weights, d.bias,
                                            d.dst, d.strides, d.dilates, d.pad_l, d.pad_r)
          : dnnl::convolution_forward::desc(forward_training, direct, d.src, d.weights, d.dst,
                                            d.strides, d.dilates, d.pad_l, d.pad_r),
      Engine());
  p.forward = dnnl::convolution_forward(p.forward_pd);
  p.backward_data_pd = dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(direct, d.src, d.weights, d.dst, d.strides, d.dilates,
                                            d.pad_l, d.pad_r),
      Engine(), p.forward_pd);
  p.backward_data = dnnl::convolution_backward_data(p.backward_data_pd);
  p.backward_weights_pd = dnnl::convolution_backward_weights::primitive_desc(
      with_bias ? dnnl::convolution_backward_weights::desc(direct, d.src, d.weights, d.bias, d.dst,
                                                           d.strides, d.dilates, d.pad_l, d.pad_r)
                : dnnl::convolution_backward_weights::desc(direct, d.src, d.weights, d.dst,
                                                           d.strides, d.dilates, d.pad_l, d.pad_r),
      Engine(), p.forward_pd);
  p.backward_weights = dnnl::convolution_backward_weights(p.backward_weights_pd);
  return p;
}

// This thread's primitives for the shape (a model has a few shapes: its layers, and the
// last partial batch) and thread count. A primitive keeps the threads it was made for (its
// work split), so they are set first: made before, the first primitives ran with an OpenMP
// team of every core, whose other threads spun beside the replica's own.
const ConvPrimitives& Primitives(const Window2D& w, int64_t batch, bool with_bias) {
  Stream();  // sets this thread's OpenMP threads
  using Key = std::array<int64_t, 20>;
  thread_local std::map<Key, ConvPrimitives> cache;
  const Key key = {w.in_h,       w.in_w,       w.in_c,     w.out_h,          w.out_w,
                   w.out_c,      w.kernel_h,   w.kernel_w, w.stride_h,       w.stride_w,
                   w.dilation_h, w.dilation_w, w.pad_top,  w.pad_left,       w.pad_bottom,
                   w.pad_right,  batch,        with_bias,  IntraOpThreads(), 0};
  auto found = cache.find(key);
  if (found == cache.end()) found = cache.emplace(key, MakePrimitives(w, batch, with_bias)).first;
  return found->second;
}

// The primitives of one pooling shape and kind, made once per thread and reused. Max
// pooling's backward pass reads the forward pass's workspace (where each window's maximum
// was), which it makes again from x: the Device interface hands it x, not a workspace.
struct PoolPrimitives {
  memory::desc src, dst, workspace;
  dnnl::pooling_forward inference;
  dnnl::pooling_forward training;  // max only: writes the workspace
  dnnl::pooling_backward backward;
};

PoolPrimitives MakePoolPrimitives(const Window2D& w, int64_t batch, bool max) {
  PoolPrimitives p;
  p.src = Data(batch, w.in_h, w.in_w, w.in_c);
  p.dst = Data(batch, w.out_h, w.out_w, w.out_c);
  // TF's average counts the positions inside the image only; padding never wins a maximum.
  const auto algorithm =
      max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
  const memory::dims strides = {w.stride_h, w.stride_w}, kernel = {w.kernel_h, w.kernel_w},
                     pad_l = {w.pad_top, w.pad_left}, pad_r = {w.pad_bottom, w.pad_right};
  auto forward = [&](dnnl::prop_kind kind) {
    return dnnl::pooling_forward::primitive_desc(
        dnnl::pooling_forward::desc(kind, algorithm, p.src, p.dst, strides, kernel, pad_l, pad_r),
        Engine());
  };
  p.inference = dnnl::pooling_forward(forward(dnnl::prop_kind::forward_inference));
  const dnnl::pooling_forward::primitive_desc training_pd =
      forward(dnnl::prop_kind::forward_training);
  if (max) {
    p.training = dnnl::pooling_forward(training_pd);
    p.workspace = training_pd.workspace_desc();
  }
  p.backward = dnnl::pooling_backward(dnnl::pooling_backward::primitive_desc(
      dnnl::pooling_backward::desc(algorithm, p.src, p.dst, strides, kernel, pad_l, pad_r),
      Engine(), training_pd));
  return p;
}

const PoolPrimitives& PoolPrimitivesOf(const Window2D& w, int64_t batch, bool max) {
  Stream();  // sets this thread's OpenMP threads, as for the convolutions
  using Key = std::array<int64_t, 16>;
  thread_local std::map<Key, PoolPrimitives> cache;
  const Key key = {w.in_h,      w.in_w,     w.in_c,     w.out_h,         w.out_w,    w.kernel_h,
                   w.kernel_w,  w.stride_h, w.stride_w, w.pad_top,       w.pad_left, w.pad_bottom,
                   w.pad_right, batch,      max,        IntraOpThreads()};
  auto found = cache.find(key);
  if (found == cache.end()) found = cache.emplace(key, MakePoolPrimitives(w, batch, max)).first;
  return found->second;
}

}  // namespace

void Pool2DForward(const Window2D& w, int64_t batch, bool max, const float* x, float* out) {
  const PoolPrimitives& p = PoolPrimitivesOf(w, batch, max);
  p.inference.execute(Stream(), {{DNNL_ARG_SRC, Wrap(p.src, x)}, {DNNL_ARG_DST, Wrap(p.dst, out)}});
  Stream().wait();
}

void Pool2DBackward(const Window2D& w, int64_t batch, bool max, const float* x,
                    const float* grad_out, float* grad_x) {
  const PoolPrimitives& p = PoolPrimitivesOf(w, batch, max);
  std::unordered_map<int, memory> args = {{DNNL_ARG_DIFF_DST, Wrap(p.dst, grad_out)},
                                          {DNNL_ARG_DIFF_SRC, Wrap(p.src, grad_x)}};
  if (max) {
    thread_local std::vector<char> workspace, values;
    workspace.resize(p.workspace.get_size());
    values.resize(p.dst.get_size());
    const memory where(p.workspace, Engine(), workspace.data());
    p.training.execute(Stream(), {{DNNL_ARG_SRC, Wrap(p.src, x)},
                                  {DNNL_ARG_DST, memory(p.dst, Engine(), values.data())},
                                  {DNNL_ARG_WORKSPACE, where}});
    args.emplace(DNNL_ARG_WORKSPACE, where);
  }
  p.backward.execute(Stream(), args);
  Stream().wait();
}

void Conv2DForward(const Window2D& w, int64_t batch, const float* x, const float* kernel,
                   const float* bias, float* out) {
  const ConvPrimitives& p = Primitives(w, batch, bias != nullptr);
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, Wrap(p.descs.src, x)},
      {DNNL_ARG_WEIGHTS, Reordered(Wrap(p.user_weights, kernel), p.forward_pd.weights_desc())},
      {DNNL_ARG_DST, Wrap(p.descs.dst, out)}};
  if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, Wrap(p.descs.bias, bias));
  p.forward.execute(Stream(), args);
  Stream().wait();
}

void Conv2DBackwardData(const Window2D& w, int64_t batch, const float* grad_out,
                        const float* kernel, float* grad_x) {
  const ConvPrimitives& p = Primitives(w, batch, /*with_bias=*/false);
  p.backward_data.execute(
      Stream(), {{DNNL_ARG_DIFF_DST, Wrap(p.descs.dst, grad_out)},
                 {DNNL_ARG_WEIGHTS,
                  Reordered(Wrap(p.user_weights, kernel), p.backward_data_pd.weights_desc())},
                 {DNNL_ARG_DIFF_SRC, Wrap(p.descs.src, grad_x)}});
  Stream().wait();
}

void Conv2DBackwardWeights(const Window2D& w, int64_t batch, const float* x, const float* grad_out,
                           float* grad_kernel, float* grad_bias) {
  const bool with_bias = grad_bias != nullptr;
  const ConvPrimitives& p = Primitives(w, batch, with_bias);
  const memory user = Wrap(p.user_weights, grad_kernel);
  const bool same = p.backward_weights_pd.diff_weights_desc() == user.get_desc();
  memory diff_weights = same ? user : memory(p.backward_weights_pd.diff_weights_desc(), Engine());
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, Wrap(p.descs.src, x)},
                                          {DNNL_ARG_DIFF_DST, Wrap(p.descs.dst, grad_out)},
                                          {DNNL_ARG_DIFF_WEIGHTS, diff_weights}};
  if (with_bias) args.emplace(DNNL_ARG_DIFF_BIAS, Wrap(p.descs.bias, grad_bias));
  p.backward_weights.execute(Stream(), args);
  if (!same) {
    dnnl::reorder(diff_weights, user).execute(Stream(), diff_weights, const_cast<memory&>(user));
  }
  Stream().wait();
}

}  // namespace stratum::onednn
