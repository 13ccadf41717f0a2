#!/usr/bin/env python3
"""Which flags of real Megatron-LM / MindSpeed / MindSpeed-LLM launch scripts `ampipe train` does not know.

  tools/flag_coverage.py [--ampipe build/ampipe] [--top N] [--list] [--json FILE] PATH...

PATH: launch scripts or directories (searched for *.sh, *.yaml, *.yml). A script counts when it launches a GPT training
entry point (pretrain_gpt*.py, posttrain_gpt.py, pretrain_deepseek*.py; --entry changes it); a YAML file counts when it is a Megatron functional-test
model_config.yaml (a MODEL_ARGS mapping with --train-iters or --train-samples). Everything else is skipped.

What a script passes is what follows the entry point on its launch line, with the bash variables it uses ($GPT_ARGS,
${MODEL_ARGS[@]}) expanded from their definitions in the same file (VAR="...", VAR=( ... ), VAR+=..., "$VAR ..."
self-references); the launcher's own flags (torchrun's --nproc_per_node, ...) come before the entry point and are not
counted. In a YAML file, every MODEL_ARGS key whose value is not false (Megatron's test harness drops those).

A flag *use* is one flag in one script (a flag a script passes twice counts once). The known flags are those that
`ampipe train --help` lists (honoured, refused with a reason, or accepted with no effect). Prints the unknown flags
with their use counts and the unknown share of all flag uses. Python 3 standard library only.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys

# The GPT entry points (Megatron-LM's pretrain_gpt.py, MindSpeed-LLM's posttrain_gpt.py and pretrain_deepseek4.py);
# --entry widens or narrows it.
DEFAULT_ENTRY = r"(?:pretrain_gpt\w*|posttrain_gpt|pretrain_deepseek\w*)\.py"
FLAG = re.compile(r"(?<![\w-])--([A-Za-z][A-Za-z0-9_.-]*[A-Za-z0-9])")
ASSIGN = re.compile(r"^\s*(?:export\s+|local\s+|declare\s+(?:-\w+\s+)*)?([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
VAR = re.compile(r"\$\{!?([A-Za-z_]\w*)(?:\[[@*]\])?(?:[^}]*)\}|\$([A-Za-z_]\w*)")


def strip_comment(line):
    """The line without a bash comment (a # at the start or after a blank, outside quotes)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def logical_lines(text):
    """Lines with backslash continuations joined and comments dropped; a quoted string or a (...) array that spans
    lines stays one logical line."""
    out, cur, depth, quote = [], "", 0, None
    for raw in text.splitlines():
        line = raw if quote else strip_comment(raw)
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        for c in line:  # open quotes and array parentheses carry the statement on
            if quote:
                if c == quote:
                    quote = None
            elif c in "'\"":
                quote = c
            elif c == "(":
                depth += 1
            elif c == ")":
                depth = max(0, depth - 1)
        if quote or depth:
            cur += "\n"
            continue
        out.append(cur)
        cur = ""
    if cur:
        out.append(cur)
    return out


def expand(text, env, depth=0):
    """$VAR, ${VAR}, ${VAR[@]} replaced by their text in env (unknown ones by nothing)."""
    if depth > 8:
        return text
    return VAR.sub(lambda m: expand(env.get(m.group(1) or m.group(2), ""), env, depth + 1), text)


def unwrap(value):
    value = value.strip()
    if value.startswith("(") and value.endswith(")"):
        value = value[1:-1]
    return value


def launch_args(text, entry):
    """The text each training launch of a bash script passes after its entry point, variables expanded."""
    env, launches = {}, []
    for line in logical_lines(text):
        m = ASSIGN.match(line)
        if m and not entry.search(line.split("=", 1)[0]):
            name, append, value = m.group(1), m.group(2), unwrap(m.group(3))
            value = expand(value, env)
            env[name] = (env.get(name, "") + " " + value) if append else value
            continue
        full = expand(line, env)
        e = entry.search(full)
        if not e:
            continue
        rest = full[e.end():]
        rest = re.split(r"\s(?:\||2?>|&>|&&)", rest)[0]  # up to a pipe or a redirection
        launches.append(rest)
    return launches


def yaml_model_args(text):
    """The flags a Megatron functional-test model_config.yaml passes (MODEL_ARGS keys whose value is not false)."""
    flags, inside = [], False
    for raw in text.splitlines():
        line = strip_comment(raw).rstrip()
        if not line.strip():
            continue
        if not raw.startswith((" ", "\t")):
            inside = line.startswith("MODEL_ARGS:")
            continue
        if not inside:
            continue
        m = re.match(r"\s+[\"']?--([A-Za-z][\w.-]*)[\"']?\s*:\s*(.*)$", line)
        if m and m.group(2).strip().strip("\"'").lower() != "false":
            flags.append(m.group(1))
    return flags


def script_flags(path, entry):
    """(kind, set of flag names without --) of one file, or None when it is not a training launch."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    if path.endswith((".yaml", ".yml")):
        flags = yaml_model_args(text)
        if not ({"train-iters", "train-samples"} & set(flags)):
            return None
        return "yaml", set(flags)
    launches = launch_args(text, entry)
    if not launches:
        return None
    flags = set()
    for rest in launches:
        flags.update(FLAG.findall(rest))
    return "sh", flags


def known_flags(ampipe):
    """The flag names `ampipe train --help` lists."""
    out = subprocess.run([ampipe, "train", "--help"], check=True, capture_output=True, text=True).stdout
    return set(re.findall(r"^\s+(?:-\w,)?--([A-Za-z][\w-]*)", out, re.M))


def files_of(paths):
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for name in sorted(files):
                    if name.endswith((".sh", ".yaml", ".yml")):
                        yield os.path.join(root, name)
        else:
            yield p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--ampipe", default="build/ampipe")
    ap.add_argument("--top", type=int, default=60, help="unknown flags to print (0: all)")
    ap.add_argument("--list", action="store_true", help="also print each script's unknown flags")
    ap.add_argument("--json", help="write the counts as JSON to this file")
    ap.add_argument("--entry", default=DEFAULT_ENTRY,
                    help="regular expression of the training entry points whose launches count (default: %(default)s)")
    args = ap.parse_args()

    known = known_flags(args.ampipe)
    entry = re.compile(r"(?<![\w-])[\w./${}-]*?" + args.entry + r"(?![\w.])")
    uses, unknown, unknown_scripts = 0, collections.Counter(), {}
    kinds, sources = collections.Counter(), collections.Counter()
    skipped = 0
    for path in files_of(args.paths):
        r = script_flags(path, entry)
        if r is None:
            skipped += 1
            continue
        kind, flags = r
        kinds[kind] += 1
        uses += len(flags)
        miss = sorted(f for f in flags if f not in known)
        unknown.update(miss)
        if miss:
            unknown_scripts[path] = miss
    scripts = sum(kinds.values())
    n_unknown = sum(unknown.values())
    share = 100.0 * n_unknown / uses if uses else 0.0
    print(f"scripts: {scripts} ({kinds['sh']} launch scripts, {kinds['yaml']} model_config.yaml); "
          f"{skipped} other files skipped")
    print(f"flag uses: {uses}; distinct flags known to ampipe train: {len(known)}")
    print(f"unknown uses: {n_unknown} ({share:.2f}%), {len(unknown)} distinct unknown flags, "
          f"in {len(unknown_scripts)} scripts")
    top = unknown.most_common(args.top or None)
    if top:
        print("unknown flag                                      uses")
        for name, n in top:
            print(f"  --{name:<46} {n}")
    if args.list:
        for path, miss in unknown_scripts.items():
            print(f"{path}: " + " ".join("--" + f for f in miss))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"scripts": scripts, "uses": uses, "unknown_uses": n_unknown, "unknown_share_percent": share,
                       "unknown": dict(unknown.most_common())}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
