# Run by a candidate interpreter: can it run ashd? Prints "<version> <real executable>" and exits 0,
# or prints one line saying why not and exits 1. Written in syntax that any Python 2.7+ parses, so
# an old interpreter gets this message instead of a SyntaxError.
from __future__ import print_function

import os
import platform
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What ashd and its dependencies import from the standard library, and what makes a venv.
MODULES = ("sqlite3", "ssl", "ctypes", "zlib", "lzma", "bz2", "venv", "ensurepip")


def admitted():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        spec = re.search(r'^requires-python\s*=\s*"([^"]+)"', f.read(), re.M).group(1)
    for clause in spec.split(","):
        m = re.match(r"\s*(>=|<=|<|>|==)\s*([\d.]+)\s*$", clause)
        want = tuple(int(x) for x in m.group(2).split("."))
        have = sys.version_info[:len(want)]
        ok = {">=": have >= want, "<": have < want, "<=": have <= want, ">": have > want, "==": have == want}
        if not ok[m.group(1)]:
            return spec
    return None


def main():
    version = "%d.%d.%d" % sys.version_info[:3]
    spec = admitted()
    if spec:
        print("Python %s is outside what ashd supports (requires-python %s)" % (version, spec))
        return 1
    if platform.python_implementation() != "CPython":
        print("%s %s is not CPython, the only implementation ashd is tested on" % (
            platform.python_implementation(), version))
        return 1
    missing = []
    for name in MODULES:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        print("Python %s lacks the standard modules %s (on Debian/Ubuntu: apt-get install python3-venv; "
              "a self-built Python needs the sqlite3, ssl, ffi, zlib, lzma and bz2 development headers)"
              % (version, ", ".join(missing)))
        return 1
    print(version, os.path.realpath(sys.executable))
    return 0


sys.exit(main())
