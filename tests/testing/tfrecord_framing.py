"""TFRecord framing written from the format's description, for the tests' independent
readers (tests/data/tfrecord_cross_check.py, tests/training/read_tfevents.py): each record
is a little-endian uint64 length, the masked CRC-32C (Castagnoli) of those 8 bytes, the
record, and the masked CRC-32C of the record."""
import struct


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record):
    length = struct.pack("<Q", len(record))
    return (length + struct.pack("<I", masked(length)) + record +
            struct.pack("<I", masked(record)))


def unframe(stream, name="the stream"):
    """The records of `stream`; ValueError naming `name` and the offset of any damage."""
    records, at = [], 0
    while at < len(stream):
        if len(stream) - at < 12:
            raise ValueError("%s: truncated length at offset %d" % (name, at))
        length_bytes = stream[at:at + 8]
        (length,) = struct.unpack("<Q", length_bytes)
        (length_crc,) = struct.unpack("<I", stream[at + 8:at + 12])
        if length_crc != masked(length_bytes):
            raise ValueError("%s: length CRC wrong at offset %d" % (name, at))
        if len(stream) < at + 16 + length:
            raise ValueError("%s: truncated record at offset %d" % (name, at))
        record = stream[at + 12:at + 12 + length]
        (data_crc,) = struct.unpack("<I", stream[at + 12 + length:at + 16 + length])
        if data_crc != masked(record):
            raise ValueError("%s: data CRC wrong at offset %d" % (name, at))
        records.append(record)
        at += 16 + length
    return records
