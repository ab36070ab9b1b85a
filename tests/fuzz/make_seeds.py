#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (corpus/<target>/seed-*): small valid inputs of
each kind, built here from the formats' specifications, independently of Stratum's own
encoders, so that the fuzzers start deep inside each parser. Inputs that the fuzzers
found and that are worth keeping (crash reproducers, new coverage) live beside them under
other names; this script only rewrites the seed-* files.

  tests/fuzz/make_seeds.py [--examples DIR]   (DIR: the repo's examples/, for job files)
"""
import argparse
import gzip
import json
import os
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testing"))
from tfrecord_framing import frame as record  # noqa: E402  (TFRecord framing, CRC-32C)


def write(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, "seed-" + name), "wb") as f:
        f.write(data)


# --- the data path (ps/data_wire.h): little-endian frames -------------------------------
FLOAT32, INT32, INT64, UINT8 = 1, 2, 3, 4
REQUEST, PUSH, PULL = 0x51525053, 1, 2
PULL_AFTER = 1


def header(op, meta, inline, flags=0, timeout_ms=5000, request_id=1):
    # magic, op, id, flags, timeout_ms, meta_bytes, error_kind, inline_bytes
    return struct.pack("<IIQIIIIQ", REQUEST, op, request_id, flags, timeout_ms, len(meta), 0,
                       len(inline))


def entry(name, dims, read=False, rows=None, dtype=FLOAT32, location=0, offset=0):
    out = struct.pack("<I", len(name)) + name.encode()
    out += struct.pack("<II", dtype, len(dims)) + b"".join(struct.pack("<q", d) for d in dims)
    out += struct.pack("<IQ", location, offset)
    out += struct.pack("<I", (1 if read else 0) | (2 if rows is not None else 0))
    if rows is not None:
        out += struct.pack("<Q", len(rows)) + b"".join(struct.pack("<q", r) for r in rows)
    return out


def frame(op, entries, inline=b"", flags=0, request_id=1):
    meta = struct.pack("<I", len(entries)) + b"".join(entries)
    return header(op, meta, inline, flags, request_id=request_id) + meta + inline


def floats(n, value=0.25):
    return struct.pack("<%df" % n, *([value] * n))


def data_path_seeds():
    pull = frame(PULL, [entry("dense/kernel", [8, 4], read=True), entry("dense/bias", [4], read=True)])
    push = frame(PUSH, [entry("dense/kernel", [8, 4]), entry("dense/bias", [4])],
                 floats(32) + floats(4), request_id=2)
    push_pull = frame(PUSH, [entry("rms", [16]), entry("rms", [16], read=True)], floats(16),
                      flags=PULL_AFTER, request_id=3)
    rows_push = frame(PUSH, [entry("embedding", [3, 4], rows=[0, 5, 63])], floats(12), request_id=4)
    rows_pull = frame(PULL, [entry("embedding", [2, 4], read=True, rows=[1, 2])], request_id=5)
    for target, prefix in (("data_path", b"\x00"), ("data_path", b"\x01")):
        transport = "tcp" if prefix == b"\x00" else "unix"
        write(target, transport + "-pull", prefix + pull)
        write(target, transport + "-push", prefix + push)
        write(target, transport + "-push-pull", prefix + push_pull)
        write(target, transport + "-rows", prefix + rows_push + rows_pull)
        write(target, transport + "-session", prefix + pull + push + push_pull + rows_push)
    # data_wire: one frame each (header and meta; inline bytes are not its concern).
    for name, data in (("pull", pull), ("push", push), ("push-pull", push_pull),
                       ("rows-push", rows_push), ("rows-pull", rows_pull)):
        meta_bytes = struct.unpack_from("<I", data, 24)[0]
        write("data_wire", name, data[:40 + meta_bytes])
    # A response: message, update counts, values, shared size wanted.
    response_meta = (struct.pack("<I", 0) + struct.pack("<Iq", 1, 7) + struct.pack("<I", 1) +
                     struct.pack("<II", FLOAT32, 1) + struct.pack("<q", 4) +
                     struct.pack("<IQ", 0, 0) + struct.pack("<Q", 0))
    write("data_wire", "response",
          struct.pack("<IIQIIIIQ", 0x53525053, 0, 1, 0, 0, len(response_meta), 0, 16) +
          response_meta)


# --- tensors (proto/tensor.proto) --------------------------------------------------------
def varint(value):
    out = b""
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def tensor_proto(dtype, dims, content):
    out = b"\x08" + varint(dtype)
    packed = b"".join(varint(d) for d in dims)
    out += b"\x12" + varint(len(packed)) + packed
    return out + b"\x1a" + varint(len(content)) + content


def tensor_seeds():
    write("tensor_proto", "matrix", tensor_proto(FLOAT32, [2, 3], floats(6)))
    write("tensor_proto", "ids", tensor_proto(INT64, [3], struct.pack("<3q", 1, 2, 3)))
    write("tensor_proto", "bytes", tensor_proto(UINT8, [4], b"\x00\x01\x02\x03"))
    write("tensor_proto", "scalar", tensor_proto(INT32, [], struct.pack("<i", 7)))


# --- IDX, safetensors, checkpoint manifests ----------------------------------------------
def idx_seeds():
    images = struct.pack(">HBB", 0, 0x08, 3) + struct.pack(">3I", 2, 3, 3) + bytes(range(18))
    labels = struct.pack(">HBB", 0, 0x08, 1) + struct.pack(">I", 4) + bytes([1, 2, 3, 9])
    floats_idx = struct.pack(">HBB", 0, 0x0D, 2) + struct.pack(">2I", 2, 2) + struct.pack(">4f", 1, 2, 3, 4)
    ints = struct.pack(">HBB", 0, 0x0C, 1) + struct.pack(">I", 2) + struct.pack(">2i", -1, 5)
    write("idx", "images", images)
    write("idx", "labels", labels)
    write("idx", "float", floats_idx)
    write("idx", "int32", ints)
    write("idx", "images-gz", gzip.compress(images, mtime=0))


def safetensors(tensors, metadata=None):
    header, offset, body = {}, 0, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        body += data
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def checkpoint_seeds():
    write("safetensors", "shard", safetensors(
        {"dense/kernel": ("F32", [2, 2], floats(4)), "dense/bias": ("F32", [2], floats(2)),
         "step": ("I64", [], struct.pack("<q", 7))}, {"format": "pt"}))
    write("safetensors", "empty", safetensors({}))
    write("safetensors", "bytes", safetensors({"image": ("U8", [3], b"\x01\x02\x03")}))
    # Manifests, each followed by a NUL and the shard file it names.
    fit_state = safetensors({"dense/kernel": ("F32", [2, 2], floats(4)),
                             "dense/kernel/slot_m": ("F32", [2, 2], floats(4))})
    fit = {"step": 7, "format": "stratum-fit-checkpoint-1",
           "files": [{"file": "state.safetensors", "crc32": zlib.crc32(fit_state)}]}
    write("checkpoint_manifest", "fit", json.dumps(fit).encode() + b"\0" + fit_state)
    ps_file = safetensors({"w/part_0": ("F32", [2, 3], floats(6)), "w/part_1": ("F32", [1, 3], floats(3)),
                           "b": ("F32", [], floats(1)), "w/part_0/slot_v": ("F32", [2, 3], floats(6))})
    ps = {"step": 7, "format": "stratum-checkpoint-1",
          "files": [{"file": "ps-0.safetensors", "crc32": zlib.crc32(ps_file)}],
          "shards": [{"variable": "w", "shard": "w/part_0", "first_row": 0},
                     {"variable": "w", "shard": "w/part_1", "first_row": 2},
                     {"variable": "b", "shard": "b", "first_row": 0}]}
    write("checkpoint_manifest", "ps", json.dumps(ps).encode() + b"\0" + ps_file)
    write("checkpoint_manifest", "pointer", json.dumps({"latest": "ckpt-000000000007", "step": 7}))


# --- TFRecord of tf.Example, CSV ----------------------------------------------------------
def field(number, wire_type, payload):
    key = varint(number << 3 | wire_type)
    return key + (varint(len(payload)) + payload if wire_type == 2 else payload)


def example(features):
    # Example{features: Features{feature: map<string, Feature>}}; Feature's oneof:
    # bytes_list = 1, float_list = 2, int64_list = 3, each with repeated field 1.
    entries = b""
    for key, (kind, values) in features.items():
        if kind == "bytes":
            inner = b"".join(field(1, 2, v) for v in values)
            feature = field(1, 2, inner)
        elif kind == "float":
            feature = field(2, 2, field(1, 2, struct.pack("<%df" % len(values), *values)))
        else:
            feature = field(3, 2, field(1, 2, b"".join(varint(v & (2**64 - 1)) for v in values)))
        entries += field(1, 2, field(1, 2, key.encode()) + field(2, 2, feature))
    return field(1, 2, entries)


def tfrecord_seeds():
    records = record(example({"image": ("bytes", [bytes(range(256)) * 3 + bytes(16)]),
                              "label": ("int64", [3]), "ids": ("int64", [1, 2, 40]),
                              "score": ("float", [0.5, 2.0])}))
    records += record(example({"image": ("bytes", [bytes(784)])}))
    write("tfrecord", "plain", b"\x00" + records)
    write("tfrecord", "gzip", b"\x01" + gzip.compress(records, mtime=0))
    write("tfrecord", "zlib", b"\x02" + zlib.compress(records))


def csv_seeds():
    write("csv", "numbers", "a,b,label\n1,2.5,0\n3,4,1\n")
    write("csv", "quoted", 'x,"y, quoted",label\n"1","2",1\n,"3",0\n')
    write("csv", "strings", "name,value,label\nfoo,1,yes\nbar,2,no\n")


# --- job files, models, TF_CONFIG ---------------------------------------------------------
def job_seeds(examples):
    for name in sorted(os.listdir(examples)):
        if name.endswith(".json"):
            with open(os.path.join(examples, name), "rb") as f:
                write("job_spec", name[:-len(".json")], f.read())
    model = {"class_name": "Functional", "config": {"name": "m", "layers": [
        {"class_name": "InputLayer", "name": "ids", "inbound_nodes": [],
         "config": {"batch_input_shape": [None, 8], "dtype": "int64", "name": "ids"}},
        {"class_name": "Embedding", "name": "emb", "inbound_nodes": [[["ids", 0, 0, {}]]],
         "config": {"name": "emb", "input_dim": 100, "output_dim": 4}},
        {"class_name": "GlobalAveragePooling1D", "name": "avg", "inbound_nodes": [[["emb", 0, 0, {}]]],
         "config": {"name": "avg"}},
        {"class_name": "Dense", "name": "out", "inbound_nodes": [[["avg", 0, 0, {}]]],
         "config": {"name": "out", "units": 1, "activation": "sigmoid"}}],
        "input_layers": [["ids", 0, 0]], "output_layers": [["out", 0, 0]]}}
    write("job_spec", "functional-model", json.dumps(model))


def tf_config_seeds():
    write("tf_config", "ps", json.dumps({
        "cluster": {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"],
                    "ps": ["127.0.0.1:2225"]},
        "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"}))
    write("tf_config", "mwms", json.dumps({
        "cluster": {"worker": ["host-a:12345", "[::1]:12346"]},
        "task": {"type": "worker", "index": 0}, "environment": "cloud"}))
    write("tf_config", "evaluator", json.dumps({
        "cluster": {"chief": ["c:1"], "worker": ["w:2"], "ps": ["p:3"]},
        "task": {"type": "evaluator", "index": 0}}))
    write("tf_config", "empty", "")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", default=os.path.join(HERE, "..", "..", "examples"))
    args = parser.parse_args()
    data_path_seeds()
    tensor_seeds()
    idx_seeds()
    checkpoint_seeds()
    tfrecord_seeds()
    csv_seeds()
    job_seeds(args.examples)
    tf_config_seeds()


if __name__ == "__main__":
    main()
