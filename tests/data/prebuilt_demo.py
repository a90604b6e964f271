"""Test fixture for `overlay apply --prebuilt`: compiles a real (tiny) C extension from the patched tree with gcc.

argv: TREE OUT INFO. Exit 2 (a usage error for overlay) when no C compiler is found.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

tree, out, info = map(Path, sys.argv[1:4])
cc = shutil.which("gcc") or shutil.which("cc")
if cc is None:
    print("no C compiler (gcc) on PATH: install gcc to use --prebuilt", file=sys.stderr)
    sys.exit(2)
src = out.parent / "demo_native.c"
value = (tree / "demo_pkg" / "util.py").read_text().count("x")  # depends on the patched tree
src.write_text(
    "#include <Python.h>\n"
    f"static PyObject* answer(PyObject* s, PyObject* a) {{ return PyLong_FromLong({value}); }}\n"
    'static PyMethodDef M[] = {{"answer", answer, METH_NOARGS, ""}, {0}};\n'
    'static struct PyModuleDef D = {PyModuleDef_HEAD_INIT, "demo_native", 0, -1, M};\n'
    "PyMODINIT_FUNC PyInit_demo_native(void) { return PyModule_Create(&D); }\n"
)
suffix = sysconfig.get_config_var("EXT_SUFFIX")
target = out / f"demo_native{suffix}"
subprocess.run(
    [cc, "-shared", "-fPIC", "-O2", f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(target)],
    check=True,
)
info.write_text(json.dumps({"compiler": cc, "ext_suffix": suffix}))
