"""Regenerate the checked-in protobuf/gRPC code from ``proto/`` (``make proto``).

Runs ``python -m grpc_tools.protoc`` (pinned in the ``dev`` extra) with ``-Iproto`` so the
generated modules form the top-level package ``zephon_proto`` and import each other as
``from zephon_proto.v1 import data_service_pb2`` without ``sys.path`` tricks. The output is
byte-for-byte reproducible; ``tests/service/test_proto.py`` regenerates into a temporary
directory and fails when the checked-in files drift.

Usage: ``python tools/gen_proto.py [--out DIR]`` (default ``client/``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"
PROTO_FILES = ("zephon_proto/v1/data_service.proto",)
PINNED_GRPCIO_TOOLS = "1.85.1"

# Package markers written next to the generated modules (protoc does not write them).
INIT_FILES = {
    "zephon_proto/__init__.py": (
        '"""Generated protobuf and gRPC code for the Zephon service.\n\n'
        "Regenerate with ``make proto``; do not edit (tests/service/test_proto.py checks for\n"
        "drift).\n"
        '"""\n'
    ),
    "zephon_proto/v1/__init__.py": (
        '"""Package ``zephon.v1``: messages and the DataService stub (generated)."""\n'
    ),
}


def generated_paths() -> list[str]:
    """Paths (relative to the output directory) of every file this script writes."""
    out = list(INIT_FILES)
    for proto in PROTO_FILES:
        stem = proto.removesuffix(".proto")
        out += [f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"]
    return sorted(out)


def protoc_command(out_dir: Path) -> list[str]:
    """The protoc invocation: relative paths only, so the output does not depend on cwd."""
    out = str(out_dir)
    return [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-Iproto",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(f"proto/{p}" for p in PROTO_FILES),
    ]


def generate(out_dir: Path) -> list[Path]:
    """Write the generated package under ``out_dir``; returns the files written."""
    out_dir = out_dir.resolve()
    for rel, text in INIT_FILES.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    subprocess.run(protoc_command(out_dir), cwd=ROOT, check=True)
    return [out_dir / rel for rel in generated_paths()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "client", help="output directory")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
