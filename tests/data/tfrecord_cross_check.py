#!/usr/bin/python3
"""TFRecord files of tf.train.Example across an independent path: Python's protobuf (the
library TensorFlow's own Python parses Examples with) and a TFRecord framing written here
from the format's description, against stratum-data.

  Python writes -> stratum-data head/count read (plain, GZIP, ZLIB; packed and unpacked
                   lists, negative int64s, bytes, a key given twice);
  stratum-data convert writes -> Python reads (CRCs checked, Examples parsed).

Usage: tfrecord_cross_check.py --bin BUILD/bin --proto_dir proto
"""
import argparse
import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
from tfrecord_framing import frame, unframe  # noqa: E402


def run(args):
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("FAILED: %s\n%s%s" % (" ".join(args), result.stdout, result.stderr))
    return result.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--proto_dir", required=True)
    options = parser.parse_args()
    data = os.path.join(options.bin, "stratum-data")
    with tempfile.TemporaryDirectory() as tmp:
        run(["protoc", "-I", options.proto_dir, "--python_out", tmp,
             os.path.join(options.proto_dir, "example.proto")])
        sys.path.insert(0, tmp)
        import example_pb2  # pylint: disable=import-outside-toplevel

        # Python -> Stratum.
        expected = []
        records = []
        for i in range(7):
            example = example_pb2.Example()
            feature = example.features.feature
            values = [i * 0.5, -i * 1.25, 3.0]
            feature["x"].float_list.value.extend(values)
            feature["id"].int64_list.value.extend([-(2 ** 40) - i, i])
            feature["raw"].bytes_list.value.append(bytes([i, 255 - i, 7]))
            record = example.SerializeToString()
            if i == 3:
                # "x" again, last wins (protobuf's map semantics), written unpacked by hand:
                # field 1 (features) > entry > key "x", value Feature{float_list{1.5, 2.5, 4}}.
                floats = b"".join(b"\x0d" + struct.pack("<f", v) for v in (1.5, 2.5, 4.0))
                float_list = b"\x12" + bytes([len(floats)]) + floats
                entry = b"\x0a\x01x\x12" + bytes([len(float_list)]) + float_list
                record += b"\x0a" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry
                values = [1.5, 2.5, 4.0]
            records.append(record)
            expected.append({"x": values, "id": [-(2 ** 40) - i, i], "raw": [i, 255 - i, 7]})
        stream = b"".join(frame(r) for r in records)
        spec = json.dumps({
            "x": {"dtype": "float32", "shape": [3]},
            "id": {"dtype": "int64", "shape": [2]},
            "raw": {"dtype": "string", "decode_raw": "uint8", "shape": [3]},
        })
        for name, compression, payload in (
                ("plain.tfrecord", "", stream),
                ("g.tfrecord.gz", "GZIP", gzip.compress(stream)),
                ("z.tfrecord.zlib", "ZLIB", zlib.compress(stream))):
            path = os.path.join(tmp, name)
            with open(path, "wb") as f:
                f.write(payload)
            out = run([data, "head", "--files=" + path, "--compression_type=" + compression,
                       "--features=" + spec, "--n=100"])
            got = [json.loads(line) for line in out.splitlines()]
            assert got == expected, "%s: %s != %s" % (name, got, expected)
            count = run([data, "count", "--files=" + path, "--compression_type=" + compression])
            assert count.splitlines()[-1] == "7\ttotal", count
        print("python-written TFRecord files read by stratum-data: ok (plain, GZIP, ZLIB)")

        # Stratum -> Python.
        csv = os.path.join(tmp, "rows.csv")
        rows = [(i * 0.25, -i, i % 3) for i in range(10)]
        with open(csv, "w") as f:
            f.write("a,b,label\n")
            for a, b, label in rows:
                f.write("%s,%s,%s\n" % (a, b, label))
        prefix = os.path.join(tmp, "converted")
        run([data, "convert", "--from=csv", "--files=" + csv, "--label_name=label",
             "--out=" + prefix, "--shards=2", "--compression_type=GZIP"])
        parsed = []
        for shard in range(2):
            with open("%s-%05d-of-00002.tfrecord.gz" % (prefix, shard), "rb") as f:
                for record in unframe(gzip.decompress(f.read())):
                    example = example_pb2.Example()
                    example.ParseFromString(record)
                    feature = example.features.feature
                    parsed.append((list(feature["features"].float_list.value),
                                   list(feature["label"].int64_list.value)))
        want = [([a, float(b)], [label]) for a, b, label in rows]
        assert parsed == want, "%s != %s" % (parsed, want)
        print("stratum-data convert's shards read by Python's protobuf: ok")


if __name__ == "__main__":
    main()
