#!/usr/bin/env bash
# Builds the release and checks it; uploads nothing.
#   bash scripts/release.sh [OUTDIR]      (default: dist/)
# Removes the previous celery_semaphore-* artifacts from OUTDIR, builds the sdist and
# the wheel from that sdist (`python -m build`, so an sdist that lacks a file fails
# here), runs `twine check --strict` (metadata, and the README as PyPI renders it),
# then checks what each artifact holds: the Lua scripts, py.typed, the `celery
# semaphore` entry point, LICENSE, and no tests, devkit, benchmarks or example.
# Prints the upload command last. PYTHON: the interpreter with the dev extra
# (build, twine); default .venv/bin/python.
set -euo pipefail
out=${1:-}
if [ -n "$out" ]; then
    out=$(mkdir -p "$out" && cd "$out" && pwd)  # relative to where the script was run
fi
cd "$(dirname "$0")/.."

python=${PYTHON:-.venv/bin/python}
out=${out:-dist}
mkdir -p "$out"
rm -f "$out"/celery_semaphore-*.whl "$out"/celery_semaphore-*.tar.gz
# setuptools adds the files an old SOURCES.txt lists to the sdist: start without one
rm -rf build celery_semaphore.egg-info

log=$(mktemp)
"$python" -m build --outdir "$out" . >"$log" 2>&1 || {
    tail -n 40 "$log" >&2
    echo "release.sh: python -m build failed (whole log: $log)" >&2
    exit 1
}
rm -f "$log"
"$python" -m twine check --strict "$out"/celery_semaphore-*

"$python" - "$out" <<'EOF'
"""What the artifacts must and must not hold; one line per problem, exit 1 if any."""

import sys
import tarfile
import zipfile
from pathlib import Path

out = Path(sys.argv[1])
(wheel,) = out.glob("celery_semaphore-*.whl")
version = wheel.name.split("-")[1]
(sdist,) = out.glob(f"celery_semaphore-{version}.tar.gz")
LUA = "celery_semaphore/core/redis/lua/"
lua = sorted(str(p.relative_to(LUA)) for p in Path(LUA).rglob("*.lua"))
forbidden = ("tests/", "devkit/", "benchmarks/", "example_project/", "docs/", "scripts/")
problems = []

with zipfile.ZipFile(wheel) as zf:
    names = zf.namelist()
    info = f"celery_semaphore-{version}.dist-info"
    entry_points = zf.read(f"{info}/entry_points.txt").decode()
    metadata = zf.read(f"{info}/METADATA").decode()
shipped_lua = sorted(n.split(LUA, 1)[1] for n in names if n.endswith(".lua"))
if shipped_lua != lua or not lua:
    problems.append(f"wheel: Lua scripts {shipped_lua}, the source has {lua}")
if "celery_semaphore/py.typed" not in names:
    problems.append("wheel: no celery_semaphore/py.typed")
if "[celery.commands]\nsemaphore = celery_semaphore.cli:semaphore" not in entry_points:
    problems.append(f"wheel: no celery.commands entry point 'semaphore':\n{entry_points}")
if f"{info}/licenses/LICENSE" not in names or "License-Expression: MIT" not in metadata:
    problems.append("wheel: no LICENSE file or no License-Expression: MIT")
strays = sorted({n.split("/")[0] for n in names} - {"celery_semaphore", info})
strays += [n for n in names if n.startswith(forbidden)]
if strays:
    problems.append(f"wheel: files outside the package: {strays}")

with tarfile.open(sdist) as tf:
    members = [m.split("/", 1)[1] for m in tf.getnames() if "/" in m]
for needed in ("LICENSE", "README.md", "pyproject.toml", "celery_semaphore/py.typed"):
    if needed not in members:
        problems.append(f"sdist: no {needed}")
if sorted(m.split(LUA, 1)[1] for m in members if m.endswith(".lua")) != lua:
    problems.append("sdist: not the source's Lua scripts")
if [m for m in members if m.startswith(forbidden)]:
    problems.append("sdist: holds tests, devkit, benchmarks, example, docs or scripts")

for problem in problems:
    print(f"release.sh: {problem}", file=sys.stderr)
if problems:
    sys.exit(1)
print(f"release.sh: {wheel.name} and {sdist.name} hold what they must ({len(lua)} Lua scripts)")
EOF

if [ -n "$(git status --porcelain 2>/dev/null)" ]; then
    echo "release.sh: warning: the tree has uncommitted changes; release from a clean one" >&2
fi
wheel=$(basename "$out"/celery_semaphore-*.whl)
version=$(echo "$wheel" | cut -d- -f2)
echo "release.sh: nothing uploaded. To publish $version (CHANGELOG entry written, tree clean):"
echo "    git tag v$version && git push origin v$version"
echo "    $python -m twine upload $out/celery_semaphore-*"
