#!/bin/sh
# Trims the bridge's finished virtual environment for an image, then byte-compiles it once.
#   slim-venv.sh /opt/venv
# Used by docker/Dockerfile and by the add-on's Dockerfile, which keeps a copy in its own folder
# (the Supervisor's build context is that folder alone; a test keeps the two copies equal).
# Only what the bridge never loads goes; script/docker-check makes each bundled voice speak in
# the trimmed image.
set -eu
venv=${1:?usage: slim-venv.sh VENV}
py="$venv/bin/python"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')

# misaki's zh extra pulls in pypinyin-dict (40 MB of phrase tables, 100 MB once compiled) for its
# ZHFrontend; the bridge reads Chinese with jieba, pypinyin and misaki.zh's pinyin-to-IPA table,
# which import none of it.
"$py" -m pip uninstall --yes --quiet pypinyin-dict

# hf_xet is huggingface_hub's optional chunked transfer client (11 MB): without it `models
# download` fetches over plain HTTP, as it does on every platform hf_xet has no wheel for.
"$py" -m pip uninstall --yes --quiet hf-xet

# pip and setuptools install packages: nothing is installed into the image at run time.
rm -rf "$site"/pip "$site"/pip-*.dist-info "$site"/setuptools "$site"/setuptools-*.dist-info \
    "$site"/pkg_resources "$site"/_distutils_hack "$site"/distutils-precedence.pth \
    "$site"/wheel "$site"/wheel-*.dist-info "$venv"/bin/pip "$venv"/bin/pip3* "$venv"/bin/wheel

# The dependencies' own test suites, the sources of their compiled modules and their type stubs
# (C headers stay: torch compiles against its own in the ChatTTS variant).
find "$site" -depth -type d -name tests -exec rm -rf {} +
find "$site" -type f \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.c' \
    -o -name '*.pyi' \) -delete

# Parts of dependencies no code path of the bridge imports:
# - jieba's paddle mode, keyword extraction and part-of-speech tagger (the bridge and misaki.zh
#   only segment, with jieba.lcut);
# - misaki's English, Japanese and Vietnamese lexicons (misaki.zh reads none);
# - onnxruntime's C API library for native programs, when its Python module has the runtime
#   linked in (it does not name libonnxruntime.so), and its transformer-optimisation scripts;
# - numpy's old build helpers and what C extensions compile against (distutils, headers and
#   static libraries; f2py stays: `from numpy import *`, which scipy runs, imports it);
# - Piper's training code (it needs torch and lightning, which are not installed);
# - onnx's backend test data (the bridge reads and cuts a model's graph, nothing more);
# - a stray build/ folder that the cn2an and proces wheels ship inside site-packages.
for module in "$site"/onnxruntime/capi/onnxruntime_pybind11_state*.so; do
    [ -f "$module" ] && ! grep -qF libonnxruntime.so. "$module" \
        && rm -f "$site"/onnxruntime/capi/libonnxruntime.so.*
done
rm -rf "$site"/jieba/lac_small "$site"/jieba/analyse "$site"/jieba/posseg \
    "$site"/onnxruntime/transformers \
    "$site"/numpy/distutils "$site"/numpy/_core/include "$site"/numpy/_core/lib \
    "$site"/numpy/random/lib \
    "$site"/piper/train "$site"/onnx/backend/test "$site"/build
[ ! -d "$site"/misaki/data ] || find "$site"/misaki/data -type f ! -name '__init__.py' -delete

# Byte code compiled once, here, replacing the copies pip made. unchecked-hash: Python uses the
# .pyc without comparing it to the source's time stamp, which a COPY between build stages or a
# registry need not keep; the image never edits its sources, and runs with
# PYTHONDONTWRITEBYTECODE so that nothing is compiled or written at run time.
find "$venv" -depth -type d -name __pycache__ -exec rm -rf {} +
"$py" -m compileall -q -j 0 --invalidation-mode unchecked-hash "$site"

# What is left still loads (each where the venv has it; numpy as scipy imports it, with *).
# Not onnxruntime: under QEMU user emulation (a multi-arch build on an x86 machine) it crashes
# at import, reading the host's x86 /proc/cpuinfo.
"$py" -c 'import importlib.util as u
names = ("numpy", "misaki.zh", "jieba", "pypinyin", "scipy.signal")
for name in names:
    if u.find_spec(name.split(".")[0]) is not None:
        __import__(name)
if u.find_spec("numpy") is not None:
    exec("from numpy import *", {})'
