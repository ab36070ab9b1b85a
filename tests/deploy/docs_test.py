#!/usr/bin/python3
"""The docs cannot drift from the binaries.

1. Every fenced ```sh block of README.md and docs/*.md: each Stratum binary it runs exists
   in the build, and every --flag it gives that binary is one its --help lists.
2. Every ```cpp block is an excerpt, line for line, of a source the build compiles
   (examples/, tests/, and the components): code samples cannot drift from compiled code.
3. Every ```json block is JSON.
4. The README's output block of the main job matches the lines of a real run of it, apart
   from the figures that vary (numbers, ids, times, paths), in order.

Usage: docs_test.py --source REPO --bin BUILD/bin [--skip_run]
"""
import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(\w*)\s*$")


def blocks(path, language):
    """The fenced blocks of `language` in a markdown file, as lists of lines."""
    found, current, inside = [], None, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            fence = FENCE.match(line.strip())  # fences may be indented (in a list item)
            if fence and inside is None:
                inside = fence.group(1)
                current = []
            elif line.strip().startswith("```") and inside is not None:
                if inside == language:
                    found.append(current)
                inside = None
            elif inside is not None:
                current.append(line)
    return found


def commands(block):
    """Shell commands of a block: continuations joined, comments dropped, split on && ; |."""
    joined, pending = [], ""
    for line in block:
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        joined.append(pending + stripped)
        pending = ""
    for command in joined:
        command = command.split(" #")[0]  # a trailing comment
        for part in re.split(r"&&|\|\||;|\|", command):
            try:
                words = shlex.split(part)
            except ValueError:
                words = part.split()
            while words and "=" in words[0] and not words[0].startswith("-"):
                words = words[1:]  # VAR=value before the program
            if words:
                yield words


HELP_CACHE = {}
# Programs that run another command given after their own arguments.
WRAPPERS = {"srun", "mpirun", "env", "sudo", "timeout", "nohup", "time"}


def help_flags(binary):
    if binary not in HELP_CACHE:
        result = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
        text = result.stdout + result.stderr
        # The flags --help defines: Abseil lists each as "--name (...)" at a line's start.
        HELP_CACHE[binary] = set(re.findall(r"^\s*--([A-Za-z0-9_]+) \(", text, re.M))
        HELP_CACHE[binary] |= {"help", "helpfull", "version"}
    return HELP_CACHE[binary]


def check_commands(source, bin_dir):
    files = [os.path.join(source, "README.md")] + sorted(glob.glob(os.path.join(source, "docs", "*.md")))
    problems, checked = [], 0
    ours = set(os.listdir(bin_dir))
    for path in files:
        for block in blocks(path, "sh"):
            for words in commands(block):
                # The Stratum binary may follow a wrapper (srun, env, sudo, timeout ...).
                def is_ours(word):
                    return (os.path.basename(word) in ours or word.startswith(("./build/bin/", "build/bin/"))
                            or os.path.basename(word).startswith("stratum-"))
                at = 0 if is_ours(words[0]) else None
                if at is None and os.path.basename(words[0]) in WRAPPERS:
                    at = next((i for i, word in enumerate(words) if is_ours(word)), None)
                if at is None:
                    continue
                words = words[at:]
                program = os.path.basename(words[0])
                if program not in ours:
                    problems.append("%s: %s is not a built binary" % (path, words[0]))
                    continue
                known = help_flags(os.path.join(bin_dir, program))
                for word in words[1:]:
                    if not word.startswith("--") or word == "--":
                        continue
                    name = word[2:].split("=")[0].replace("-", "_")
                    if name.startswith("no") and name[2:] in known:
                        continue
                    if name not in known:
                        problems.append("%s: %s has no flag --%s (in: %s)" %
                                        (os.path.relpath(path, source), program, name,
                                         " ".join(words)))
                checked += 1
    return problems, checked


def doc_files(source):
    return [os.path.join(source, "README.md")] + sorted(glob.glob(os.path.join(source, "docs", "*.md")))


def normalized(lines):
    return [" ".join(line.split()) for line in lines if line.strip()]


