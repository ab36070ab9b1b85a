"""Writing tf.train.Example records into a TFRecord file with Python alone (no TensorFlow,
no protobuf package), for the example data scripts (ps_tutorial_data.py, spam_data.py).

A record is its little-endian uint64 length, the masked CRC-32C of those 8 bytes, the
record, and the masked CRC-32C of the record; an Example is built from its protobuf wire
format: Example.features (1) -> Features.feature (1, map entries of key 1 and value 2) ->
Feature.bytes_list (1) or int64_list (3) -> value (1)."""
import os
import struct


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


def example(strings=None, int64s=None):
    """A tf.train.Example: {name: [str, ...]} as bytes_list features, {name: [int, ...]} as
    int64_list features (non-negative values, packed)."""
    features = [(name, field(1, b"".join(field(1, v.encode()) for v in values)))
                for name, values in (strings or {}).items()]
    features += [(name, field(3, field(1, b"".join(varint(v) for v in values))))
                 for name, values in (int64s or {}).items()]
    entries = b"".join(field(1, field(1, name.encode()) + field(2, feature))
                       for name, feature in sorted(features))
    return field(1, entries)


def write(path, records):
    """Writes the records into `path`, whole or not at all (written aside, then renamed)."""
    with open(path + ".tmp", "wb") as out:
        for record in records:
            length = struct.pack("<Q", len(record))
            out.write(length + struct.pack("<I", masked_crc(length)))
            out.write(record + struct.pack("<I", masked_crc(record)))
    os.replace(path + ".tmp", path)
