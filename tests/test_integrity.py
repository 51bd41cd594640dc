"""Integrity: every file myriad writes is verified when read, and no command destroys a file it
does not own (docs/guarantees.md, "Integrity").

Corruption injection flips bytes inside each kind of file a run writes (checkpoint tensors, each
dataset column, zarr chunks, Minari files, config, summary) and checks that the command reading
it notices; ownership aims every ``--out`` and configurable path at every file of a finished run
and checks that each is refused with the run unchanged (hashes before and after)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import run_myriad
from test_bad_inputs import assert_one_line_error, run_cli, snapshot
from test_fault_injection import DATASET, ROWS, TINY, assert_same_rows

from myriad.datasets import export, load
from myriad.datasets.schema import CorruptDatasetError
from myriad.pretrain.api import pretrain
from myriad.utils.checkpoint import CheckpointError, load_checkpoint
from myriad.utils.ownership import OwnershipError, claim_output, make_partial
from myriad.utils.runlock import RunInUseError, RunLock

COLUMNS = (
    "observations",
    "actions",
    "rewards",
    "next_observations",
    "terminals",
    "timeouts",
    "infos/member",
    "infos/x",
    "infos/y",
)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A finished pretraining run (4 checkpoints) and its zarr and Minari exports."""
    pytest.importorskip("minari")
    root = tmp_path_factory.mktemp("integrity")
    pretrain(TINY, run_dir=root / "run", quiet=True)
    export(root / "run", "zarr", out=root / "copy.zarr", chunk_rows=512)
    export(root / "run", "minari", out=root / "minari", dataset_id="test/run-v0")
    return root


def flip(path: Path, offset: int) -> None:
    """Invert one byte of ``path``."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def tensor_offset(checkpoint: Path) -> int:
    """A byte in the middle of the largest tensor stored in a checkpoint (a zip archive)."""
    with zipfile.ZipFile(checkpoint) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(checkpoint, "rb") as f:
        f.seek(info.header_offset)
        header = struct.unpack("<IHHHHHIIIHH", f.read(30))
    return info.header_offset + 30 + header[9] + header[10] + info.file_size // 2


def chunk_offset(path: Path, column: str, chunk: int = 0) -> int:
    with h5py.File(path, "r") as f:
        info = f[column].id.get_chunk_info(chunk)
    return info.byte_offset + info.size // 2


# -- corruption injection ----------------------------------------------------------------------
def test_checkpoint_tensor_flip_falls_back_on_resume(world, tmp_path, capsys):
    """Bytes flipped inside the newest checkpoint's tensors: ``--resume`` warns in one line and
    continues from the previous checkpoint, to the uninterrupted run's rows."""
    run = tmp_path / "run"
    run_myriad(["pretrain", *TINY, "--run-dir", str(run)], tmp_path, "checkpoint.saved:3")
    newest = run / "checkpoints" / "iter_000003.pt"
    flip(newest, tensor_offset(newest))
    pretrain([], resume=run, quiet=True)
    err = capsys.readouterr().err
    assert "failed its digest check" in err and "iter_000002.pt" in err
    assert len([line for line in err.splitlines() if "warning" in line]) == 1
    assert_same_rows(world / "run" / DATASET, run / DATASET)


def test_checkpoint_tensor_flip_is_refused_by_every_other_load(world, tmp_path, capsys):
    bad = tmp_path / "iter_000004.pt"
    shutil.copy(world / "run" / "checkpoints" / "iter_000004.pt", bad)
    flip(bad, tensor_offset(bad))
    with pytest.raises(CheckpointError, match="failed its digest check"):
        load_checkpoint(bad)
    for args in (
        ["finetune", "--init", str(bad), "--run-dir", str(tmp_path / "ft")],
        ["render", str(bad), "--out", str(tmp_path / "videos")],
    ):
        code, err = run_cli(args, capsys)
        assert_one_line_error(code, err)
        assert "failed its digest check" in err, args
    code, _ = run_cli(["dataset", "verify", str(world / "run")], capsys)
    assert code == 0


@pytest.mark.parametrize("column", COLUMNS)
def test_hdf5_column_flip_is_detected_by_every_reader(world, tmp_path, capsys, column):
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    flip(run / DATASET, chunk_offset(run / DATASET, column))
    with pytest.raises(CorruptDatasetError, match=f"{column} chunk 0"):
        load(run)
    code, out = run_cli(["dataset", "validate", str(run)], capsys)
    assert code == 1
    code, err = run_cli(
        ["export", str(run), "--format", "zarr", "--out", str(tmp_path / "z")], capsys
    )
    assert_one_line_error(code, err)
    assert f"{column} chunk 0 (rows 0-" in err and "Fletcher-32" in err
    assert not (tmp_path / "z").exists()
    assert run_cli(["dataset", "verify", str(run)], capsys)[0] == 1


