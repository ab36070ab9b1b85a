// What compute devices this process can see, and how its GPUs are split into logical
// devices.
//
// Like tf.config.set_logical_device_configuration, SetLogicalGpusPerGpu splits every
// physical GPU into N logical GPUs ("GPU:0" .. "GPU:N-1" on the first one), so that a
// MirroredStrategy runs several replicas on one GPU. It is a process-wide setting, as in
// TensorFlow, made before any strategy is (the training binaries make it from the job's
// strategy.logical_gpus_per_gpu, through ConfigureLocalDevices). Thread-safe.
#pragma once

namespace stratum {

// Number of (logical) CUDA GPUs visible to this process: 0 in a build without CUDA, and 0
// when the driver or the devices are missing (never an error: a worker then runs on CPU).
int VisibleGpuCount();

// Splits each physical GPU into `per_gpu` (>= 1) logical GPUs. Returns false (and changes
// nothing) when per_gpu < 1.
bool SetLogicalGpusPerGpu(int per_gpu);
int LogicalGpusPerGpu();

// The physical device of logical GPU `logical` (its CUDA ordinal).
int PhysicalGpuOf(int logical);

// Threads that one replica's CPU kernels (oneDNN's convolutions) may use, as
// tf.config.threading.set_intra_op_parallelism_threads: 1 by default, since replicas run on
// threads of their own; more suits one replica on a machine with idle cores. Returns false
// (and changes nothing) when threads < 1.
bool SetIntraOpThreads(int threads);
int IntraOpThreads();

}  // namespace stratum
