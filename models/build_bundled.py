"""Regenerate the models that ship in dmlopt/data/ (used by `dmlopt demo` and the tests).

    python -m models.build_bundled            # rewrite dmlopt/data/*.onnx
    python -m models.build_bundled --check    # rebuild in a temp folder, compare, exit 1 on drift

The package ships these files because it must not import models/ and torch is not a runtime
dependency.  Everything is seeded: the CNN files come out byte-identical, the SAM files
graph-identical (same nodes, attributes and weights) for a given torch version.  Each file
records its builder and arguments in metadata_props.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

from models import cnn, sam_encoder

DATA_DIR = pathlib.Path(__file__).resolve().parent.parent / "dmlopt" / "data"

CNN_ARGS = dict(alpha=0.1, channels=16, height=128, width=128, batch=1, seed=0)


def _write_cnn_leaky(path):
    onnx.save(cnn.build_cnn(activation="leaky_relu", **CNN_ARGS), path)


def _write_cnn_relu(path):
    onnx.save(cnn.build_cnn_relu(**CNN_ARGS), path)


def _write_sam_small(path):
    sam_encoder.export_small(path, dynamic_batch=False, seed=0)


def _write_sam_small_dynamic(path):
    sam_encoder.export_small(path, dynamic_batch=True, seed=0)


BUNDLED = {
    "cnn_leaky.onnx": _write_cnn_leaky,
    "cnn_relu.onnx": _write_cnn_relu,
    "sam_small.onnx": _write_sam_small,
    "sam_small_dynamic.onnx": _write_sam_small_dynamic,
}


def build_all(out_dir=DATA_DIR, names=None) -> list[pathlib.Path]:
    """Write the bundled models (all, or those in `names`) into `out_dir`; returns the paths."""
    out = pathlib.Path(out_dir)
    written = []
    for name in names or BUNDLED:
        BUNDLED[name](out / name)
        written.append(out / name)
    return written


def graph_differences(a: onnx.ModelProto, b: onnx.ModelProto) -> list[str]:
    """What differs between two models' graphs: opsets, I/O, nodes in order, weights."""
    diffs = []
    if {(o.domain, o.version) for o in a.opset_import} != {(o.domain, o.version) for o in b.opset_import}:
        diffs.append("opset imports differ")
    if [i.SerializeToString() for i in a.graph.input] != [i.SerializeToString() for i in b.graph.input]:
        diffs.append("graph inputs differ")
    if [o.SerializeToString() for o in a.graph.output] != [o.SerializeToString() for o in b.graph.output]:
        diffs.append("graph outputs differ")
    ops_a = [n.op_type for n in a.graph.node]
    ops_b = [n.op_type for n in b.graph.node]
    if ops_a != ops_b:
        diffs.append(f"node op sequences differ ({len(ops_a)} vs {len(ops_b)} nodes)")
    elif [n.SerializeToString() for n in a.graph.node] != [n.SerializeToString() for n in b.graph.node]:
        diffs.append("node attributes or wiring differ")
    weights_a = {t.name: numpy_helper.to_array(t) for t in a.graph.initializer}
    weights_b = {t.name: numpy_helper.to_array(t) for t in b.graph.initializer}
    if weights_a.keys() != weights_b.keys():
        diffs.append("initializer names differ")
    else:
        changed = [k for k in weights_a if weights_a[k].shape != weights_b[k].shape
                   or not np.array_equal(weights_a[k], weights_b[k])]
        if changed:
            diffs.append(f"{len(changed)} initializers differ (e.g. {changed[0]})")
    if {p.key: p.value for p in a.metadata_props} != {p.key: p.value for p in b.metadata_props}:
        diffs.append("metadata_props differ")
    return diffs


def check(data_dir=DATA_DIR) -> list[str]:
    """Rebuild into a temp folder and compare with `data_dir`; returns one line per problem."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for fresh in build_all(tmp):
            shipped = pathlib.Path(data_dir) / fresh.name
            if not shipped.is_file():
                problems.append(f"{fresh.name}: missing from {data_dir}")
                continue
            for diff in graph_differences(onnx.load(shipped), onnx.load(fresh)):
                problems.append(f"{fresh.name}: {diff}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.build_bundled", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DATA_DIR), help=f"folder to write (default {DATA_DIR})")
    parser.add_argument("--check", action="store_true", help="compare a fresh build with --out instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.out)
        for line in problems:
            print(line)
        print("bundled models are up to date" if not problems else f"{len(problems)} differences")
        return 1 if problems else 0
    for path in build_all(args.out):
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
