"""Regenerate the committed gRPC stubs in spd_client/v1 from protos/spd/v1/spd.proto.

    python -m spd_client.gen_protos          # rewrite client/spd_client/v1/spd_pb2*.py(i)
    python -m spd_client.gen_protos --check  # exit 1 if the committed stubs are stale

Layout: protoc names the generated grpc module's import after the .proto's path below the -I
root. The source lives at protos/spd/v1/spd.proto (package spd.v1), but a top-level `spd.v1`
import would collide with the `spd` service package, so the .proto is staged into a temporary
tree as spd_client/v1/spd.proto and compiled from there: the generated code then imports
`from spd_client.v1 import spd_pb2`, no post-processing needed. The proto package (and so the
RPC paths /spd.v1.SPD/...) is unchanged; only the descriptor's file name is
"spd_client/v1/spd.proto". Needs grpcio-tools (a dev dependency); the output depends on its
version, so regenerate with the pinned one.
"""

from __future__ import annotations

import argparse
import filecmp
import logging
import shutil
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("spd_client.gen_protos")

REPO = Path(__file__).resolve().parents[2]  # client/spd_client/gen_protos.py -> repo root
PROTO = REPO / "protos" / "spd" / "v1" / "spd.proto"
STUB_DIR = REPO / "client" / "spd_client" / "v1"
STAGED = Path("spd_client") / "v1" / "spd.proto"  # path below the -I root; fixes import names
OUTPUTS = ("spd_pb2.py", "spd_pb2_grpc.py", "spd_pb2.pyi")


def generate(out_dir: Path) -> list[Path]:
    """Compile the .proto; return the generated files (they lie in out_dir)."""
    from grpc_tools import protoc  # dev dependency, imported only here

    with tempfile.TemporaryDirectory(prefix="spd-proto-") as src:
        staged = Path(src) / STAGED
        staged.parent.mkdir(parents=True)
        shutil.copyfile(PROTO, staged)
        with tempfile.TemporaryDirectory(prefix="spd-gen-") as gen:
            _run_protoc(protoc, src, gen, staged)
            produced = Path(gen) / STAGED.parent
            out_dir.mkdir(parents=True, exist_ok=True)
            for name in OUTPUTS:
                shutil.copyfile(produced / name, out_dir / name)
    return [out_dir / name for name in OUTPUTS]


def _run_protoc(protoc, src: str, gen: str, staged: Path) -> None:
    well_known = Path(protoc.__file__).parent / "_proto"
    argv = ["grpc_tools.protoc", f"-I{src}", f"-I{well_known}", f"--python_out={gen}",
            f"--pyi_out={gen}", f"--grpc_python_out={gen}", str(staged)]
    if protoc.main(argv) != 0:
        raise RuntimeError(f"gen_protos: protoc failed on {PROTO}")


def stale_files() -> list[str]:
    """Names of committed stubs that differ from a fresh generation (empty = current)."""
    with tempfile.TemporaryDirectory(prefix="spd-check-") as tmp:
        fresh = generate(Path(tmp))
        return [f.name for f in fresh
                if not (STUB_DIR / f.name).exists() or not filecmp.cmp(f, STUB_DIR / f.name, shallow=False)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spd_client.gen_protos", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if the stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"gen_protos: stale stubs {stale}; run `python -m spd_client.gen_protos`", file=sys.stderr)
            return 1
        print("gen_protos: stubs are current")
        return 0
    for path in generate(STUB_DIR):
        print(f"gen_protos: wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
