#!/usr/bin/python3
"""What a PNG shows, decoded here from the format's description (zlib and the five scanline
filters; 8-bit RGB or RGBA, not interlaced): its size, how many distinct colours it has and
the fraction of pixels that are not white, as one JSON line. Exits 1 naming what it cannot
read. For the status page's screenshot: a blank page has one colour.

Usage: png_stats.py FILE
"""
import json
import struct
import sys
import zlib


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def main():
    data = open(sys.argv[1], "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        print("not a PNG", file=sys.stderr)
        return 1
    at, idat, header = 8, b"", None
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind = data[at + 4:at + 8]
        body = data[at + 8:at + 8 + length]
        if zlib.crc32(kind + body) != struct.unpack(">I", data[at + 8 + length:at + 12 + length])[0]:
            print("chunk %s has a wrong CRC" % kind, file=sys.stderr)
            return 1
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        at += 12 + length
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        print("only 8-bit RGB(A), not interlaced: %s" % (header,), file=sys.stderr)
        return 1
    channels = 4 if colour == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * channels
    previous = bytearray(stride)
    colours, non_white = set(), 0
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            up_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                line[i] = (line[i] + paeth(left, up, up_left)) & 0xFF
        for x in range(0, stride, channels):
            pixel = bytes(line[x:x + 3])
            colours.add(pixel)
            non_white += pixel != b"\xff\xff\xff"
        previous = line
    print(json.dumps({"width": width, "height": height, "colours": len(colours),
                      "non_white": non_white / float(width * height)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