def check_code_samples(source):
    problems, checked = [], 0
    compiled = []
    for pattern in ("examples/*.cc", "tests/**/*.cc", "common/**/*.cc", "ps/**/*.cc",
                    "worker/**/*.cc", "coordinator/**/*.cc", "deploy/**/*.cc", "bench/*.cc"):
        for path in glob.glob(os.path.join(source, pattern), recursive=True):
            with open(path, encoding="utf-8") as f:
                compiled.append(normalized(f.read().splitlines()))
    for path in doc_files(source):
        for block in blocks(path, "cpp"):
            sample = normalized(block)
            found = any(
                any(lines[i:i + len(sample)] == sample for i in range(len(lines) - len(sample) + 1))
                for lines in compiled)
            if not found:
                problems.append("%s: a cpp sample is not an excerpt of a compiled source:\n%s" %
                                (os.path.relpath(path, source), "\n".join(block)))
            checked += 1
        for block in blocks(path, "json"):
            try:
                json.loads("\n".join(block))
            except ValueError as error:
                problems.append("%s: a json sample does not parse (%s):\n%s" %
                                (os.path.relpath(path, source), error, "\n".join(block)))
            checked += 1
    return problems, checked


def readme_output_block(source):
    """The output block that follows the README's main-job command."""
    text = open(os.path.join(source, "README.md"), encoding="utf-8").read()
    start = text.index("What the main job prints")
    rest = text[start:]
    block = rest[rest.index("```\n") + 4:]
    return block[:block.index("```")].splitlines()


def pattern(line, checkpoint_dir):
    """A README line as a regex: figures, ids, times and paths may differ."""
    line = line.replace("/tmp/stratum/ckpt", "\0CKPT\0")
    out = []
    for token in re.split(r"(\s+)", line.strip()):
        if not token:
            continue
        if token.isspace():
            out.append(r"\s+")
        elif "\0CKPT\0" in token:
            tail = token.split("\0CKPT\0", 1)[1]
            tail = re.escape(tail).replace(r"run\-\.\.\.", r"run-\S+")
            out.append(re.escape(checkpoint_dir) + tail)
        elif re.fullmatch(r"[0-9a-f]{16}", token):  # an incarnation
            out.append("[0-9a-f]{16}")
        else:
            escaped = re.escape(token)
            escaped = re.sub(r"\d+(\\\.\d+)?", r"[0-9]+(\\.[0-9]+)?", escaped)
            out.append(escaped)
    return re.compile("^" + "".join(out) + "$")


def check_main_job(source, bin_dir):
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(source, "examples", "fashion_mnist_ps.json")) as f:
            job = json.load(f)
        checkpoint_dir = os.path.join(tmp, "ckpt")
        job["checkpoint"]["dir"] = checkpoint_dir
        job_path = os.path.join(tmp, "job.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        run = subprocess.run([os.path.join(bin_dir, "stratum-launch"), "--job", job_path],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=300)
        lines = run.stdout.splitlines()
        if run.returncode != 0:
            return ["the main job failed (exit %d):\n%s" % (run.returncode, "\n".join(lines))]
        problems, at = [], 0
        for wanted in readme_output_block(source):
            if wanted.strip() == "...":
                continue
            regex = pattern(wanted, checkpoint_dir)
            while at < len(lines) and not regex.match(lines[at]):
                at += 1
            if at == len(lines):
                problems.append("README line not in a real run (in order): %r\nthe run:\n%s" %
                                (wanted, "\n".join(lines)))
                break
            at += 1
        return problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--bin", required=True)
    parser.add_argument("--skip_run", action="store_true")
    options = parser.parse_args()
    problems, checked = check_commands(options.source, options.bin)
    print("checked %d commands of README.md and docs/" % checked)
    sample_problems, samples = check_code_samples(options.source)
    problems += sample_problems
    print("checked %d cpp and json samples" % samples)
    if not options.skip_run:
        problems += check_main_job(options.source, options.bin)
        print("compared the README's main-job output with a real run")
    for problem in problems:
        print("FAIL:", problem)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
