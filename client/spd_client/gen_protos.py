"""Regenerate the committed gRPC stubs in spd_client/v1 from protos/spd/v1/spd.proto.

    python -m spd_client.gen_protos          # rewrite client/spd_client/v1/spd_pb2*.py(i)
    python -m spd_client.gen_protos --check  # exit 1 if the committed stubs are stale

Which generator: the stubs are written by grpcio-tools 1.62.3 (GENERATOR), the last one whose
gencode carries no protobuf runtime-version pin, so the SDK loads on protobuf 4.21.6 through 7.x
and grpcio 1.59 onward (client/pyproject.toml); newer grpcio-tools would raise both floors to
their own version. It needs protobuf < 5, so run it from a scratch environment:

    python -m venv /tmp/gen && /tmp/gen/bin/pip install grpcio-tools==1.62.3
    PYTHONPATH=client /tmp/gen/bin/python -m spd_client.gen_protos

`--check` works with any grpcio-tools (the dev one included): it compiles the .proto and compares
the descriptor (messages, fields, services) with the committed stubs' and checks that those came
from GENERATOR.

Layout: protoc names the generated grpc module's import after the .proto's path below the -I
root. The source lives at protos/spd/v1/spd.proto (package spd.v1), but a top-level `spd.v1`
import would collide with the `spd` service package, so the .proto is staged into a temporary
tree as spd_client/v1/spd.proto and compiled from there: the generated code then imports
`from spd_client.v1 import spd_pb2`, no post-processing needed. The proto package (and so the
RPC paths /spd.v1.SPD/...) is unchanged; only the descriptor's file name is
"spd_client/v1/spd.proto".
"""

from __future__ import annotations

import argparse
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
GENERATOR = "1.62.3"  # grpcio-tools that writes the committed stubs
GENCODE_MARK = "# Protobuf Python Version: 4.25.1"  # what GENERATOR stamps on spd_pb2.py


def generate(out_dir: Path) -> list[Path]:
    """Compile the .proto with GENERATOR; return the generated files (they lie in out_dir)."""
    from importlib.metadata import version

    if version("grpcio-tools") != GENERATOR:
        raise SystemExit(f"gen_protos: needs grpcio-tools=={GENERATOR} (found {version('grpcio-tools')}); "
                         "see this module's docstring")
    with tempfile.TemporaryDirectory(prefix="spd-gen-") as gen:
        _run_protoc(gen, f"--python_out={gen}", f"--pyi_out={gen}", f"--grpc_python_out={gen}")
        produced = Path(gen) / STAGED.parent
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in OUTPUTS:
            shutil.copyfile(produced / name, out_dir / name)
    return [out_dir / name for name in OUTPUTS]


def _run_protoc(gen: str, *outputs: str) -> None:
    """protoc over the .proto staged as spd_client/v1/spd.proto (see the module docstring)."""
    from grpc_tools import protoc  # a dev dependency, imported only here

    with tempfile.TemporaryDirectory(prefix="spd-proto-") as src:
        staged = Path(src) / STAGED
        staged.parent.mkdir(parents=True)
        shutil.copyfile(PROTO, staged)
        well_known = Path(protoc.__file__).parent / "_proto"
        if protoc.main(["grpc_tools.protoc", f"-I{src}", f"-I{well_known}", *outputs, str(staged)]) != 0:
            raise RuntimeError(f"gen_protos: protoc failed on {PROTO}")


def stale_reasons() -> list[str]:
    """Why the committed stubs are not what GENERATOR makes of the .proto (empty = current)."""
    from google.protobuf import descriptor_pb2

    with tempfile.TemporaryDirectory(prefix="spd-check-") as gen:
        _run_protoc(gen, f"--descriptor_set_out={gen}/spd.desc")
        fresh = descriptor_pb2.FileDescriptorSet.FromString(Path(gen, "spd.desc").read_bytes()).file[0]
    for message in fresh.message_type:  # descriptor sets carry json_name; gencode leaves it out
        for field in message.field:
            field.ClearField("json_name")
    from spd_client.v1 import spd_pb2

    committed = descriptor_pb2.FileDescriptorProto.FromString(spd_pb2.DESCRIPTOR.serialized_pb)
    reasons = [] if committed == fresh else ["spd_pb2.py describes another .proto"]
    if GENCODE_MARK not in (STUB_DIR / "spd_pb2.py").read_text():
        reasons.append(f"spd_pb2.py was not written by grpcio-tools {GENERATOR}")
    missing = [name for name in OUTPUTS if not (STUB_DIR / name).exists()]
    return reasons + [f"{name} is missing" for name in missing]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spd_client.gen_protos", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if the stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_reasons()
        if stale:
            print(f"gen_protos: stale stubs ({'; '.join(stale)}); regenerate (see the docstring)", file=sys.stderr)
            return 1
        print("gen_protos: stubs are current")
        return 0
    for path in generate(STUB_DIR):
        print(f"gen_protos: wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
