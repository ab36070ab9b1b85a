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
import struct

FEATURE_VOCAB = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"]


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked_crc(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number, payload):
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def example(features):
    """tf.train.Example{features: Features{feature: {name: Feature{bytes_list}}}}."""
    entries = b""
    for name, values in sorted(features.items()):
        bytes_list = b"".join(field(1, v.encode()) for v in values)
        feature = field(1, bytes_list)  # Feature.bytes_list
        entries += field(1, field(1, name.encode()) + field(2, feature))  # map entry
    return field(1, entries)  # Example.features


def write(path, records):
    with open(path + ".tmp", "wb") as out:
        for record in records:
            length = struct.pack("<Q", len(record))
            out.write(length + struct.pack("<I", masked_crc(length)))
            out.write(record + struct.pack("<I", masked_crc(record)))
    os.replace(path + ".tmp", path)


def feature_and_label_gen(rng, num_examples):
    for _ in range(num_examples):
        features = rng.sample(FEATURE_VOCAB, 3)
        label = ["yes"] if "avenger" in features else ["no"]
        yield example({"features": features, "label": label})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the folder to write into")
    parser.add_argument("--train", type=int, default=200, help="training examples (the tutorial's 200)")
    parser.add_argument("--test", type=int, default=64, help="test examples")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    write(os.path.join(args.out, "train.tfrecord"), feature_and_label_gen(rng, args.train))
    write(os.path.join(args.out, "test.tfrecord"), feature_and_label_gen(rng, args.test))


if __name__ == "__main__":
    main()
