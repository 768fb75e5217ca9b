#!/usr/bin/env python3
"""No function of the daemon's own code longer than the limit (default 100 lines).

Scans server/, worker/, config/, common/ and tools/cli/ (.cc, .h, .cu) for function bodies: a brace
block whose header ends in a parameter list (a lambda's body counts toward the function it is
in). Comments and string literals are blanked first so their braces do not count.

Usage: function_size.py [--limit N] [ROOT]     Exit codes: 0 none too long, 1 some (listed).
"""
import argparse
import os
import re
import sys

DIRS = ("server", "worker", "config", "common", os.path.join("tools", "cli"))
FUNCTION_HEADER = re.compile(
    r"\)\s*(const)?\s*(override)?\s*(final)?\s*(noexcept)?\s*(->[^{;]*)?\s*"
    r"(ABSL_\w+\([^)]*\)\s*)*$")
NOT_A_FUNCTION = re.compile(r"\b(namespace|class|struct|enum|union|if|for|while|switch|catch)\b")


def blank(source):
    def keep_lines(match):
        return "\n" * match.group(0).count("\n")
    source = re.sub(r"R\"(\w*)\((.*?)\)\1\"", lambda m: '""' + keep_lines(m), source, flags=re.S)
    source = re.sub(r"//[^\n]*", "", source)
    source = re.sub(r"/\*.*?\*/", keep_lines, source, flags=re.S)
    source = re.sub(r"\"(\\.|[^\"\\\n])*\"", '""', source)
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", source)


def long_functions(path, limit):
    lines = blank(open(path, encoding="utf-8").read()).split("\n")
    found, stack, header = [], [], ""
    for number, line in enumerate(lines, 1):
        for ch in line:
            if ch == "{":
                # The text since the last ';', '{' or '}': the block's header.
                stack.append((number, header.strip(), len(stack)))
                header = ""
            elif ch == "}":
                header = ""
                if not stack:
                    continue
                start, head, _ = stack.pop()
                is_function = FUNCTION_HEADER.search(head) and not NOT_A_FUNCTION.match(head)
                inside_function = any(FUNCTION_HEADER.search(h) and not NOT_A_FUNCTION.match(h)
                                      for _, h, _ in stack)
                if is_function and not inside_function and number - start + 1 > limit:
                    found.append((number - start + 1, start, head[-90:]))
            elif ch == ";":
                header = ""
            else:
                header += ch
        header += " "
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("root", nargs="?",
                        default=os.path.dirname(os.path.dirname(os.path.dirname(
                            os.path.abspath(__file__)))))
    options = parser.parse_args()
    too_long = []
    for directory in DIRS:
        for folder, _, files in os.walk(os.path.join(options.root, directory)):
            for name in sorted(files):
                if name.endswith((".cc", ".h", ".cu")):
                    path = os.path.join(folder, name)
                    for lines, start, head in long_functions(path, options.limit):
                        too_long.append((lines, os.path.relpath(path, options.root), start, head))
    for lines, path, start, head in sorted(too_long, reverse=True):
        print(f"{path}:{start}: {lines} lines: {head}")
    print(f"function_size: {len(too_long)} functions over {options.limit} lines")
    return 1 if too_long else 0


if __name__ == "__main__":
    sys.exit(main())
