#!/usr/bin/env python3
"""The synthetic data of TensorFlow's "Parameter server training with
ParameterServerStrategy" tutorial, as TFRecord files of tf.train.Example that
examples/ps_tutorial.json trains on.

As the tutorial's feature_and_label_gen: each example is 3 distinct tokens drawn from
feature_vocab, and its label is "yes" when "avenger" is among them, else "no". Both are
kept as strings (bytes_list), as the tutorial's dataset holds them; the job's StringLookup
layers make them ids while the data is read.

    examples/ps_tutorial_data.py --out examples/data/ps-tutorial [--train 200 --test 64 --seed 1]

Writes train.tfrecord and test.tfrecord there. Needs only Python 3."""
import argparse
import os
import random

import tfrecord_writer

FEATURE_VOCAB = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"]


def feature_and_label_gen(rng, num_examples):
    for _ in range(num_examples):
        features = rng.sample(FEATURE_VOCAB, 3)
        label = ["yes"] if "avenger" in features else ["no"]
        yield tfrecord_writer.example(strings={"features": features, "label": label})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the folder to write into")
    parser.add_argument("--train", type=int, default=200,
                        help="training examples (the tutorial's 200)")
    parser.add_argument("--test", type=int, default=64, help="test examples")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    for name, count in (("train", args.train), ("test", args.test)):
        tfrecord_writer.write(os.path.join(args.out, name + ".tfrecord"),
                              feature_and_label_gen(rng, count))


if __name__ == "__main__":
    main()
