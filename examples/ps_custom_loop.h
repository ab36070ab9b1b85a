// The job both programs of the parameter-server custom loop share (ps_custom_loop_worker.cc
// and ps_custom_loop_coordinator.cc): a model, its optimizer and loss, and how its
// variables split over the parameter servers. It has no "data": the workers build their
// datasets with the function they register.
#pragma once

namespace ps_custom_loop {

inline constexpr char kJob[] = R"({
  "strategy": {"type": "parameter_server",
               "variable_partitioner": {"type": "fixed_shards", "num_shards": 2}},
  "model": {"class_name": "Sequential", "config": {"layers": [
    {"class_name": "Flatten", "config": {"batch_input_shape": [null, 28, 28]}},
    {"class_name": "Dense", "config": {"name": "hidden", "units": 128, "activation": "relu"}},
    {"class_name": "Dense", "config": {"name": "logits", "units": 10}}]}},
  "compile": {"optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.001}},
              "loss": {"class_name": "SparseCategoricalCrossentropy",
                       "config": {"from_logits": true}}}
})";

inline constexpr int kBatchPerReplica = 64;

}  // namespace ps_custom_loop
