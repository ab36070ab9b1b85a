#!/usr/bin/python3
"""Reads TensorBoard event files through a path independent of Stratum's writer: the
TFRecord framing and CRC-32C (Castagnoli, masked) and the protobuf wire format, decoded here
from their descriptions, with TensorFlow's field numbers (Event, Summary.Value,
SummaryMetadata, TensorProto). Prints one JSON object per scalar:
{"run": "train", "file": ..., "step": 3, "tag": "epoch_loss", "value": 0.41, "wall_time": ...,
 "plugin": "scalars"}, after checking every CRC and that each file starts with
file_version "brain.Event:2". Exits 1 naming the file and offset of any damage.

Usage: read_tfevents.py LOG_DIR
"""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
from tfrecord_framing import unframe  # noqa: E402


def records(path):
    with open(path, "rb") as f:
        return unframe(f.read(), path)


def varint(buf, at):
    shift = value = 0
    while True:
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def fields(buf):
    """(field number, wire type, value) of a message; value: int, bytes, or raw fixed bytes."""
    at = 0
    while at < len(buf):
        key, at = varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(buf, at)
        elif wire == 1:
            value, at = buf[at:at + 8], at + 8
        elif wire == 2:
            length, at = varint(buf, at)
            value, at = buf[at:at + length], at + length
        elif wire == 5:
            value, at = buf[at:at + 4], at + 4
        else:
            raise ValueError("wire type %d" % wire)
        yield number, wire, value


def scalar_of(tensor):
    dtype, values = None, []
    for number, wire, value in fields(tensor):
        if number == 1:
            dtype = value
        elif number == 5:  # float_val, packed or not
            raw = value if wire == 2 else value
            values += [struct.unpack("<f", raw[i:i + 4])[0] for i in range(0, len(raw), 4)]
        elif number == 6:
            raw = value
            values += [struct.unpack("<d", raw[i:i + 8])[0] for i in range(0, len(raw), 8)]
    if dtype not in (1, 2) or len(values) != 1:
        raise ValueError("tensor of dtype %s with %d values is no scalar" % (dtype, len(values)))
    return values[0]


def read_run(run, path, out):
    first = True
    for record in records(path):
        event = {"run": run, "file": os.path.basename(path), "step": 0}
        for number, wire, value in fields(record):
            if number == 1:
                event["wall_time"] = struct.unpack("<d", value)[0]
            elif number == 2:
                event["step"] = value
            elif number == 3:
                event["file_version"] = value.decode()
            elif number == 5:
                event["summary"] = value
        if first:
            if event.get("file_version") != "brain.Event:2":
                raise ValueError("%s: the first event is not file_version brain.Event:2" % path)
            first = False
            continue
        for number, wire, value in fields(event.get("summary", b"")):
            if number != 1:
                continue
            scalar = {"run": run, "file": event["file"], "step": event["step"],
                      "wall_time": event["wall_time"]}
            for n, w, v in fields(value):
                if n == 1:
                    scalar["tag"] = v.decode()
                elif n == 2:
                    scalar["value"] = struct.unpack("<f", v)[0]
                elif n == 8:
                    scalar["value"] = scalar_of(v)
                elif n == 9:
                    for mn, mw, mv in fields(v):
                        if mn == 1:
                            for pn, pw, pv in fields(mv):
                                if pn == 1:
                                    scalar["plugin"] = pv.decode()
            out.append(scalar)


def main():
    log_dir = sys.argv[1]
    out = []
    try:
        for run in sorted(os.listdir(log_dir)):
            folder = os.path.join(log_dir, run)
            if not os.path.isdir(folder):
                continue
            for name in sorted(os.listdir(folder)):
                if name.startswith("events.out.tfevents."):
                    read_run(run, os.path.join(folder, name), out)
    except (ValueError, IndexError, struct.error) as error:
        print("damaged event file: %s" % error, file=sys.stderr)
        return 1
    for scalar in out:
        print(json.dumps(scalar))
    return 0


if __name__ == "__main__":
    sys.exit(main())
