#!/usr/bin/env python3
"""The layers of docs/architecture.md, checked on the built objects.

Each library object's undefined symbols are matched to the object that
defines them (nm), which gives the file-level graph of calls and data
references. The check fails on:
  - a reference from a folder to one it may not use (USES below: a layer
    above, or a sibling that is not below it);
  - a reference from another layer into core/, nn/, optim/ or parallel/
    that is not exported from libcxla (layers above use the public API;
    util/ is the one shared internal layer);
  - a cycle of more than 2 files under core/, nn/, optim/, checkpoint/,
    parallel/ or util/ (a strongly connected component of the graph).

usage: check_symbols.py SOURCE_DIR BUILD_DIR LIBCXLA_SO
"""
import os
import subprocess
import sys
from collections import defaultdict

# folder -> the folders it may reference (its own is always allowed).
# The core is a stack: each folder sees only what lies below it.
CORE = {
    "core/base": [],
    "core/kernels": ["core/base"],
    "core/spmd": ["core/base"],
    "core/executable": ["core/base", "core/kernels", "core/spmd"],
    "core/runtime": ["core/base", "core/kernels", "core/spmd", "core/executable"],
    "core/ir": ["core/base", "core/spmd"],
    "core/ops": ["core/base", "core/kernels", "core/spmd", "core/ir"],
    "core/autograd": ["core/base", "core/kernels", "core/spmd", "core/ir", "core/ops"],
    "core/compile": ["core/base", "core/kernels", "core/spmd", "core/executable", "core/ir"],
}
CORE["core/api"] = sorted(set(sum(CORE.values(), [])) | set(CORE) - {"core/api"})
CORE["core/obs"] = sorted(set(CORE["core/api"]) | {"core/api"})
ALL_CORE = sorted(CORE)
USES = {"util": []}
for folder, below in CORE.items():
    USES[folder] = ["util"] + below
USES["nn"] = ["util"] + ALL_CORE
USES["optim"] = ["util"] + ALL_CORE
USES["parallel/shm"] = ["util"] + ALL_CORE
USES["parallel"] = ["util", "nn", "optim", "parallel/shm"] + ALL_CORE
USES["parallel/ddp"] = ["util", "nn", "optim", "parallel", "parallel/shm"] + ALL_CORE
USES["parallel/fsdp"] = ["util", "nn", "optim", "parallel", "parallel/shm"] + ALL_CORE
USES["checkpoint"] = ["util", "nn", "optim", "parallel", "parallel/fsdp", "parallel/ddp"] + ALL_CORE

# a reference between these layers must be to an exported symbol
LAYER_OF = [("core/", "core"), ("nn", "nn"), ("optim", "optim"), ("parallel", "parallel"),
            ("checkpoint", "checkpoint"), ("util", "util")]
CYCLE_ROOTS = ("core/", "nn/", "optim/", "checkpoint/", "parallel/", "util/")


def layer(folder):
    for prefix, name in LAYER_OF:
        if folder.startswith(prefix):
            return name
    return None


def library_objects(src, build):
    """The objects of the library's layers: the object libraries cx_* that
    the top-level CMakeLists.txt defines, for sources that still exist (a
    build directory may keep objects of a target or file since removed)."""
    objs = []
    top = os.path.join(build, "CMakeFiles")
    for lib in sorted(os.listdir(top)):
        if not (lib.startswith("cx_") and lib.endswith(".dir")):
            continue
        for root, _, files in os.walk(os.path.join(top, lib)):
            for f in files:
                o = os.path.join(root, f)
                if f.endswith(".c.o") and os.path.exists(os.path.join(src, source_of(o))):
                    objs.append(o)
    return objs


def source_of(obj):
    return obj.split(".dir/", 1)[1][:-2]


def read_symbols(objs):
    defs, undefs = {}, defaultdict(set)
    for o in objs:
        out = subprocess.run(["nm", o], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "U":
                undefs[o].add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBRVWC":
                defs.setdefault(parts[2], o)
    return defs, undefs


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    return {line.split()[2] for line in out.splitlines() if len(line.split()) == 3}


def sccs(nodes, graph):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
    return out


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[-1])
        return 2
    src, build, lib = sys.argv[1:4]
    objs = library_objects(src, build)
    if not objs:
        print(f"check_symbols: no library objects (CMakeFiles/cx_*) under {build}")
        return 1
    defs, undefs = read_symbols(objs)
    public = exported(lib)
    problems = []
    graph = defaultdict(set)
    folders = set()
    for o in objs:
        src = source_of(o)
        here = os.path.dirname(src)
        folders.add(here)
        if here not in USES:
            problems.append(f"{src}: folder {here} has no place in the layers (tests/api/check_symbols.py USES)")
            continue
        for sym in sorted(undefs[o]):
            d = defs.get(sym)
            if not d or d == o:
                continue
            graph[src].add(source_of(d))
            there = os.path.dirname(source_of(d))
            if there != here and there not in USES[here]:
                problems.append(f"{src} -> {source_of(d)} ({sym}): {here} may not use {there}")
            elif layer(there) not in (layer(here), "util") and sym not in public:
                problems.append(f"{src} -> {source_of(d)} ({sym}): not public API, but {here} is another layer")
    for comp in sccs(sorted(graph), graph):
        if len(comp) > 2 and any(c.startswith(CYCLE_ROOTS) for c in comp):
            problems.append(f"cycle of {len(comp)} files: {' '.join(sorted(comp))}")
    for p in problems:
        print(p)
    if problems:
        print(f"check_symbols: {len(problems)} problem(s)")
        return 1
    nedges = sum(len(v) for v in graph.values())
    print(f"check_symbols: {len(objs)} objects in {len(folders)} folders, {nedges} file references, "
          "all down the layers; no cycle longer than 2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