def test_verify_names_the_first_bad_chunk(world, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    flip(run / DATASET, chunk_offset(run / DATASET, "actions"))
    main_code = subprocess.run(
        [sys.executable, "-m", "myriad.cli", "dataset", "verify", str(run)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert main_code.returncode == 1
    lines = main_code.stdout.splitlines()
    bad = [line for line in lines if line.startswith("FAIL")]
    assert len(bad) == 1 and "actions chunk 0 (rows 0-" in bad[0], main_code.stdout
    assert sum(line.startswith("ok") for line in lines) == 1 + 1 + 4  # config, summary, 4 ckpts


@pytest.mark.parametrize(
    "array",
    [
        "data/observations",
        "data/actions",
        "data/rewards",
        "data/terminals",
        "data/member",
        "meta/episode_ends",
    ],
)
def test_zarr_chunk_flip_is_detected(world, tmp_path, capsys, array):
    store = tmp_path / "copy.zarr"
    shutil.copytree(world / "copy.zarr", store)
    chunk = next(p for p in sorted((store / array / "c").rglob("*")) if p.is_file())
    flip(chunk, chunk.stat().st_size // 2)
    code, _ = run_cli(["dataset", "verify", str(store)], capsys)
    assert code == 1
    if array.startswith("data/"):
        with pytest.raises(CorruptDatasetError, match="CRC32C"):
            load(store)
        code, err = run_cli(
            ["export", str(store), "--format", "hdf5", "--out", str(tmp_path / "o.hdf5")], capsys
        )
        assert_one_line_error(code, err)
        assert array in err and "chunk" in err
    else:
        code, _ = run_cli(["dataset", "validate", str(store)], capsys)
        assert code == 1


def test_missing_zarr_chunk_is_not_read_as_zeros(world, tmp_path, capsys):
    store = tmp_path / "copy.zarr"
    shutil.copytree(world / "copy.zarr", store)
    (store / "data" / "terminals" / "c" / "1").unlink()  # all-False rows: zarr's fill value
    with pytest.raises(CorruptDatasetError, match=r"data/terminals chunk 1 .* is missing"):
        load(store)


@pytest.mark.parametrize("name", ["data/main_data.hdf5", "data/metadata.json"])
def test_minari_file_flip_is_detected(world, tmp_path, capsys, name):
    folder = tmp_path / "minari" / "test" / "run-v0"
    shutil.copytree(world / "minari" / "test" / "run-v0", folder)
    flip(folder / name, (folder / name).stat().st_size // 2)
    with pytest.raises(CorruptDatasetError, match="block 0"):
        load(folder)
    code, _ = run_cli(["dataset", "verify", str(folder)], capsys)
    assert code == 1
    code, out = run_cli(["dataset", "validate", str(folder)], capsys)
    assert code == 1


def test_config_and_summary_flips_are_detected(world, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("num_envs: 32", "num_envs: 33"))
    code, err = run_cli(["pretrain", "--resume", str(run)], capsys)
    assert_one_line_error(code, err)
    assert "config.yaml was changed after the run wrote it" in err
    code, err = run_cli(["report", str(run), "--no-render"], capsys)
    assert_one_line_error(code, err)
    shutil.copy(world / "run" / "config.yaml", config)
    summary = run / "summary.json"
    summary.write_text(summary.read_text().replace('"iterations": 4', '"iterations": 5'))
    before = snapshot(run)
    code, err = run_cli(["report", str(run), "--no-render"], capsys)
    assert_one_line_error(code, err)
    assert "summary.json was changed" in err
    assert snapshot(run) == before  # nothing written into the run before the refusal
    assert run_cli(["dataset", "verify", str(run)], capsys)[0] == 1


def test_datasets_without_checksums_read_with_one_note(tmp_path, capsys):
    path = tmp_path / "old.hdf5"
    n = 6
    with h5py.File(path, "w") as f:
        for key, width in (("observations", 2), ("next_observations", 2), ("actions", 1)):
            f[key] = np.zeros((n, width), np.float32)
        f["rewards"] = np.zeros(n, np.float32)
        f["terminals"] = np.zeros(n, bool)
        f["timeouts"] = np.eye(1, n, n - 1, dtype=bool)[0]
        f["infos/nested/deep"] = np.zeros(n)  # another tool's nested group: not a feature
    data = load(path)
    assert len(data) == n and data.features.shape == (n, 0)
    load(path)
    err = capsys.readouterr().err
    assert err.count("read unverified") == 1, err
    code, out = run_cli(["dataset", "validate", str(path)], capsys)
    assert code in (0, 1) and "Traceback" not in out


# -- ownership ---------------------------------------------------------------------------------
RUN_FILES = (
    "config.yaml",
    "summary.json",
    "checkpoints/iter_000001.pt",
    "checkpoints",
    "dataset/transitions.hdf5",
    "dataset/transitions.hdf5.partial",
    ".myriad.lock",
)


@pytest.mark.parametrize("target", RUN_FILES)
def test_no_out_replaces_a_file_of_a_run(world, tmp_path, capsys, target):
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    before = snapshot(run)
    out = str(run / target)
    for args in (
        ["report", str(run), "--no-render", "--out", out],
        ["report", str(run), "--no-render", "--out", out, "--overwrite"],
        ["render", str(run), "--out", out, "--overwrite"],
        ["export", str(run), "--format", "hdf5", "--out", out],
        ["export", str(run), "--format", "zarr", "--out", out],
    ):
        code, err = run_cli(args, capsys)
        assert_one_line_error(code, err)
        assert "run" in err and "--out" in err, (args, err)
        assert snapshot(run) == before, args


@pytest.mark.parametrize(
    "path",
    [
        "config.yaml",
        "summary.json",
        "checkpoints/iter_000002.pt",
        "checkpoints",
        ".myriad.lock",
        "plots/rows.hdf5",
        "events.out.tfevents.rows",
        ".",
        "../outside.hdf5",
    ],
)
def test_dataset_path_colliding_with_a_run_file_is_refused(tmp_path, capsys, path):
    run = tmp_path / "new"
    code, err = run_cli(["pretrain", *TINY, f"dataset.path={path}", "--run-dir", str(run)], capsys)
    assert_one_line_error(code, err)
    assert "dataset.path" in err
    assert not run.exists()


def test_run_dir_inside_a_run_is_refused(world, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    before = snapshot(run)
    for sub in ("checkpoints", "dataset", "plots"):
        for extra in ([], ["--overwrite"]):
            args = ["pretrain", *TINY, "--run-dir", str(run / sub), *extra]
            code, err = run_cli(args, capsys)
            assert_one_line_error(code, err)
    assert snapshot(run) == before


def test_partial_folders_are_removed_only_by_their_command(world, tmp_path, capsys):
    out = tmp_path / "out.hdf5"
    mine = tmp_path / "out.hdf5.partial"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    code, err = run_cli(
        ["export", str(world / "run"), "--format", "hdf5", "--out", str(out)], capsys
    )
    assert_one_line_error(code, err)
    assert "was not made by myriad export" in err
    assert (mine / "thesis.tex").read_text() == "precious"
    shutil.rmtree(mine)
    make_partial(mine, "export")  # what a killed export leaves: replaced
    (mine / "seg_00000000.hdf5").write_bytes(b"half")
    assert (
        run_cli(["export", str(world / "run"), "--format", "hdf5", "--out", str(out)], capsys)[0]
        == 0
    )
    assert not mine.exists() and len(load(out)) == ROWS
    staging = tmp_path / "staging"
    make_partial(staging, "pretrain")
    with pytest.raises(OwnershipError, match="was made by myriad pretrain"):
        make_partial(staging, "export")


def test_report_replaces_only_its_own_page(world, tmp_path, capsys):
    page = tmp_path / "page.html"
    page.write_text("<html>my notes</html>")
    args = ["report", str(world / "run"), "--no-render", "--out", str(page)]
    code, err = run_cli(args, capsys)
    assert_one_line_error(code, err)
    assert "--overwrite" in err and page.read_text() == "<html>my notes</html>"
    assert run_cli([*args, "--overwrite"], capsys)[0] == 0
    assert run_cli(args, capsys)[0] == 0  # its own page: replaced without --overwrite
    with pytest.raises(OwnershipError):
        claim_output(world / "run" / "summary.json", "report", overwrite=True)


# -- no dead ends --------------------------------------------------------------------------------
def test_run_killed_before_its_first_checkpoint_is_continued_by_resume(world, tmp_path, capsys):
    run = tmp_path / "run"
    stderr = run_myriad(
        ["pretrain", *TINY, "--run-dir", str(run)], tmp_path, "dataset.segment_written:1"
    )
    assert not list((run / "checkpoints").glob("*.pt")), stderr
    code, err = run_cli(["pretrain", *TINY, "--run-dir", str(run)], capsys)
    assert_one_line_error(code, err)
    assert f"--resume {run}" in err
    pretrain([], resume=run, quiet=True)
    assert "before its first checkpoint" in capsys.readouterr().err
    assert_same_rows(world / "run" / DATASET, run / DATASET)


def test_finetune_killed_during_init_ranking_is_continued_by_resume(world, tmp_path, capsys):
    from conftest import TINY_FINETUNE

    run = tmp_path / "ft"
    tiny = [o for o in TINY_FINETUNE if not o.startswith(("population.actor", "population.critic"))]
    args = [*tiny, "num_envs=16", "iterations=2", "init.episodes=1", "init.critic_warmup=0"]
    source = str(world / "run")
    run_myriad(
        ["finetune", "--algo", "ppo", "--init", source, "--run-dir", str(run), *args],
        tmp_path,
        "init.ranked",
    )
    assert (run / "config.yaml").is_file() and not list((run / "checkpoints").glob("*.pt"))
    code, err = run_cli(["finetune", "--resume", str(run)], capsys)
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["iterations"] == 2 and summary["init"]["source"].startswith(source)


HOLD_LOCK = """
import sys
from myriad.utils.runlock import RunLock
with RunLock(sys.argv[1], "pretrain"):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_a_run_in_use_is_refused_and_a_stale_lock_taken_over(world, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    # Another process holds the lock until its stdin closes (a trigger, not a sleep).
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(run)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        for args in (["pretrain", "--resume", str(run)], ["report", str(run), "--no-render"]):
            code, err = run_cli(args, capsys)
            assert_one_line_error(code, err)
            assert f"in use by process {holder.pid}" in err, err
        with pytest.raises(RunInUseError):
            RunLock(run, "pretrain").acquire()
    finally:
        holder.communicate("")
    # A lock file left by a process that was killed: nobody holds it, so it is taken over.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    (run / ".myriad.lock").write_text(json.dumps({"pid": int(dead.stdout), "command": "pretrain"}))
    code, err = run_cli(["pretrain", "--resume", str(run)], capsys)
    assert code == 0, err
    assert f"took over the lock of {run} from process {int(dead.stdout)}" in err


# -- messages ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("num_envs: 32", 'num_envs: "lots"'), "num_envs='lots' must be an integer"),
        (("iterations: 4", "iterations: -1"), "iterations=-1 is out of range"),
        (("progress: false", "progress: 7"), "progress=7 must be true or false"),
    ],
)
def test_saved_config_is_checked_like_overrides(world, tmp_path, capsys, edit, message):
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    config = run / "config.yaml"
    body = config.read_text().partition("\n")[2]  # a hand-edited config: no digest line
    assert edit[0] in body
    config.write_text(body.replace(edit[0], edit[1]))
    code, err = run_cli(["pretrain", "--resume", str(run)], capsys)
    assert_one_line_error(code, err)
    assert str(config) in err and message in err


def test_saved_config_with_a_section_replaced_by_a_number(world, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    config = run / "config.yaml"
    lines = config.read_text().partition("\n")[2].splitlines()
    start = lines.index("ppo:")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    config.write_text("\n".join([*lines[:start], "ppo: 5", *lines[end:]]) + "\n")
    code, err = run_cli(["pretrain", "--resume", str(run)], capsys)
    assert_one_line_error(code, err)
    assert str(config) in err and "ppo=5 must be a mapping" in err


def test_full_disk_during_an_export_names_the_file_and_the_command(world, tmp_path):
    """A write limit (what a full disk looks like to the writer) hit while exporting: one line
    naming the failed write and the command to run again."""
    import resource
    import signal

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    out = tmp_path / "copy.hdf5"
    args = ["export", str(world / "run"), "--format", "hdf5", "--out", str(out)]
    child = subprocess.run(
        [sys.executable, "-m", "myriad.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
    )
    lines = child.stderr.strip().splitlines()
    assert child.returncode == 1 and len(lines) == 1, child.stderr
    assert str(tmp_path) in lines[0] and "then run: myriad export" in lines[0], lines[0]


def test_bench_json_never_lands_on_a_run_file(world):
    from myriad.bench.common import write_json

    before = snapshot(world / "run")
    with pytest.raises(OwnershipError, match="summary of the run"):
        write_json(world / "run" / "summary.json", {"x": 1})
    assert snapshot(world / "run") == before


def test_init_into_an_env_without_tasks_names_task_native(world, tmp_path, capsys):
    pytest.importorskip("mujoco")
    args = ["finetune", "--init", str(world / "run"), "env=ant", "--run-dir", str(tmp_path / "a")]
    code, err = run_cli(args, capsys)
    assert_one_line_error(code, err)
    assert "task=native" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists()  # a refused start leaves no folder to trip over
    args = [*args[:3], "env=ant", "task=native", "--run-dir", str(tmp_path / "a")]
    code, err = run_cli(args, capsys)  # the spaces differ: refused after the config is written
    assert_one_line_error(code, err)
    assert "does not fit this task" in err and not (tmp_path / "a").exists()
